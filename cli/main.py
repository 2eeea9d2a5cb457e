"""Entry point of the `gradspec` console script.

Command modules import only typer at import time; torch, zarr and transformers
are imported inside the commands, so ``gradspec --help`` is instant.
"""

from __future__ import annotations

import typer

from cli import account, collect, decay, info, pca, retrain
from cli._common import setup_logging

app = typer.Typer(
    name="gradspec",
    help="Spectral analysis of gradient subspaces in (differentially private) training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"gradspec {version('gradspec')}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging (and full tracebacks)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Warnings and errors only."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    setup_logging(verbose, quiet)


app.command("collect")(collect.collect_command)
app.command("info")(info.info_command)
app.command("account")(account.account_command)
app.command("pca")(pca.pca_command)
app.command("decay")(decay.decay_command)
app.command("plot")(decay.plot_command)
app.command("retrain")(retrain.retrain_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
