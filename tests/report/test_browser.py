"""The report page in a real browser (headless Chromium): it loads with an empty console, and
the numbers the browser's DOM holds are the stores'. Skipped where no Chromium is installed
(`.ci/run` installs Debian's `chromium`)."""

from __future__ import annotations

import pytest

from gradspec.report import write_report
from gradspec.spectrum import read_report
from gradspec.store import GradientStore, SpectrumStore
from tests._browser import chromium, load, screenshot
from tests.report._page import parse

pytestmark = pytest.mark.skipif(chromium() is None, reason="no Chromium (apt-get install chromium)")


def test_the_console_check_sees_errors_failed_loads_and_blocked_fetches(tmp_path):
    """The check itself: a page that logs an error, throws, and asks for a file that is not there
    and for a URL its policy forbids is caught on every count."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "script-src 'unsafe-inline'\"><title>bad</title></head><body>"
        '<img src="missing.png"><img src="https://example.invalid/x.png">'
        '<script>console.error("boom"); undefinedFunction();</script></body></html>')
    _, console = load(page, tmp_path / "profile")
    text = "\n".join(console)
    assert '"boom"' in text and "undefinedFunction" in text, text
    assert "Content Security Policy" in text, text  # the page's own policy refused the fetch


def _same_numbers(dom_page, file_page):
    assert dom_page.numbers == file_page.numbers


def test_a_finished_run_loads_cleanly_and_shows_the_stores_numbers(tmp_path, full_run):
    out = write_report(full_run, tmp_path / "report.html")
    dom, console = load(out, tmp_path / "profile")
    assert console == []
    pg = parse(dom)
    _same_numbers(pg, parse(out.read_text()))
    cfg = GradientStore.open(full_run / "gradients.zarr").config
    spec = SpectrumStore.open(full_run / "spectrum.zarr")
    report = read_report(full_run / "decay" / "report.json")
    assert pg.value("privacy.epsilon") == cfg["final_epsilon"]
    assert pg.value("privacy.delta") == cfg["delta"]
    assert pg.value("privacy.noise_multiplier") == cfg["noise_multiplier"]
    assert [pg.value(f"spectrum.sigma.{i + 1}") for i in range(spec.k)] == spec.sigma.tolist()
    assert pg.value("accuracy.max_residual") == spec.accuracy["max_residual"]
    assert pg.value("fit.singular.c") == report["spectrum"]["fit_singular"]["c"]
    assert pg.stages == {"collect": "complete", "pca": "complete", "decay": "complete", "retrain": "complete"}
    assert len(pg.images) == 8 and all(src.startswith("data:image/svg+xml;base64,") for src in pg.images)
    png = tmp_path / "shot.png"
    screenshot(out, png, tmp_path / "profile2")
    assert png.stat().st_size > 20_000  # a page of tables and figures, not a blank one


def test_a_stopped_run_loads_cleanly_and_says_what_is_missing(tmp_path, stopped_run):
    out = write_report(stopped_run, tmp_path / "report.html")
    dom, console = load(out, tmp_path / "profile")
    assert console == []
    pg = parse(dom)
    _same_numbers(pg, parse(out.read_text()))
    assert pg.stages["collect"] == "running" and pg.stages["pca"] == "absent"
    assert "no spectrum yet" in pg.missing["pca"] and "gradspec pca" in pg.missing["pca"]
    assert pg.value("trained.rows") == GradientStore.open(stopped_run / "gradients.zarr").n_rows == 10
