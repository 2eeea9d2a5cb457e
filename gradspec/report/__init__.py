"""One HTML page of a run: what was trained, its privacy, spectrum, decay, retraining and machine.

``gradspec report RUN_DIR`` writes it. The parts of the run are read through gradspec's own
readers (the stores, ``read_report``, ``read_metrics``, ``read_result``); the page is a Jinja2
template (``templates/report.html.j2``) with its figures embedded as SVG, so it is one file
that opens offline.
"""

from gradspec.report._checks import Finding, findings
from gradspec.report._read import RunContents, Stage, read_run
from gradspec.report._render import REPORT_NAME, render_report, write_report
from gradspec.report._view import Num, num

__all__ = [
    # reading a run folder
    "RunContents",
    "Stage",
    "read_run",
    # what a reader must be told
    "Finding",
    "findings",
    # the page
    "Num",
    "REPORT_NAME",
    "num",
    "render_report",
    "write_report",
]
