"""Subspace diagnostics: principal angles between two subspaces, and eigengaps.

PDP-SGD (Zhou et al. 2021, §3.1, Theorem 2) projects onto the top-k eigenspace
``V̂_k`` of the *public* gradients' second moment; its error is governed by
``‖V̂_k V̂_kᵀ − V_k V_kᵀ‖₂`` against the population (here: private, full-data) top-k
eigenspace ``V_k``, which the Davis–Kahan argument bounds by the deviation of the
second moments over the eigengap ``α_t = λ_k(Σ_t) − λ_{k+1}(Σ_t)``.

For subspaces spanned by the columns of A (p x k_a) and B (p x k_b), the principal
angles ``0 ≤ θ_1 ≤ ... ≤ θ_r ≤ π/2`` (r = min(k_a, k_b)) have cosines the singular
values of ``Q_Aᵀ Q_B`` (Q orthonormal bases). Small angles are computed from sines
(the singular values of ``Q_B − Q_A Q_Aᵀ Q_B``), as in Björck & Golub (1973) and
``scipy.linalg.subspace_angles``, so they are accurate where ``arccos`` is not. For
k_a = k_b, ``sin θ_r = ‖P_A − P_B‖₂`` (the projection distance of Theorem 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "SubspaceComparison",
    "compare_subspaces",
    "eigengap",
    "principal_angles",
    "second_moment_distance",
]


def _as_basis(x: Any, what: str) -> np.ndarray:
    a = x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] < 1 or a.shape[0] < a.shape[1]:
        raise ValueError(f"{what} must be a p x k matrix with 1 <= k <= p (columns span the "
                         f"subspace), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{what} holds NaN or inf")
    return a


def _orth(a: np.ndarray, what: str, orthonormal: bool) -> np.ndarray:
    if orthonormal:
        return a
    q, r = np.linalg.qr(a)
    d = np.abs(np.diag(r))
    if d.min(initial=np.inf) <= 1e-12 * max(d.max(initial=0.0), 1e-300):
        raise ValueError(f"the columns of {what} are linearly dependent: give a basis of full "
                         "column rank")
    return q


def principal_angles(a: Any, b: Any, *, orthonormal: bool = False) -> np.ndarray:
    """Principal angles (radians, ascending) between the column spaces of ``a`` and ``b``.

    Args:
        a: p x k_a matrix (numpy array or torch tensor); its columns span the first subspace.
        b: p x k_b matrix, same p.
        orthonormal: the columns are already orthonormal (skips the QR; a projector's
            basis, say). Otherwise each is orthonormalised by QR in float64.

    Returns:
        ``min(k_a, k_b)`` angles in [0, π/2], float64, smallest first.

    Raises:
        ValueError: shapes that do not match, non-finite entries, dependent columns.
    """
    a, b = _as_basis(a, "a"), _as_basis(b, "b")
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"the two bases live in different dimensions: {a.shape[0]} vs {b.shape[0]} rows")
    qa, qb = _orth(a, "a", orthonormal), _orth(b, "b", orthonormal)
    if qa.shape[1] < qb.shape[1]:
        qa, qb = qb, qa  # qa spans the larger subspace
    cross = qa.T @ qb
    cosines = np.clip(np.linalg.svd(cross, compute_uv=False), 0.0, 1.0)  # descending
    residual = qb - qa @ cross
    sines = np.clip(np.linalg.svd(residual, compute_uv=False), 0.0, 1.0)[::-1]  # ascending
    r = qb.shape[1]
    sines = sines[:r]
    # cos^2 >= 1/2: the angle is small and its sine is the accurate quantity
    return np.where(cosines**2 >= 0.5, np.arcsin(sines), np.arccos(cosines))


def eigengap(eigenvalues: Any, k: int, *, relative: bool = False) -> float:
    """``λ_k − λ_{k+1}`` of eigenvalues sorted descending (k counts from 1).

    Args:
        eigenvalues: at least k + 1 values, descending (e.g. of a second-moment matrix).
        k: the rank whose gap is wanted.
        relative: divide by ``λ_1`` (a scale-free gap).

    Raises:
        ValueError: fewer than k + 1 values, unsorted or non-finite values, k < 1.
    """
    lam = np.asarray(eigenvalues.detach().cpu().numpy() if hasattr(eigenvalues, "detach")
                     else eigenvalues, dtype=np.float64).ravel()
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if lam.size < k + 1:
        raise ValueError(f"the eigengap at k={k} needs {k + 1} eigenvalues, got {lam.size}; "
                         "compute one more")
    if not np.all(np.isfinite(lam)):
        raise ValueError("eigenvalues hold NaN or inf")
    if np.any(np.diff(lam) > 1e-12 * max(abs(float(lam[0])), 1e-300)):
        raise ValueError("eigenvalues must be sorted descending (largest first)")
    gap = float(lam[k - 1] - lam[k])
    if relative:
        if lam[0] <= 0:
            raise ValueError("the relative eigengap needs λ_1 > 0")
        gap /= float(lam[0])
    return gap


@dataclass(frozen=True)
class SubspaceComparison:
    """How far an estimated subspace is from a reference one (both rank k).

    Attributes:
        angles: principal angles, radians, ascending.
        mean_cos2: ``‖Q_Aᵀ Q_B‖_F² / k``: 1 for equal subspaces; ``k / p`` in
            expectation for a uniformly random k-subspace.
        max_angle: the largest principal angle θ_k (radians).
        projection_distance: ``sin θ_k = ‖P_A − P_B‖₂``.
    """

    angles: np.ndarray
    mean_cos2: float
    max_angle: float
    projection_distance: float

    def to_dict(self) -> dict[str, Any]:
        return {"angles": [float(x) for x in self.angles], "mean_cos2": self.mean_cos2,
                "max_angle": self.max_angle, "projection_distance": self.projection_distance}


def compare_subspaces(estimate: Any, reference: Any, *, orthonormal: bool = False) -> SubspaceComparison:
    """Principal angles and summary distances between two subspaces of equal rank.

    Raises:
        ValueError: ranks that differ (the projection distance is then 1 trivially).
    """
    a, b = _as_basis(estimate, "estimate"), _as_basis(reference, "reference")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"compare subspaces of equal rank: {a.shape[1]} vs {b.shape[1]} columns")
    theta = principal_angles(a, b, orthonormal=orthonormal)
    return SubspaceComparison(angles=theta, mean_cos2=float(np.mean(np.cos(theta) ** 2)),
                              max_angle=float(theta[-1]), projection_distance=float(np.sin(theta[-1])))


def second_moment_distance(rows_a: Any, rows_b: Any) -> float:
    """``‖M_A − M_B‖₂`` for the second moments ``M = (1/m) Σ_i g_i g_iᵀ`` of two row sets.

    Never forms a p x p matrix: with ``Z = [G_A/√m_A; G_B/√m_B]`` and ``D = diag(1, −1)``
    (blockwise), ``M_A − M_B = Zᵀ D Z``, whose non-zero eigenvalues are those of the
    symmetric ``Fᵀ D F`` for ``K = Z Zᵀ = F Fᵀ`` ((m_A + m_B) x (m_A + m_B)), float64.
    This is the deviation ``‖M_t − Σ_t‖`` of Zhou et al. (2021, §3.1) when B holds the
    population (here: the full private data set); Davis–Kahan turns it into
    ``sin θ_k ≤ 2 ‖M_A − M_B‖₂ / (λ_k(M_B) − λ_{k+1}(M_B))`` (Yu, Wang & Samworth 2015).

    Args:
        rows_a: m_A x p gradients (numpy array or torch tensor).
        rows_b: m_B x p gradients, same p.
    """
    a, b = (np.asarray(r.detach().cpu().numpy() if hasattr(r, "detach") else r, dtype=np.float64)
            for r in (rows_a, rows_b))
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
        raise ValueError(f"give two non-empty row sets of the same width p, got shapes {a.shape} "
                         f"and {b.shape}")
    z = np.concatenate([a / np.sqrt(len(a)), b / np.sqrt(len(b))])
    gram = z @ z.T
    w, u = np.linalg.eigh(gram)
    keep = w > 1e-12 * max(float(w[-1]), 1e-300)  # K = F F^T on its numerical range only
    f = u[:, keep] * np.sqrt(w[keep])
    if not f.shape[1]:
        return 0.0
    d = np.concatenate([np.ones(len(a)), -np.ones(len(b))])
    return float(np.abs(np.linalg.eigvalsh(f.T @ (d[:, None] * f))).max())
