"""Restricted-Lipschitz coefficients G_k (Li et al. 2022, Definition 3.1), streamed.

Definition 3.1: a loss is restricted Lipschitz with coefficients {G_k} if for
every k there is a rank-k orthogonal projector P_k with
``‖(I − P_k)∇h(x)‖₂ ≤ G_k`` at every x. We estimate G_k from the gradients a
run stored, with P_k = V_k V_kᵀ the top-k right singular vectors of a spectrum:

    Ĝ_k = max_i ‖(I − P_k) g_i‖₂,   ‖(I − P_k) g‖² = ‖g‖² − Σ_{j≤k} (v_jᵀ g)²,

beside the median and 95th percentile over the rows. All k come out of one
pass over the gradient matrix H (r × p), or of a spectrum's U and σ for its own
rows (the residuals: ``_projection.RowProjections``).

Ĝ_k is an *empirical* estimate: a maximum over the rows that were stored, with
the projector of the top-k subspace (which minimises the summed squared
residuals, not the maximum). On the rows that defined the subspace it is
optimistic — it reaches 0 at the rank of H — so measure it on held-out rows
too. Li et al.'s Assumption 3.2 asks it of the gradients of the empirical loss
F; rows that are averages of clipped per-example gradients (one per step)
estimate those, rows that are per-example gradients give larger values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradspec.spectrum._fit import PowerLawFit, fit_power_law
from gradspec.spectrum._projection import RowProjections


@dataclass
class RestrictedLipschitz:
    """Empirical restricted-Lipschitz coefficients on a grid of ranks.

    Attributes:
        ks: ranks, shape (m,).
        max: ``max_i ‖(I − P_k) g_i‖`` — the estimate Ĝ_k of Definition 3.1.
        quantiles: ``{"p50": ..., "p95": ...}``: quantiles over rows of the same norms.
        n_rows: rows the statistics were taken over.
        source: a free-form description of the rows (store path, row range, "held-out").
        unresolved: per rank, how many rows' residuals were at the rounding level of how
            they were measured (counted as 0 in the statistics; :class:`RowProjections`).
        every: the same statistics (``"max"`` and the quantile keys) at every rank
            0..max(ks), or None (not measured: then only the grid is known). The hypothesis
            of Theorem 3.3 eq. (2) is decided on them (:func:`envelope_exponent`).
    """

    ks: np.ndarray
    max: np.ndarray
    quantiles: dict[str, np.ndarray]
    n_rows: int
    source: dict[str, Any] = field(default_factory=dict)
    unresolved: np.ndarray | None = None
    every: dict[str, np.ndarray] | None = None

    def unresolved_ranks(self, name: str = "max") -> np.ndarray:
        """Ranks whose statistic ``name`` is 0 because its rows' residuals were unresolved."""
        if self.unresolved is None:
            return np.zeros(0, dtype=np.int64)
        return self.ks[(self.unresolved > 0) & (self.statistic(name) == 0)]

    @property
    def G0(self) -> float:
        """Ĝ_0 = max ‖g_i‖ (requires k = 0 on the grid)."""
        if self.ks[0] != 0:
            raise ValueError("G_0 needs k = 0 on the rank grid")
        return float(self.max[0])

    def statistic(self, name: str) -> np.ndarray:
        """``"max"`` or a quantile key such as ``"p50"``/``"p95"``."""
        if name == "max":
            return self.max
        if name not in self.quantiles:
            raise ValueError(
                f"unknown statistic {name!r}; choose max or one of {sorted(self.quantiles)}"
            )
        return self.quantiles[name]

    def statistic_every(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(ranks, values) of statistic ``name`` at every rank 0..max(ks) where measured,
        else on the grid ``ks``."""
        self.statistic(name)  # the name is checked
        if self.every is not None and name in self.every:
            vals = np.asarray(self.every[name], dtype=np.float64)
            return np.arange(vals.size, dtype=np.int64), vals
        return self.ks, self.statistic(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ks": self.ks.tolist(),
            "max": self.max.tolist(),
            **{k: v.tolist() for k, v in self.quantiles.items()},
            "n_rows": self.n_rows,
            "source": dict(self.source),
            **({"unresolved": self.unresolved.tolist()} if self.unresolved is not None else {}),
            **({"every_rank": {k: v.tolist() for k, v in self.every.items()}} if self.every is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RestrictedLipschitz:
        """Inverse of :meth:`to_dict` (e.g. from ``report.json``)."""
        skip = {"ks", "max", "n_rows", "source", "unresolved", "every_rank"}
        every = d.get("every_rank")
        return cls(
            ks=np.asarray(d["ks"], dtype=np.int64),
            max=np.asarray(d["max"], dtype=np.float64),
            quantiles={k: np.asarray(v, dtype=np.float64) for k, v in d.items() if k not in skip},
            n_rows=int(d["n_rows"]),
            source=dict(d.get("source", {})),
            unresolved=np.asarray(d["unresolved"], dtype=np.int64) if "unresolved" in d else None,
            every=None if every is None else {k: np.asarray(v, dtype=np.float64) for k, v in every.items()},
        )


def _qkey(q: float) -> str:
    return f"p{100 * q:g}".replace(".", "_")


def restricted_lipschitz(
    proj: RowProjections,
    *,
    quantiles: Sequence[float] = (0.5, 0.95),
    source: dict[str, Any] | None = None,
) -> RestrictedLipschitz:
    """Ĝ_k = max over rows of ``‖(I − P_k) g‖`` with quantiles beside it (Definition 3.1).

    Args:
        proj: the output of :func:`project_rows`.
        quantiles: quantiles over rows reported beside the maximum (keys ``p50``, ``p95``).
        source: what the rows are, stored in the result.
    """
    if proj.n_rows == 0:
        raise ValueError("no gradient rows to estimate G_k from")
    all_norms = proj.residual_norms_all()
    norms = proj.residual_norms() if all_norms is None else all_norms  # the grid's columns are among them
    stats = {"max": norms.max(axis=0), **{_qkey(q): np.quantile(norms, q, axis=0) for q in quantiles}}
    every = None if all_norms is None else stats
    grid = stats if all_norms is None else {k: v[proj.ks] for k, v in stats.items()}
    return RestrictedLipschitz(
        ks=proj.ks.copy(),
        max=grid["max"],
        quantiles={k: v for k, v in grid.items() if k != "max"},
        n_rows=proj.n_rows,
        source=dict(source or {}),
        unresolved=proj.unresolved().sum(axis=0).astype(np.int64),
        every=every,
    )


#: Ĝ_k below this fraction of Ĝ_0 is rounding (the in-sample zero at the rank of H): left out of
#: fits and envelopes.
REL_FLOOR = 1e-6


def envelope_exponent(
    ks: np.ndarray, values: np.ndarray, g0: float, *, floor: float = 0.0,
    k_range: tuple[int, int] | None = None,
) -> float:
    """The largest c with ``values_k ≤ g0·k^(−c)`` at every given rank k ≥ 2:
    ``min_k ln(g0/values_k)/ln k`` (NaN when no rank ≥ 2 is usable; values ≤ ``floor``,
    rounding-level zeros, constrain nothing). Theorem 3.3 eq. (2) asks it of every k; pass
    every rank (:meth:`RestrictedLipschitz.statistic_every`) — on a grid of ranks it is
    optimistic, as the ranks between grid points are not checked."""
    ks = np.asarray(ks, dtype=np.int64)
    y = np.asarray(values, dtype=np.float64)
    sel = (ks >= 2) & (y > floor)
    if k_range is not None:
        sel &= (ks >= k_range[0]) & (ks <= k_range[1])
    if not (math.isfinite(g0) and g0 > 0 and np.any(sel)):
        return math.nan
    return float(np.min(np.log(g0 / y[sel]) / np.log(ks[sel])))


@dataclass(frozen=True)
class LipschitzDecay:
    """How fast Ĝ_k decays, against the c > 1/2 hypothesis of Theorem 3.3, eq. (2).

    Attributes:
        statistic: which row statistic was fitted (``"max"``, ``"p50"``, ``"p95"``).
        fit: least-squares power law ``Ĝ_k ≈ a·k^(−c)`` on the measured k ≥ 1.
        envelope_c: the largest c with ``Ĝ_k ≤ Ĝ_0·k^(−c)`` at every k ≥ 2 measured
            (every rank up to the largest on the grid, where ``envelope_ranks`` is ``"every"``).
        G0: Ĝ_0 of that statistic.
        envelope_ranks: ``"every"`` (every rank 2..max(ks)) or ``"grid"`` (the grid only:
            optimistic between its points; e.g. G_k read back from an older report.json).
    """

    statistic: str
    fit: PowerLawFit
    envelope_c: float
    G0: float
    envelope_ranks: str = "every"

    @property
    def c(self) -> float:
        return self.fit.c

    @property
    def c_gt_half(self) -> bool:
        """The fitted exponent exceeds 1/2."""
        return bool(self.fit.c > 0.5)

    @property
    def c_gt_half_ci(self) -> bool:
        """Even the lower end of the confidence interval for c exceeds 1/2."""
        return bool(self.fit.ci[0] > 0.5)

    @property
    def envelope_c_gt_half(self) -> bool:
        """``Ĝ_k ≤ Ĝ_0·k^(−c)`` holds on the measured ranks for some c > 1/2."""
        return bool(np.isfinite(self.envelope_c) and self.envelope_c > 0.5)

    def verdict(self) -> str:
        """One line for a human reader."""
        side = "above" if self.c_gt_half else "below"
        return (
            f"G_k ({self.statistic}) decays like k^(−{self.c:.3f}), {side} the c > 1/2 of "
            f"Li et al. Theorem 3.3 eq. (2) (CI [{self.fit.ci[0]:.3f}, {self.fit.ci[1]:.3f}]); "
            f"envelope G_k <= G_0 k^(−c) holds up to c = {self.envelope_c:.3f}"
            + ("" if self.envelope_ranks == "every" else " (on the grid of ranks only)")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "statistic": self.statistic,
            "fit": self.fit.to_dict(),
            "c": self.c,
            "c_gt_half": self.c_gt_half,
            "c_gt_half_ci": self.c_gt_half_ci,
            "envelope_c": self.envelope_c,
            "envelope_c_gt_half": self.envelope_c_gt_half,
            "envelope_ranks": self.envelope_ranks,
            "G0": self.G0,
            "verdict": self.verdict(),
        }


def lipschitz_decay(
    G: RestrictedLipschitz,
    *,
    statistic: str = "max",
    k_range: tuple[int, int] | None = None,
    ci: str = "analytic",
    level: float = 0.95,
    rel_floor: float = REL_FLOOR,
) -> LipschitzDecay:
    """Fit Ĝ_k ≈ a·k^(−c) and test the hypothesis of Theorem 3.3, eq. (2): c > 1/2.

    Two exponents are reported:

    * ``fit``: the least-squares power law on ``k ≥ 1`` (see :func:`fit_power_law`);
    * ``envelope_c``: the largest c with ``Ĝ_k ≤ Ĝ_0·k^(−c)`` at every k ≥ 2 up to the
      largest measured rank, i.e. ``min_k ln(Ĝ_0/Ĝ_k)/ln k`` (:func:`envelope_exponent`) —
      the hypothesis "G_k ≤ G_0 k^(−c) for all k" of Theorems 3.3 and 3.5, restricted to
      the ranks measured. It is taken over every rank where ``G.every`` holds them (the
      projections form them all); on the grid alone it would skip the ranks between grid
      points (a grid of powers of two read 0.509 where every rank reads 0.498).

    Values below ``rel_floor·Ĝ_0``, and 0 (residuals at the rounding level of how they
    were measured, e.g. the in-sample zero at the rank of H), are left out of both.

    Raises:
        ValueError: if fewer than 3 usable ranks remain.
    """
    y = G.statistic(statistic)
    ks = G.ks
    g0 = float(y[ks == 0][0]) if np.any(ks == 0) else math.nan
    floor = rel_floor * (g0 if np.isfinite(g0) else float(y.max()))
    use = (ks >= 1) & (y > floor)
    if k_range is not None:
        use &= (ks >= k_range[0]) & (ks <= k_range[1])
    fit = fit_power_law(ks[use], y[use], ci=ci, level=level, quantity="G_k")
    ks_all, y_all = G.statistic_every(statistic)
    env = envelope_exponent(ks_all, y_all, g0, floor=floor, k_range=k_range)
    return LipschitzDecay(statistic=statistic, fit=fit, envelope_c=env, G0=g0,
                          envelope_ranks="every" if ks_all is not G.ks else "grid")
