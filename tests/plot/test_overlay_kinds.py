"""`gradspec plot A B` warns when the overlaid spectra are of rows of different kinds: the views
it passes must carry the reports' sources (found by review: ReportView had none, so the warning
the tour promises never fired)."""

from __future__ import annotations

import logging

import numpy as np

from gradspec.plot import ReportView, overlay_figures
from gradspec.spectrum import analyze_spectrum


def _report(per_example: bool) -> dict:
    kind = {"clipped": True, "max_grad_norm": 1.0, "source": "gradspec",
            "normalisation": "per-example gradient" if per_example else "mean of per-example gradients"}
    sources = {"spectrum": {"source": {"row_kind": kind}}}
    return analyze_spectrum(sigma=np.arange(1, 30, dtype=float) ** -0.6, sources=sources).to_dict()


def test_views_of_unlike_row_kinds_are_warned_about(caplog):
    import matplotlib

    matplotlib.use("Agg")
    views = {"steps": ReportView.from_report(_report(False)), "examples": ReportView.from_report(_report(True))}
    with caplog.at_level(logging.WARNING, logger="gradspec.plot._report"):
        overlay_figures(views)
    assert any("rows of different kinds" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gradspec.plot._report"):
        overlay_figures({"a": ReportView.from_report(_report(False)), "b": ReportView.from_report(_report(False))})
    assert not any("rows of different kinds" in r.message for r in caplog.records)
