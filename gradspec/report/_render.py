"""The run report as one self-contained HTML page (Jinja2, autoescaped; no script, no network).

The page holds its figures as data URIs and its style inline; its Content-Security-Policy
forbids every fetch but ``data:`` images, so a browser that opens it loads nothing else.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import jinja2

from gradspec.report._checks import findings, missing
from gradspec.report._figures import figures
from gradspec.report._read import RunContents, read_run
from gradspec.report._view import Num, sections

__all__ = ["REPORT_NAME", "render_report", "write_report"]

#: The page's name in the run folder (``gradspec report``'s default ``--out``).
REPORT_NAME = "report.html"

_ENV: jinja2.Environment | None = None


def _environment() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        _ENV = jinja2.Environment(
            loader=jinja2.PackageLoader("gradspec.report", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        _ENV.tests["num"] = lambda value: isinstance(value, Num)
    return _ENV


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gradspec")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def render_report(run: str | os.PathLike | RunContents, *, now: datetime.datetime | None = None) -> str:
    """The HTML page of a run folder (see :func:`gradspec.report.read_run` for what it reads).

    Args:
        run: the run folder, or what :func:`read_run` read from it.
        now: the time the page says it was made (default: now, UTC).

    Returns:
        The page, one string.

    Raises:
        ValueError: the folder holds no part of a run (one line).
    """
    contents = run if isinstance(run, RunContents) else read_run(run)
    figs = figures(contents)  # before the findings: a figure that cannot be drawn is one
    when = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%d %H:%M UTC")
    return _environment().get_template("report.html.j2").render(
        run_dir=str(contents.run_dir),
        title=contents.run_dir.resolve().name or str(contents.run_dir),
        generated=when,
        version=_version(),
        stages=list(contents.stages.values()),
        findings=findings(contents),
        missing=missing(contents),
        figures=figs,
        **sections(contents),
    )


def write_report(run: str | os.PathLike | RunContents, out: str | os.PathLike | None = None) -> Path:
    """Write the page of a run folder to ``out`` (default ``<run folder>/report.html``), whole or
    not at all (a temporary file renamed into place).

    Args:
        run: the run folder, or what :func:`read_run` read from it.
        out: the page's path.

    Returns:
        The path written.

    Raises:
        ValueError: the folder holds no part of a run (one line).
    """
    contents = run if isinstance(run, RunContents) else read_run(run)
    out = Path(out) if out is not None else contents.run_dir / REPORT_NAME
    page = render_report(contents)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    tmp.unlink(missing_ok=True)  # a link planted there would be written through
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out
