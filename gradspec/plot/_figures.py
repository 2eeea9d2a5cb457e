"""Figures of a spectrum analysis (Li et al. 2022, Figures 2a and 3–5).

Every function takes ``label → data`` mappings (one entry draws one run, several
overlay runs with a legend), draws on a new figure or on a given ``ax``, and
returns the figure. The pyplot state machine is not used, so this works under
any backend; :func:`save_figure` writes PNG and PDF.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from gradspec.spectrum import (
    ExplainedVariance,
    PowerLawFit,
    RestrictedLipschitz,
    SpectralDensity,
    StepError,
)

FIGSIZE = (5.5, 4.0)


def _axes(ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    fig = Figure(figsize=FIGSIZE, layout="constrained")
    return fig, fig.add_subplot()


def _as_mapping(x: Any, label: str) -> dict[str, Any]:
    if x is None:
        return {}
    return dict(x) if isinstance(x, Mapping) else {label: x}


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", frameon=False)


def plot_spectrum(
    spectra: Mapping[str, np.ndarray] | np.ndarray,
    *,
    fits: Mapping[str, PowerLawFit] | PowerLawFit | None = None,
    scale: str = "singular",
    intervals: Mapping[str, tuple[Sequence[float], Sequence[float | None]]] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Singular values (or eigenvalues σ²) against rank on log–log axes, with fit lines (Fig. 2a).

    Args:
        spectra: label → σ (decreasing), or one σ array.
        fits: label → fit (drawn dashed over its rank range, formula in the legend).
        scale: ``"singular"`` plots σ_k, ``"eigen"`` plots σ_k².
        intervals: label → ``(lower, upper)`` per σ (a sketched spectrum's stated
            intervals), drawn as error bars; an upper end of None is unbounded and drawn
            as an arrow up from σ_k.
        ax: draw here instead of a new figure.
        title: axes title.
    """
    if scale not in ("singular", "eigen"):
        raise ValueError(f"unknown scale {scale!r}; choose singular or eigen")
    fig, ax = _axes(ax)
    series = _as_mapping(spectra, "spectrum")
    fitmap = _as_mapping(fits, "spectrum")
    for label, sigma in series.items():
        s = np.asarray(sigma, dtype=np.float64)
        y = s if scale == "singular" else s**2
        k = np.arange(1, y.size + 1)
        keep = y > 0
        (line,) = ax.plot(k[keep], y[keep], marker="o", ms=2.5, lw=0.8, label=label)
        if intervals and label in intervals:
            _interval_bars(ax, s, *intervals[label], power=1 if scale == "singular" else 2,
                           color=line.get_color())
        fit = fitmap.get(label)
        if fit is not None:
            kf = np.arange(fit.k_min, fit.k_max + 1)
            ax.plot(
                kf,
                fit.predict(kf),
                ls="--",
                lw=1.2,
                color=line.get_color(),
                label=f"fit: {fit.a:.3g}·k^(−{fit.c:.3f}), R²={fit.r2:.3f}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rank k")
    ax.set_ylabel("singular value σ_k" if scale == "singular" else "eigenvalue σ_k²")
    ax.set_title(
        title or ("Singular values vs rank" if scale == "singular" else "Eigenvalues vs rank")
    )
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    return fig


def _interval_bars(ax: Axes, sigma: np.ndarray, lower: Sequence[float], upper: Sequence[float | None],
                   *, power: int, color: str) -> None:
    """Error bars from ``lower`` to ``upper`` around each σ (to the power ``power``); an
    unbounded upper end (None) is an arrow up from σ."""
    n = sigma.size
    lo = np.asarray(lower, dtype=np.float64)[:n] ** power
    hi_raw = list(upper)[:n]
    bounded = np.array([u is not None for u in hi_raw])
    hi = np.array([u if u is not None else np.nan for u in hi_raw], dtype=np.float64) ** power
    y = sigma[: lo.size] ** power
    k = np.arange(1, lo.size + 1)
    if bounded.any():
        b = bounded
        ax.errorbar(k[b], y[b], yerr=np.vstack([y[b] - lo[b], hi[b] - y[b]]), fmt="none",
                    ecolor=color, alpha=0.5, lw=0.8, capsize=1.5, label="stated interval")
    if (~bounded).any():
        u = ~bounded
        ax.vlines(k[u], lo[u], y[u], colors=color, alpha=0.5, lw=0.8)
        ax.errorbar(k[u], y[u], yerr=np.vstack([np.zeros(int(u.sum())), y[u]]), lolims=True, fmt="none",
                    ecolor=color, alpha=0.5, lw=0.8, label="interval unbounded above")


