"""The figure of one training run's ``metrics.jsonl``: losses, evaluation metrics and ε by step."""

from __future__ import annotations

from matplotlib.figure import Figure

from gradspec.plot._metrics import RunMetrics

__all__ = ["plot_training"]

#: Records that are bookkeeping, not curves.
_NOT_CURVES = frozenset({"step", "epoch", "batch_size", "time"})


def plot_training(metrics: RunMetrics, *, title: str | None = None) -> Figure | None:
    """Panels of a run's logged metrics against the step.

    Panels (each drawn only when the run logged it): the training loss with the evaluation
    loss; the other evaluation metrics (``eval_*``); the privacy spent (``epsilon``).

    Args:
        metrics: the run's records (:func:`gradspec.plot.read_metrics`).
        title: figure title.

    Returns:
        The figure, or None when no record holds a curve.
    """
    names = [n for n in metrics.names() if n not in _NOT_CURVES]
    evals = [n for n in names if n.startswith("eval_") and n != "eval_loss"]
    panels = [
        ("loss", [n for n in ("loss", "eval_loss") if n in names]),
        ("evaluation", evals),
        ("privacy spent ε", ["epsilon"] if "epsilon" in names else []),
    ]
    panels = [(label, series) for label, series in panels if series]
    if not panels:
        return None
    fig = Figure(figsize=(4.2 * len(panels), 3.4), layout="constrained")
    for ax, (label, series) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        for name in series:
            steps, values = metrics.curve(name)
            ax.plot(steps, values, marker="o", ms=2.5, lw=1.2, label=name.replace("_", " "))
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
        if label == "privacy spent ε":
            ax.set_ylim(bottom=0)
        if len(series) > 1 or label != "privacy spent ε":
            ax.legend(fontsize="small", frameon=False)
    if title:
        fig.suptitle(title)
    return fig
