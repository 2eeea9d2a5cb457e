"""`gradspec report`: one self-contained HTML page of a run folder.

Heavy imports (zarr, matplotlib, jinja2) happen inside the command so that
``gradspec --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli._common import user_errors
from cli._outputs import RECORD_NAME, check_outputs, record_outputs


@user_errors
def report_command(
    run_dir: Path = typer.Argument(..., help="The run folder (`gradspec collect --out`), finished or not."),
    out: Path | None = typer.Option(
        None, "--out", "-o",
        help="The page to write (default RUN_DIR/report.html). A file of that name is replaced only if "
        f"gradspec wrote it (listed in {RECORD_NAME} beside it) and it is unchanged, unless --overwrite.",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the page even if gradspec did not write it."),
) -> None:
    """Write one HTML page of a run: settings, privacy, spectrum, decay, retraining, machine.

    The page is one file (figures embedded, no network): open it in any browser or send it.
    It reads what the folder holds, finished or still being written, and says what is missing.
    """
    from gradspec.report import REPORT_NAME, read_run, write_report

    page = out if out is not None else run_dir / REPORT_NAME
    if page.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"--out {str(page)!r} is not an .html file; give a name ending in .html")
    contents = read_run(run_dir)  # a folder that is no run is refused before anything is written
    check_outputs(page.parent, [page.name], overwrite=overwrite)
    written = write_report(contents, page)
    record_outputs(page.parent, [page.name])
    typer.echo(f"report   {written}")
