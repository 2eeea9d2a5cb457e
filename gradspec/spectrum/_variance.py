"""Explained variance of a top-k subspace and reconstruction error along training.

The energy of a subspace on a set of gradient rows g_i is

    EV(k) = Σ_i ‖P_k g_i‖² / Σ_i ‖g_i‖² = 1 − Σ_i ‖(I − P_k) g_i‖² / Σ_i ‖g_i‖².

On the rows that defined the spectrum it equals Σ_{j≤k} σ_j² / ‖H‖_F²; on
held-out rows (a later row range, another store) it measures how well the
subspace generalises. Per training step, the relative reconstruction error
sqrt(Σ_{i∈step} ‖(I − P_k) g_i‖² / Σ_{i∈step} ‖g_i‖²) says where along training the
gradients leave the subspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradspec.spectrum._projection import RowProjections


def explained_variance(
    sigma: Sequence[float] | np.ndarray, *, total_energy: float | None = None
) -> np.ndarray:
    """Cumulative ``Σ_{j≤k} σ_j² / ‖H‖_F²`` for k = 1..K (index k − 1).

    Args:
        sigma: singular values of H, decreasing (1-D, finite, >= 0).
        total_energy: ``‖H‖_F²`` (sum of squared row norms). Without it the
            denominator is ``Σ σ_j²`` over the *computed* values only, so the
            curve reaches 1 at K whatever the tail holds.
    """
    s = np.asarray(sigma, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"sigma must be 1-D, got shape {s.shape}; pass one spectrum")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError("sigma must hold finite singular values >= 0 (got NaN, inf or a negative)")
    if np.any(np.diff(s) > 1e-9 * max(float(s.max(initial=0.0)), 1e-300)):
        raise ValueError(
            "sigma must be sorted in decreasing order (rank 1 first): the curve is the energy "
            "of the top-k directions"
        )
    s2 = s**2
    total = float(s2.sum()) if total_energy is None else float(total_energy)
    if not (np.isfinite(total) and total > 0):
        raise ValueError(f"the total energy ‖H‖_F² must be finite and > 0, got {total:g}")
    if total_energy is not None and s2.sum() > total * (1 + 1e-6):
        raise ValueError(
            f"Σσ² = {s2.sum():.6g} exceeds the total energy {total:.6g}; wrong ‖H‖_F²?"
        )
    return np.cumsum(s2) / total


@dataclass(frozen=True)
class ExplainedVariance:
    """Energy fraction of the top-k subspace on a set of rows, at ranks ``ks``."""

    ks: np.ndarray
    fraction: np.ndarray
    n_rows: int
    source: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ks": self.ks.tolist(),
            "fraction": self.fraction.tolist(),
            "n_rows": self.n_rows,
            "source": dict(self.source),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExplainedVariance:
        """Inverse of :meth:`to_dict`."""
        return cls(
            ks=np.asarray(d["ks"], dtype=np.int64),
            fraction=np.asarray(d["fraction"], dtype=np.float64),
            n_rows=int(d["n_rows"]),
            source=dict(d.get("source", {})),
        )


def explained_variance_rows(
    proj: RowProjections, *, source: dict[str, Any] | None = None
) -> ExplainedVariance:
    """``EV(k) = 1 − Σ_i ‖(I − P_k) g_i‖² / Σ_i ‖g_i‖²`` at the ranks of ``proj``."""
    total = float(proj.sq_norms.sum())
    if total <= 0:
        raise ValueError("all gradient rows are zero; explained variance is undefined")
    frac = 1.0 - proj.residual_sq.sum(axis=0) / total
    return ExplainedVariance(
        ks=proj.ks.copy(), fraction=frac, n_rows=proj.n_rows, source=dict(source or {})
    )


@dataclass(frozen=True)
class StepError:
    """Relative reconstruction error per training step.

    Attributes:
        steps: distinct steps, sorted, shape (t,).
        ks: ranks, shape (m,).
        error: ``sqrt(Σ_{i∈step} ‖(I − P_k) g_i‖² / Σ_{i∈step} ‖g_i‖²)``, shape (t, m).
        rows_per_step: rows at each step (1 for batch-gradient stores).
    """

    steps: np.ndarray
    ks: np.ndarray
    error: np.ndarray
    rows_per_step: np.ndarray
    source: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps.tolist(),
            "ks": self.ks.tolist(),
            "error": self.error.tolist(),
            "rows_per_step": self.rows_per_step.tolist(),
            "source": dict(self.source),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepError:
        """Inverse of :meth:`to_dict`."""
        return cls(
            steps=np.asarray(d["steps"]),
            ks=np.asarray(d["ks"], dtype=np.int64),
            error=np.asarray(d["error"], dtype=np.float64),
            rows_per_step=np.asarray(d["rows_per_step"], dtype=np.int64),
            source=dict(d.get("source", {})),
        )


def reconstruction_error_by_step(
    proj: RowProjections, steps: Sequence[int] | np.ndarray, *, source: dict[str, Any] | None = None
) -> StepError:
    """Relative residual of each step's gradients outside the top-k subspace, for all ranks.

    Args:
        proj: row projections (:func:`project_rows`).
        steps: the training step of each row (``GradientStore.row_meta()["step"]``).
    """
    st = np.asarray(steps).reshape(-1)
    if st.size != proj.n_rows:
        raise ValueError(f"got {st.size} steps for {proj.n_rows} rows")
    uniq, inv, counts = np.unique(st, return_inverse=True, return_counts=True)
    res = np.zeros((uniq.size, proj.ks.size))
    nrm = np.zeros(uniq.size)
    np.add.at(res, inv, proj.residual_sq)
    np.add.at(nrm, inv, proj.sq_norms)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.where(nrm[:, None] > 0, np.sqrt(res / nrm[:, None]), 0.0)
    return StepError(
        steps=uniq, ks=proj.ks.copy(), error=err, rows_per_step=counts, source=dict(source or {})
    )
