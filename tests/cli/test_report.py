"""`gradspec report RUN_DIR [--out FILE]`: where the page goes, what it may replace, and the
one-line refusals (the page itself: tests/report)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()

LOG = '{"step": 5, "eval_loss": 0.4}\n{"step": 10, "loss": 0.37, "epsilon": 1.15}\n'


def invoke(*args):
    return runner.invoke(app, ["report", *(str(a) for a in args)])


def one_line_error(res, fragment):
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], res.stderr
    assert "Traceback" not in res.output


@pytest.fixture
def run(tmp_path):
    """The smallest part of a run: its log (a collect that has only begun)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(LOG)
    return run


def test_the_page_goes_into_the_run_folder_and_is_replaced_on_a_rerun(run):
    res = invoke(run)
    assert res.exit_code == 0, res.output
    page = run / "report.html"
    assert res.output.strip() == f"report   {page}"
    first = page.read_text()
    assert first.startswith("<!DOCTYPE html>") and "no gradient store" in first
    assert invoke(run).exit_code == 0  # gradspec wrote it: replaced without --overwrite


def test_a_page_gradspec_did_not_write_is_kept_unless_overwrite(run):
    (run / "report.html").write_text("mine")
    one_line_error(invoke(run), "already holds report.html, which gradspec did not write")
    assert (run / "report.html").read_text() == "mine"
    assert invoke(run, "--overwrite").exit_code == 0
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_out_elsewhere(run, tmp_path):
    res = invoke(run, "--out", tmp_path / "pages" / "run.html")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "pages" / "run.html").is_file() and not (run / "report.html").exists()
    one_line_error(invoke(run, "--out", tmp_path / "run.txt"), "is not an .html file")


def test_a_folder_that_is_no_run_is_one_line_and_exit_2(tmp_path):
    one_line_error(invoke(tmp_path), "holds no part of a gradspec run")
    assert list(tmp_path.iterdir()) == []  # nothing written into it
    one_line_error(invoke(tmp_path / "nope"), "does not exist")
    (tmp_path / "f").write_text("x")
    one_line_error(invoke(tmp_path / "f"), "is not a folder")
