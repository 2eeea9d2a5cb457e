"""Power-law fits of decaying sequences: singular values, eigenvalues and G_k.

A fit is ordinary least squares of ``log y_k`` on ``log k`` over a rank range,
reported as ``y_k ≈ a·k^(−c)`` (so ``c > 0`` means decay). This is the "least
squares fit on log-transformed" spectrum of Li et al. 2022, §4.2 and Figure 2a.

Confidence intervals for ``c`` are either

* ``"analytic"``: the OLS standard error of the slope times a Student-t
  quantile with ``m − 2`` degrees of freedom; or
* ``"bootstrap"``: the percentile interval of the slope over ``n_boot`` pairs
  bootstrap resamples of the ``(log k, log y)`` points (seeded).

Both assume independent errors around the line. Residuals of a sorted spectrum
are strongly autocorrelated, so both intervals are optimistic: read them as
the precision of the *summary* ``c`` on this range, not as a sampling
interval for the spectrum of the population of gradients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np


class CIMethod(StrEnum):
    """How the confidence interval of a fitted exponent is computed."""

    ANALYTIC = "analytic"  # OLS standard error x Student-t quantile
    BOOTSTRAP = "bootstrap"  # percentile interval over pairs-bootstrap resamples


class SpectrumScale(StrEnum):
    """Which sequence of a spectrum is fitted."""

    SINGULAR = "singular"  # sigma_k
    EIGEN = "eigen"  # lambda_k = sigma_k**2 (eigenvalues of H^T H); c_eigen = 2 c_singular


_SYMBOL = {"singular": "σ_k", "eigen": "λ_k", "G_k": "G_k"}


@dataclass(frozen=True)
class PowerLawFit:
    """The result of fitting ``y_k ≈ a·k^(−c)`` by least squares in log–log space.

    Attributes:
        quantity: what was fitted (``"singular"``, ``"eigen"``, ``"G_k"``, ...).
        c: decay exponent (the negated OLS slope of ``log y`` on ``log k``).
        a: prefactor ``exp(intercept)``.
        intercept: OLS intercept of ``ln y`` on ``ln k``.
        r2: coefficient of determination of the log–log regression.
        stderr: standard error of ``c`` (analytic OLS formula, whatever ``ci_method``).
        ci: confidence interval for ``c``.
        ci_level: its nominal level.
        ci_method: ``"analytic"`` or ``"bootstrap"``.
        k_min, k_max: the rank range fitted (inclusive).
        n_points: points used (positive values inside the range).
        n_dropped: points inside the range left out because ``y <= 0`` or not finite.
    """

    quantity: str
    c: float
    a: float
    intercept: float
    r2: float
    stderr: float
    ci: tuple[float, float]
    ci_level: float
    ci_method: str
    k_min: int
    k_max: int
    n_points: int
    n_dropped: int = 0

    def predict(self, k: np.ndarray | float) -> np.ndarray:
        """``a·k^(−c)``."""
        return self.a * np.asarray(k, dtype=np.float64) ** (-self.c)

    def describe(self) -> str:
        """One line: ``σ_k ≈ 3.1·k^(−0.720) (R² = 0.991; 95% CI for c [...], ...)``."""
        sym = _SYMBOL.get(self.quantity, f"{self.quantity}_k")
        lo, hi = self.ci
        return (
            f"{sym} ≈ {self.a:.4g}·k^(−{self.c:.3f}) (R² = {self.r2:.3f}; "
            f"{self.ci_level:.0%} CI for c [{lo:.3f}, {hi:.3f}], {self.ci_method}; "
            f"k = {self.k_min}..{self.k_max}, {self.n_points} points)"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = list(self.ci)
        d["formula"] = self.describe()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PowerLawFit:
        fields = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in fields}
        kw["ci"] = tuple(kw["ci"])
        return cls(**kw)


def _vector(values: Any, name: str) -> np.ndarray:
    """A 1-D float64 array (a 2-D input would be flattened into a plausible wrong sequence)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}; pass one sequence")
    return arr


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """Slope, intercept, R² and the slope's standard error of y on x."""
    m = x.size
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    slope = float(((x - xm) * (y - ym)).sum() / sxx)
    intercept = float(ym - slope * xm)
    resid = y - (intercept + slope * x)
    ss_res = float((resid**2).sum())
    ss_tot = float(((y - ym) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    stderr = math.sqrt(ss_res / (m - 2) / sxx) if m > 2 else math.nan
    return slope, intercept, r2, stderr


def fit_power_law(
    k: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    *,
    k_range: tuple[int, int] | None = None,
    ci: CIMethod | str = CIMethod.ANALYTIC,
    level: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    quantity: str = "y",
) -> PowerLawFit:
    """Fit ``y_k ≈ a·k^(−c)`` by least squares of ``ln y`` on ``ln k``.

    Args:
        k: positive ranks (or any positive abscissae).
        y: values at ``k``; non-positive values (e.g. zeros beyond the rank) are left out
            and counted in ``n_dropped``; NaN/inf are refused.
        k_range: inclusive ``(k_min, k_max)``; default all points.
        ci: ``"analytic"`` (t-based) or ``"bootstrap"`` (pairs, percentile).
        level: confidence level of the interval for ``c``.
        n_boot: bootstrap resamples (``ci="bootstrap"`` only).
        seed: seed of the bootstrap generator.
        quantity: a label stored in the result (``"singular"``, ``"eigen"``, ``"G_k"``).

    Returns:
        The :class:`PowerLawFit`.

    Raises:
        ValueError: if fewer than 3 usable points remain, ``k`` has non-positive
            entries in range, ``k`` or ``y`` is not 1-D or holds NaN/inf, or the
            arguments are inconsistent.

    Example:
        >>> k = np.arange(1, 101); fit = fit_power_law(k, 2.0 * k**-0.8)
        >>> round(fit.c, 6), round(fit.a, 6)
        (0.8, 2.0)
    """
    from gradspec._enums import parse_choice

    method = parse_choice(CIMethod, ci, "confidence-interval method")
    kk = _vector(k, "k")
    yy = _vector(y, "y")
    if kk.shape != yy.shape:
        raise ValueError(f"k and y need the same length, got {kk.size} and {yy.size}")
    if not np.all(np.isfinite(kk)):
        raise ValueError("k holds NaN or inf; pass finite ranks")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if k_range is not None:
        lo, hi = k_range
        if lo > hi:
            raise ValueError(f"k_range must be (k_min, k_max) with k_min <= k_max, got {k_range}")
        inside = (kk >= lo) & (kk <= hi)
        kk, yy = kk[inside], yy[inside]
    if np.any(kk <= 0):
        raise ValueError("power-law fits need positive k; leave k = 0 out (use k_range=(1, K))")
    bad = ~np.isfinite(yy)
    if bad.any():
        raise ValueError(
            f"y holds {int(bad.sum())} NaN/inf value(s), first at k = {kk[bad][0]:g}: a fit "
            "without them would look fine; fix or exclude them (k_range) first"
        )
    ok = yy > 0
    n_dropped = int((~ok).sum())
    kk, yy = kk[ok], yy[ok]
    if kk.size < 3 or np.unique(kk).size < 2:
        raise ValueError(
            f"a power-law fit needs at least 3 positive values at 2 distinct k; got {kk.size} "
            f"({n_dropped} non-positive left out)"
        )
    x, ly = np.log(kk), np.log(yy)
    slope, intercept, r2, stderr = _ols(x, ly)
    c = -slope
    if method is CIMethod.ANALYTIC:
        from scipy import stats

        if kk.size > 2 and np.isfinite(stderr):
            t = float(stats.t.ppf(0.5 + level / 2, kk.size - 2))
            interval = (c - t * stderr, c + t * stderr)
        else:
            interval = (math.nan, math.nan)
    else:
        if n_boot < 10:
            raise ValueError(f"n_boot must be >= 10, got {n_boot}")
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, kk.size, size=(n_boot, kk.size))
        xb, yb = x[idx], ly[idx]
        xm = xb.mean(axis=1, keepdims=True)
        sxx = ((xb - xm) ** 2).sum(axis=1)
        good = sxx > 0
        slopes = ((xb - xm) * (yb - yb.mean(axis=1, keepdims=True))).sum(axis=1)[good] / sxx[good]
        q = np.quantile(-slopes, [0.5 - level / 2, 0.5 + level / 2])
        interval = (float(q[0]), float(q[1]))
    return PowerLawFit(
        quantity=quantity,
        c=float(c),
        a=float(math.exp(intercept)),
        intercept=float(intercept),
        r2=float(r2),
        stderr=float(stderr),
        ci=(float(interval[0]), float(interval[1])),
        ci_level=float(level),
        ci_method=method.value,
        k_min=int(kk.min()),
        k_max=int(kk.max()),
        n_points=int(kk.size),
        n_dropped=n_dropped,
    )


def fit_spectrum(
    sigma: Sequence[float] | np.ndarray,
    *,
    scale: SpectrumScale | str = SpectrumScale.SINGULAR,
    k_range: tuple[int, int] | None = None,
    ci: CIMethod | str = CIMethod.ANALYTIC,
    level: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
) -> PowerLawFit:
    """Fit ``σ_k ≈ a·k^(−c)`` (or ``λ_k = σ_k² ≈ a·k^(−c)``) over ranks ``k = 1..K``.

    Both conventions appear in the literature (Li et al. 2022 plot singular
    values in Figure 2a and "eigenvalues" in Figures 3–5); the eigenvalue
    exponent is exactly twice the singular-value exponent and R² is the same.

    Args:
        sigma: singular values in decreasing order (rank 1 first).
        scale: ``"singular"`` fits σ_k, ``"eigen"`` fits σ_k².
        k_range: inclusive rank range; default ``(1, min(K, 1000))``.
        ci: see :func:`fit_power_law`.
        level: see :func:`fit_power_law`.
        n_boot: see :func:`fit_power_law`.
        seed: see :func:`fit_power_law`.
    """
    from gradspec._enums import parse_choice

    which = parse_choice(SpectrumScale, scale, "spectrum scale")
    s = _vector(sigma, "sigma")
    if not np.all(np.isfinite(s)):
        raise ValueError("sigma holds NaN or inf; a spectrum's singular values are finite")
    if s.size and np.any(np.diff(s) > 1e-9 * max(float(np.abs(s).max()), 1e-300)):
        raise ValueError("sigma must be sorted in decreasing order (rank 1 first)")
    k = np.arange(1, s.size + 1)
    if k_range is None:
        k_range = (1, min(s.size, 1000))
    y = s if which is SpectrumScale.SINGULAR else s**2
    return fit_power_law(
        k, y, k_range=k_range, ci=ci, level=level, n_boot=n_boot, seed=seed, quantity=which.value
    )


def compare_fits(fits: Mapping[str, PowerLawFit]) -> dict[str, Any]:
    """Compare fitted exponents across runs (e.g. T = 10/50/100, r = 1000/4000).

    Args:
        fits: label → fit.

    Returns:
        ``{"fits": {label: fit dict}, "c_range": [min, max], "c_spread": max − min,
        "pairs": [{"a", "b", "delta_c", "ci_overlap"}, ...]}`` where ``ci_overlap``
        says whether the two intervals for ``c`` intersect.
    """
    if not fits:
        raise ValueError("compare_fits needs at least one fit")
    labels = list(fits)
    cs = np.array([fits[lab].c for lab in labels])
    pairs = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            fa, fb = fits[a], fits[b]
            pairs.append(
                {
                    "a": a,
                    "b": b,
                    "delta_c": fb.c - fa.c,
                    "ci_overlap": bool(fa.ci[0] <= fb.ci[1] and fb.ci[0] <= fa.ci[1]),
                }
            )
    return {
        "fits": {lab: fits[lab].to_dict() for lab in labels},
        "c_range": [float(cs.min()), float(cs.max())],
        "c_spread": float(cs.max() - cs.min()),
        "pairs": pairs,
    }