def plot_density(
    densities: Mapping[str, SpectralDensity] | SpectralDensity,
    *,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Kernel density of the singular values (Fig. 2a, left); the bandwidth is in the legend."""
    fig, ax = _axes(ax)
    dmap = _as_mapping(densities, "spectrum")
    spaces = {d.space for d in dmap.values()}
    if len(spaces) > 1:
        raise ValueError(f"densities are in different spaces {sorted(spaces)}; overlay one space")
    for label, d in dmap.items():
        ax.plot(d.grid, d.density, lw=1.5, label=f"{label} (h = {d.bandwidth:.3g}, {d.rule})")
    space = spaces.pop() if spaces else "log10"
    ax.set_xlabel("log10 σ" if space == "log10" else "σ")
    ax.set_ylabel("density")
    ax.set_title(title or "Density of singular values (Gaussian KDE)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    _legend(ax)
    return fig


def plot_lipschitz(
    curves: Mapping[str, RestrictedLipschitz] | RestrictedLipschitz,
    *,
    fits: Mapping[str, PowerLawFit] | PowerLawFit | None = None,
    statistic: str = "max",
    quantiles: bool = True,
    threshold: bool = True,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Ĝ_k vs k on log–log axes (k ≥ 1), with its fit and the c = 1/2 line of Theorem 3.3.

    Args:
        curves: label → :class:`RestrictedLipschitz`.
        fits: label → power-law fit of the same statistic (dashed).
        statistic: ``"max"`` (Ĝ_k) or a quantile key.
        quantiles: shade between the smallest and largest stored quantile.
        threshold: draw ``Ĝ_0·k^(−1/2)`` (dotted), the slowest decay eq. (2) allows.
    """
    fig, ax = _axes(ax)
    cmap = _as_mapping(curves, "G_k")
    fmap = _as_mapping(fits, "G_k")
    for label, G in cmap.items():
        y = G.statistic(statistic)
        # Values at rounding level (in-sample rows at the rank of H) are not drawn.
        pos = (G.ks >= 1) & (y > 1e-6 * float(y.max()))
        (line,) = ax.plot(
            G.ks[pos], y[pos], marker="o", ms=3, lw=1.0, label=f"{label}: {statistic}"
        )
        if quantiles and len(G.quantiles) >= 2:
            keys = sorted(G.quantiles)
            lo, hi = G.quantiles[keys[0]], G.quantiles[keys[-1]]
            qpos = pos & (lo > 0)
            ax.fill_between(
                G.ks[qpos],
                lo[qpos],
                hi[qpos],
                color=line.get_color(),
                alpha=0.15,
                label=f"{label}: {keys[0]}–{keys[-1]}",
            )
        fit = fmap.get(label)
        if fit is not None:
            kf = np.geomspace(max(fit.k_min, 1), fit.k_max, 64)
            ax.plot(
                kf,
                fit.predict(kf),
                ls="--",
                color=line.get_color(),
                label=f"fit: {fit.a:.3g}·k^(−{fit.c:.3f})",
            )
        if threshold and np.any(G.ks == 0) and np.any(pos):
            g0 = float(y[G.ks == 0][0])
            kt = np.geomspace(1, G.ks[pos].max(), 64)
            ax.plot(
                kt,
                g0 * kt**-0.5,
                ls=":",
                color=line.get_color(),
                alpha=0.8,
                label=f"{label}: G_0·k^(−1/2)",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rank k of the projector P_k")
    ax.set_ylabel("‖(I − P_k) g‖  (restricted Lipschitz G_k)")
    ax.set_title(title or "Restricted Lipschitz coefficients")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    return fig


def plot_explained_variance(
    curves: Mapping[str, ExplainedVariance | tuple[np.ndarray, np.ndarray]],
    *,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Energy fraction of the top-k subspace vs k (log k), one line per row set or run.

    Args:
        curves: label → :class:`ExplainedVariance` or ``(ks, fraction)``.
    """
    fig, ax = _axes(ax)
    for label, cur in curves.items():
        ks, frac = (cur.ks, cur.fraction) if isinstance(cur, ExplainedVariance) else cur
        ks, frac = np.asarray(ks), np.asarray(frac)
        pos = ks >= 1
        ax.plot(ks[pos], frac[pos], marker="o", ms=2.5, lw=1.2, label=label)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("rank k")
    ax.set_ylabel("explained variance Σ‖P_k g‖² / Σ‖g‖²")
    ax.set_title(title or "Explained variance of the top-k subspace")
    ax.grid(True, which="major", alpha=0.3)
    _legend(ax)
    return fig


def plot_step_error(
    errors: Mapping[str, StepError] | StepError,
    *,
    ks: Sequence[int] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Relative reconstruction error ‖(I − P_k)g‖/‖g‖ per training step; a line per k and run."""
    fig, ax = _axes(ax)
    emap = _as_mapping(errors, "gradients")
    for label, e in emap.items():
        want = [int(k) for k in (ks if ks is not None else e.ks[e.ks >= 1][-3:])]
        for k in want:
            hits = np.nonzero(e.ks == k)[0]
            if hits.size == 0:
                raise ValueError(f"rank {k} is not on the grid of {label!r}: {e.ks.tolist()}")
            name = f"{label}, k = {k}" if len(emap) > 1 else f"k = {k}"
            ax.plot(e.steps, e.error[:, hits[0]], lw=1.0, label=name)
    ax.set_xlabel("training step")
    ax.set_ylabel("relative error ‖(I − P_k) g‖ / ‖g‖")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "Gradients outside the top-k subspace along training")
    ax.grid(True, alpha=0.3)
    _legend(ax)
    return fig


def plot_lines_errorbars(
    series: Mapping[str, Mapping[str, Any]],
    *,
    ax: Axes | None = None,
    xlabel: str = "",
    ylabel: str = "",
    title: str | None = None,
    logx: bool = False,
    logy: bool = False,
    mark_nonpositive: bool = False,
) -> Figure:
    """Lines of means with ±std error bars against x, one per labelled series (points sorted by x).

    Args:
        series: ``{label: {"x": [...], "mean": [...], "std": [...]}}`` (``std`` optional;
            optional ``"linestyle"`` and ``"color"``); x, mean and std of equal length, finite.
        ax: draw into these axes (default a new figure).
        xlabel, ylabel, title: axis labels and title.
        logx, logy: log-scaled axes (then x, and the means, must be > 0).
        mark_nonpositive: on a log y axis, draw a mean <= 0 (e.g. an excess risk estimated
            below 0) at half the smallest positive mean with an open marker, instead of
            refusing it; never dropped silently.

    Returns:
        The figure.
    """
    fig, ax = _axes(ax)
    if not series:
        raise ValueError("no series to plot: pass {label: {'x': ..., 'mean': ..., 'std': ...}}")
    positive = [v for s in series.values() for v in np.asarray(s["mean"], dtype=float).ravel() if v > 0]
    floor = min(positive) / 2 if positive else 1e-6
    for label, s in series.items():
        x = np.asarray(s["x"], dtype=float)
        mean = np.asarray(s["mean"], dtype=float)
        std = np.asarray(s["std"], dtype=float) if s.get("std") is not None else np.zeros_like(mean)
        if not (x.shape == mean.shape == std.shape) or x.ndim != 1:
            raise ValueError(f"series {label!r}: x, mean and std must be 1-D of equal length, got "
                             f"{x.shape}, {mean.shape}, {std.shape}")
        if not (np.isfinite(x).all() and np.isfinite(mean).all() and np.isfinite(std).all()):
            raise ValueError(f"series {label!r} has non-finite values")
        if (logx and (x <= 0).any()) or (logy and not mark_nonpositive and (mean <= 0).any()):
            raise ValueError(f"series {label!r} has values <= 0 on a log axis (mark_nonpositive=True draws them)")
        order = np.argsort(x, kind="stable")
        x, mean, std = x[order], mean[order], std[order]
        low = mean <= 0
        shown = np.where(low, floor, mean) if logy else mean
        # On a log axis, a bar below zero cannot be drawn: clip the lower bar at 1% of the value.
        lower = np.minimum(std, 0.99 * shown) if logy else std
        bars = ax.errorbar(x, shown, yerr=np.vstack([lower, std]), marker="o", ms=4, capsize=3, lw=1.2,
                           linestyle=s.get("linestyle", "-"), color=s.get("color"), label=str(label))
        if logy and low.any():
            ax.plot(x[low], shown[low], "o", mfc="white", color=bars[0].get_color())
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3, which="both")
    _legend(ax)
    return fig


def save_figure(
    fig: Figure,
    out_dir: str | Path,
    stem: str,
    *,
    formats: Sequence[str] = ("png", "pdf"),
    dpi: int = 150,
) -> list[Path]:
    """Write ``out_dir/stem.<fmt>`` for each format; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        fig.savefig(path, format=fmt, dpi=dpi)
        paths.append(path)
    return paths
