"""The `gradspec` command line: a thin typer shell over the library."""
