"""Kernel density estimate of singular values (Li et al. 2022, Figure 2a, left).

A Gaussian KDE (``scipy.stats.gaussian_kde``) of the singular values, by
default of ``log10 σ`` because a decaying spectrum spans decades and its mass
piles up near zero on a linear axis. The bandwidth is Scott's rule,
``h = σ̂·m^(−1/5)`` (σ̂ the sample standard deviation of the m values in the
chosen space); Silverman's rule ``h = σ̂·(3m/4)^(−1/5)`` or an absolute
bandwidth are the alternatives. The rule and the resulting h are returned so
that a figure can state them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np


class DensitySpace(StrEnum):
    """The variable the density is estimated of."""

    LOG10 = "log10"  # log10 sigma_k
    LINEAR = "linear"  # sigma_k


@dataclass(frozen=True)
class SpectralDensity:
    """A density of singular values on a grid.

    Attributes:
        grid: points (in ``space``) where the density is evaluated.
        density: the KDE there (integrates to 1 over the real line in ``space``).
        bandwidth: the absolute kernel standard deviation, in ``space`` units.
        rule: ``"scott"``, ``"silverman"`` or ``"fixed"``.
        space: ``"log10"`` or ``"linear"``.
        n_values: singular values used.
    """

    grid: np.ndarray
    density: np.ndarray
    bandwidth: float
    rule: str
    space: str
    n_values: int

    def describe(self) -> str:
        var = "log10 σ" if self.space == "log10" else "σ"
        return (
            f"Gaussian KDE of {var} over {self.n_values} values, "
            f"bandwidth {self.bandwidth:.3g} ({self.rule})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "grid": self.grid.tolist(),
            "density": self.density.tolist(),
            "bandwidth": self.bandwidth,
            "rule": self.rule,
            "space": self.space,
            "n_values": self.n_values,
            "description": self.describe(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpectralDensity:
        """Inverse of :meth:`to_dict`."""
        return cls(
            grid=np.asarray(d["grid"], dtype=np.float64),
            density=np.asarray(d["density"], dtype=np.float64),
            bandwidth=float(d["bandwidth"]),
            rule=str(d["rule"]),
            space=str(d["space"]),
            n_values=int(d["n_values"]),
        )


def spectral_density(
    sigma: Sequence[float] | np.ndarray,
    *,
    space: DensitySpace | str = DensitySpace.LOG10,
    bandwidth: str | float = "scott",
    grid_size: int = 512,
    pad: float = 3.0,
) -> SpectralDensity:
    """Gaussian KDE of singular values.

    Args:
        sigma: singular values (positive for ``space="log10"``; zeros are left out there).
        space: estimate the density of ``log10 σ`` (default) or of ``σ``.
        bandwidth: ``"scott"`` (h = σ̂·m^(−1/5)), ``"silverman"`` (h = σ̂·(3m/4)^(−1/5)),
            or an absolute kernel standard deviation in ``space`` units.
        grid_size: number of evaluation points.
        pad: the grid extends ``pad`` bandwidths beyond the data.

    Raises:
        ValueError: fewer than 2 usable values, all values equal, or a bad bandwidth.
    """
    from scipy.stats import gaussian_kde

    from gradspec._enums import parse_choice

    sp = parse_choice(DensitySpace, space, "density space")
    if isinstance(grid_size, bool) or not isinstance(grid_size, int | np.integer) or grid_size < 2:
        raise ValueError(f"grid_size must be an integer >= 2, got {grid_size!r}")
    if not (np.isfinite(pad) and pad >= 0):
        raise ValueError(f"pad must be a finite number >= 0 (bandwidths beyond the data), got {pad}")
    s = np.asarray(sigma, dtype=np.float64).reshape(-1)
    s = s[np.isfinite(s)]
    x = np.log10(s[s > 0]) if sp is DensitySpace.LOG10 else s
    if x.size < 2:
        raise ValueError(f"a density needs at least 2 usable singular values, got {x.size}")
    std = float(x.std(ddof=1))
    if std == 0:
        raise ValueError("all singular values are equal; a density is not defined")
    m = x.size
    if isinstance(bandwidth, str):
        if bandwidth == "scott":
            factor = m ** (-1 / 5)
        elif bandwidth == "silverman":
            factor = (m * 3 / 4) ** (-1 / 5)
        else:
            raise ValueError(
                f"unknown bandwidth rule {bandwidth!r}; choose scott, silverman or a number"
            )
        rule = bandwidth
    else:
        if isinstance(bandwidth, bool) or not (np.isfinite(bandwidth) and bandwidth > 0):
            raise ValueError(
                f"bandwidth must be scott, silverman or a finite number > 0, got {bandwidth!r}"
            )
        factor = float(bandwidth) / std
        rule = "fixed"
    kde = gaussian_kde(x, bw_method=factor)
    h = float(np.sqrt(kde.covariance[0, 0]))
    grid = np.linspace(x.min() - pad * h, x.max() + pad * h, grid_size)
    return SpectralDensity(
        grid=grid, density=kde(grid), bandwidth=h, rule=rule, space=sp.value, n_values=m
    )
