"""A metric against a size (dimension, sample size, ...), one line with error bars per method."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["plot_scaling"]


def plot_scaling(
    series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float] | None]],
    *, xlabel: str, ylabel: str, title: str | None = None, logx: bool = True, logy: bool = True,
    ax: Axes | None = None,
) -> tuple[Figure, Axes]:
    """``label -> (x, mean, err)``: each a line with error bars (``err`` None: none).

    On a log y axis, non-positive means (an excess risk estimated below 0) are drawn at the
    smallest positive value shown and marked with an open marker, not dropped silently.

    Raises:
        ValueError: if a series' x, mean and err differ in length, or ``series`` is empty.
    """
    if not series:
        raise ValueError("plot_scaling needs at least one series")
    if ax is None:
        fig = Figure(figsize=(5.5, 4.0), layout="constrained")
        ax = fig.add_subplot()
    else:
        fig = ax.figure  # type: ignore[assignment]
    positive = [v for _, m, _ in series.values() for v in m if v > 0]
    floor = min(positive) / 2 if positive else 1e-6
    for label, (x, mean, err) in series.items():
        x, mean = np.asarray(x, float), np.asarray(mean, float)
        if len(x) != len(mean) or (err is not None and len(err) != len(x)):
            raise ValueError(f"series {label!r}: x, mean and err need the same length")
        order = np.argsort(x)
        x, mean = x[order], mean[order]
        e = None if err is None else np.asarray(err, float)[order]
        shown = np.where(mean > 0, mean, floor) if logy else mean
        line = ax.errorbar(x, shown, yerr=e, marker="o", capsize=3, label=label)
        if logy and (mean <= 0).any():
            ax.plot(x[mean <= 0], shown[mean <= 0], "o", mfc="white", color=line[0].get_color())
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize="small")
    ax.legend(fontsize="small", frameon=False)
    return fig, ax
