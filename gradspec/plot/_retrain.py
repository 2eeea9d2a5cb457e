"""Figures of retraining experiments (the rows of ``gradspec.optim.sweep``).

* :func:`plot_retrain_curves` — a metric against steps, one line per rank, with the
  full-dimensional DP-SGD baseline (Li et al. 2022, Fig. 2b);
* :func:`plot_metric_vs_epsilon` — a metric against epsilon, one line per method
  (Zhou et al. 2021, Fig. 3).

Lines average the seeds of a configuration.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gradspec.plot._metrics import load_curve

__all__ = ["plot_metric_vs_epsilon", "plot_retrain_curves", "save_sweep_figures"]

BASELINES = ("dp-sgd",)


def _label(row: dict[str, Any]) -> str:
    rank = row.get("rank")
    return row["algorithm"] if rank in (None, "", "None") else f"{row['algorithm']} k={int(rank)}"


#: What else tells a sweep's configurations apart (beyond algorithm and rank), as shown in a label.
_VARIANTS = (("options", "{}"), ("lr", "lr={}"), ("noise_multiplier", "z={:.3g}"))


def _labels(rows: Sequence[dict[str, Any]], *, across_noise: bool = True) -> list[str]:
    """One label per row: algorithm and rank, and whatever else varies among the rows that share
    them (options, lr, and with ``across_noise`` the noise multiplier), so that a line averages
    the seeds of one configuration only (found by review: a sweep over --noise-multipliers was
    drawn as one line per algorithm, the mean of its privacy levels)."""
    keys = [k for k, _ in _VARIANTS if across_noise or k != "noise_multiplier"]
    seen: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    for row in rows:
        for k in keys:
            seen[_label(row)][k].add(str(row.get(k)))
    out = []
    for row in rows:
        base = _label(row)
        extra = [fmt.format(row[k]) for k, fmt in _VARIANTS
                 if k in keys and len(seen[base][k]) > 1 and row.get(k) not in (None, "")]
        out.append(" ".join([base, *extra]))
    return out


def _metric(rows: Sequence[dict[str, Any]], metric: str | None) -> str:
    if metric is not None:
        return metric
    keys = set().union(*(r.keys() for r in rows)) if rows else set()
    return "eval_accuracy" if "eval_accuracy" in keys else "eval_loss"


def plot_retrain_curves(rows: Sequence[dict[str, Any]], *, metric: str | None = None, ax=None):
    """``metric`` against steps per configuration (seeds averaged); baselines dashed.

    Args:
        rows: sweep rows (each with ``out``, ``algorithm``, ``rank``).
        metric: a logged metric (default ``eval_accuracy`` if present, else ``eval_loss``).
        ax: a matplotlib axes (default: a new figure).

    Returns:
        The figure.
    """
    import matplotlib.pyplot as plt

    metric = _metric(rows, metric)
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 4))
    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for row, label in zip(rows, _labels(rows), strict=True):
        groups[label].append(load_curve(Path(row["out"]) / "metrics.jsonl", metric))

    def order(label: str) -> tuple:
        parts = label.split("k=")
        rank = parts[1].split(" ")[0] if len(parts) > 1 else "0"
        return (label.split(" ")[0] in BASELINES, parts[0], int(rank), label)

    for label in sorted(groups, key=order):
        curves = [c for c in groups[label] if len(c[0])]
        if not curves:
            continue
        n = min(len(c[0]) for c in curves)
        steps = curves[0][0][:n]
        mean = np.mean([c[1][:n] for c in curves], axis=0)
        style = {"linestyle": "--"} if label.split(" ")[0] in BASELINES else {"marker": "."}
        if label in BASELINES:
            style["color"] = "black"
        ax.plot(steps, mean, label=label, **style)
    ax.set_xlabel("step")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title("retraining in subspaces")
    ax.legend(frameon=False)
    return ax.figure


def plot_metric_vs_epsilon(rows: Sequence[dict[str, Any]], *, metric: str | None = None, ax=None):
    """Final ``metric`` against epsilon, one line per method (seeds averaged).

    Non-private runs (epsilon infinite) are left out.
    """
    import matplotlib.pyplot as plt

    metric = _metric(rows, metric)
    if ax is None:
        _, ax = plt.subplots(figsize=(5.5, 4))
    points: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row, label in zip(rows, _labels(rows, across_noise=False), strict=True):
        eps, value = row.get("epsilon"), row.get(metric)
        if eps is None or value in (None, "") or not math.isfinite(float(eps)):
            continue
        points[label][round(float(eps), 6)].append(float(value))
    for label in sorted(points):
        eps = sorted(points[label])
        mean = [float(np.mean(points[label][e])) for e in eps]
        style = {"color": "black", "linestyle": "--"} if label in BASELINES else {}
        ax.plot(eps, mean, marker="o", label=label, **style)
    ax.set_xlabel("epsilon")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title("privacy-utility trade-off")
    ax.legend(frameon=False)
    return ax.figure


def save_sweep_figures(rows: Sequence[dict[str, Any]], out: str | Path, *,
                       metric: str | None = None) -> list[Path]:
    """Write ``retrain_curves.png`` and, with several epsilons, ``metric_vs_epsilon.png``."""
    import matplotlib.pyplot as plt

    out = Path(out)
    written = []
    fig = plot_retrain_curves(rows, metric=metric)
    fig.savefig(out / "retrain_curves.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    written.append(out / "retrain_curves.png")
    eps = {round(float(r["epsilon"]), 6) for r in rows
           if r.get("epsilon") is not None and math.isfinite(float(r["epsilon"]))}
    if len(eps) > 1:
        fig = plot_metric_vs_epsilon(rows, metric=metric)
        fig.savefig(out / "metric_vs_epsilon.png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(out / "metric_vs_epsilon.png")
    return written
