"""The page's figures: gradspec.plot's figures of the run, embedded as SVG data URIs.

Each figure is drawn from what the run folder holds (the decay report, the spectrum's stated
intervals, ``metrics.jsonl``, the retraining runs) and written as SVG with text as paths, so
the page needs no font and no file beside it.
"""

from __future__ import annotations

import base64
import io
import logging
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from gradspec.plot import (
    ReportView,
    plot_retrain_curves,
    plot_spectrum,
    plot_training,
    report_figures,
)
from gradspec.report._read import RunContents

logger = logging.getLogger(__name__)

__all__ = ["CAPTIONS", "figures", "svg_uri"]

CAPTIONS = {
    "training": "The run's log (metrics.jsonl): training and evaluation loss, evaluation metrics and the "
                "privacy spent, by step.",
    "spectrum": "Singular values of the gradient matrix H against rank, with the power-law fit "
                "(Li et al. 2022, Fig. 2a).",
    "eigenvalues": "Eigenvalues σ_k² of HᵀH against rank, with their fit.",
    "density": "Density of the singular values (Gaussian kernel estimate).",
    "lipschitz": "Restricted Lipschitz coefficients G_k = max ‖(I − P_k)g‖ against the rank of the projector, "
                 "with the slowest decay Theorem 3.3 eq. (2) allows (G_0·k^(−1/2), dotted).",
    "explained_variance": "Energy of the gradient rows in the top-k subspace.",
    "step_error": "Share of each step's gradient outside the top-k subspace, along training.",
    "retrain": "Retraining in the subspace: the evaluation metric by step, one line per configuration "
               "(seeds averaged; DP-SGD dashed).",
}


def svg_uri(fig: Figure) -> str:
    """``fig`` as a ``data:image/svg+xml;base64,...`` URI (text drawn as paths, no date)."""
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "gradspec-report"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _intervals(c: RunContents) -> dict[str, Any] | None:
    sketch = ((c.spectrum or {}).get("accuracy") or {}).get("sketch")
    if not sketch or not sketch.get("sigma_lower"):
        return None
    return {"σ_k": (sketch["sigma_lower"], sketch["sigma_upper"])}


def _decay_figures(c: RunContents) -> dict[str, Figure]:
    if not c.decay:
        return {}
    view = ReportView.from_report(c.decay)
    figs = report_figures(view)
    intervals = _intervals(c)
    if intervals and len(intervals["σ_k"][0]) == view.sigma.size:
        figs["spectrum"] = plot_spectrum({"σ_k": view.sigma}, fits={"σ_k": view.fit_singular},
                                         intervals=intervals,
                                         title="Singular values vs rank, with the sketch's stated intervals")
    return figs


def _retrain_figure(c: RunContents) -> Figure | None:
    if not c.retrain:
        return None
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    plot_retrain_curves([r.to_row() for r in c.retrain], ax=fig.add_subplot())
    return fig


def figures(c: RunContents) -> dict[str, dict[str, str]]:
    """name → ``{"uri", "caption"}`` of every figure the run's parts allow (a part that cannot
    be drawn is added to ``c.problems`` and left out)."""
    drawn: dict[str, Figure | None] = {}
    parts = (
        ("training", lambda: {"training": plot_training(c.metrics) if c.metrics else None}),
        ("the decay figures", lambda: _decay_figures(c)),
        ("retrain", lambda: {"retrain": _retrain_figure(c)}),
    )
    for what, draw in parts:
        try:
            drawn.update(draw())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            c.problems.append(f"{what}: cannot be drawn ({text})")
    return {name: {"uri": svg_uri(fig), "caption": CAPTIONS.get(name, "")}
            for name, fig in drawn.items() if fig is not None}
