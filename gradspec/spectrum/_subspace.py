"""Subspace diagnostics from the Gram matrix: cosines of principal angles and row projections.

(Principal angles between explicit p×k bases: :func:`gradspec.spectrum.principal_angles`.)

For r ≪ p, the r×r Gram matrix G = H·Hᵀ (float64, one pass over H) answers every
question about the right-singular subspaces of H and of its row subsets without
touching the p-long vectors again (Li et al. 2022, App. B compares the spectra and
subspaces of row subsets and of different solvers):

- the spectrum of the rows ``a`` is that of the principal sub-block G_aa;
- the top-k right-singular vectors of H_a are V_a = H_aᵀ·U_a·Σ_a⁻¹, so for two row
  subsets (or two estimates U, Σ of one) the cosines of the principal angles between
  span(V_a) and span(V_b) are the singular values of Σ_a⁻¹·U_aᵀ·G_ab·U_b·Σ_b⁻¹, with
  G_ab = H_a·H_bᵀ a block of G;
- the projection residual of row i onto the top-k right-singular subspace of H is
  ‖(I − P_k)g_i‖² = G_ii − Σ_{j≤k} λ_j·U_ij² (H·V_k = U_k·Σ_k), so G_k of
  Definition 3.1 on the collected rows needs no second pass.

Cosines lose precision for angles below ~1e-8 rad (float64); the angles reported are
``arccos`` of the clipped cosines.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gradspec.spectrum._projection import ROUNDING_MARGIN, RowProjections
from gradspec.spectrum._projection import unit_roundoff as _roundoff

__all__ = [
    "gram_eigh",
    "gram_subspace_cosines",
    "heldout_projections_from_gram",
    "row_projections_from_gram",
    "row_projections_from_svd",
]


def _symmetric(g: np.ndarray, what: str = "the Gram matrix") -> np.ndarray:
    g = np.asarray(g, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise ValueError(f"{what} must be square (r×r), got shape {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError(f"{what} has NaN or inf entries; recompute it from finite gradients")
    return g


def gram_eigh(g: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k singular values and left singular vectors of H from G = H·Hᵀ.

    Args:
        g: the r×r Gram matrix (symmetrised here).
        k: how many (default all r).

    Returns:
        ``(sigma, U)``: σ descending (√ of the eigenvalues clipped at 0), U (r×k).
    """
    g = _symmetric(g)
    r = g.shape[0]
    k = r if k is None else int(k)
    if not 1 <= k <= r:
        raise ValueError(f"k must be in [1, {r}], got {k}")
    lam, u = np.linalg.eigh((g + g.T) / 2)
    lam, u = lam[::-1][:k], u[:, ::-1][:, :k]
    return np.sqrt(np.maximum(lam, 0.0)), u


def gram_subspace_cosines(
    g_ab: np.ndarray,
    u_a: np.ndarray,
    sigma_a: np.ndarray,
    u_b: np.ndarray,
    sigma_b: np.ndarray,
) -> np.ndarray:
    """Cosines (descending) of the principal angles between two right-singular subspaces.

    span(H_aᵀ·U_a·Σ_a⁻¹) and span(H_bᵀ·U_b·Σ_b⁻¹), from G_ab = H_a·H_bᵀ only. The columns
    of each V must be orthonormal, which holds for exact singular vectors and for Ritz
    vectors of G_aa (Rayleigh–Ritz: U_aᵀ·G_aa·U_a = Σ_a²); ``a`` and ``b`` may be the same
    rows (two estimates from one H) or two row subsets.

    Args:
        g_ab: H_a·H_bᵀ (r_a×r_b).
        u_a, sigma_a: r_a×k_a left vectors and their k_a positive singular values.
        u_b, sigma_b: the same for b.

    Returns:
        min(k_a, k_b) cosines in [0, 1], descending.
    """
    g_ab = np.asarray(g_ab, dtype=np.float64)
    u_a, u_b = np.asarray(u_a, dtype=np.float64), np.asarray(u_b, dtype=np.float64)
    sa, sb = np.asarray(sigma_a, dtype=np.float64), np.asarray(sigma_b, dtype=np.float64)
    if g_ab.shape != (u_a.shape[0], u_b.shape[0]):
        raise ValueError(f"G_ab has shape {g_ab.shape}, expected ({u_a.shape[0]}, {u_b.shape[0]}) "
                         "from the rows of U_a and U_b")
    if sa.shape != (u_a.shape[1],) or sb.shape != (u_b.shape[1],):
        raise ValueError("sigma_a / sigma_b must have one value per column of U_a / U_b")
    if np.any(sa <= 0) or np.any(sb <= 0):
        raise ValueError("singular values must be > 0 (drop the zero ones: their vectors are undefined)")
    m = (u_a / sa).T @ g_ab @ (u_b / sb)
    return np.clip(np.linalg.svd(m, compute_uv=False), 0.0, 1.0)


def row_projections_from_svd(
    sq_norms: np.ndarray,
    u: np.ndarray,
    sigma: np.ndarray,
    ks: Sequence[int] | np.ndarray,
    *,
    unit_roundoff: float | None = None,
) -> RowProjections:
    """``RowProjections`` of H's own rows onto its top-k right-singular subspaces, from its SVD.

    H·V_k = U_k·Σ_k, so ‖P_k h_i‖² = Σ_{j≤k} σ_j²·U_ij² and
    ‖(I − P_k)h_i‖² = ‖h_i‖² − Σ_{j≤k} σ_j²·U_ij² (clamped at 0), for each k in ``ks``:
    G_k of Definition 3.1 on the rows a spectrum was computed from, with no pass over H.
    Exact only for exact singular triplets (H's Gram's eigenvectors); Ritz vectors of an
    iterative method satisfy H·V = U·Σ only to their residual.

    Args:
        sq_norms: ``‖h_i‖²`` of the r rows (e.g. the Gram's diagonal).
        u: the r×K left singular vectors (K ≥ max(ks)).
        sigma: their singular values.
        ks: ranks.
        unit_roundoff: the precision U and σ were computed to (e.g. a Gram formed with
            float32 products); default: that of the dtypes they are given in. It sets each
            row's ``resolution_sq``: at k = rank(H) the residual is exactly 0 and computes as
            rounding noise, which must not enter a fit as a value.

    Raises:
        ValueError: shapes that disagree, ranks outside [0, K], or a NaN/inf norm.
    """
    u_in = max(_roundoff(np.asarray(u).dtype), _roundoff(np.asarray(sigma).dtype),
               _roundoff(np.asarray(sq_norms).dtype), float(unit_roundoff or 0.0))
    sq = np.asarray(sq_norms, dtype=np.float64).reshape(-1)
    u = np.asarray(u, dtype=np.float64)
    sigma = np.asarray(sigma, dtype=np.float64).reshape(-1)
    r = sq.size
    if u.ndim != 2 or u.shape[0] != r:
        raise ValueError(f"U has shape {u.shape} for {r} row norms; it needs one row per norm")
    k = min(u.shape[1], sigma.size)
    ks_arr = np.unique(np.asarray(ks, dtype=np.int64))
    if ks_arr.size == 0 or ks_arr[0] < 0 or ks_arr[-1] > k:
        raise ValueError(f"ranks must lie in [0, {k}] (the singular triplets given), got "
                         f"{np.asarray(ks).tolist()}")
    if not np.all(np.isfinite(sq)):
        bad = np.flatnonzero(~np.isfinite(sq))
        raise ValueError(f"{bad.size} row norm(s) are NaN/inf (first: row {int(bad[0])})")
    kmax = int(ks_arr[-1])
    sq = np.clip(sq, 0.0, None)
    energy = np.cumsum((u[:, :kmax] * sigma[:kmax]) ** 2, axis=1)
    energy = np.concatenate([np.zeros((r, 1)), energy], axis=1)
    resid_all = np.clip(sq[:, None] - energy, 0.0, None)
    # Σ_j σ_j²U_ij² carries U's and σ's rounding (relative to ‖h_i‖²) and the eigensolver's
    # backward error (≈ r·ε·σ₁², absolute).
    s1 = float(sigma[0]) ** 2 if sigma.size else 0.0
    eig = r * 2.0 * _roundoff(np.float64) * s1
    return RowProjections(ks=ks_arr, sq_norms=sq, residual_sq=resid_all[:, ks_arr],
                          resolution_sq=ROUNDING_MARGIN * (u_in * sq + eig), residual_sq_all=resid_all)


def row_projections_from_gram(
    g: np.ndarray,
    ks: Sequence[int] | np.ndarray,
    *,
    sigma: np.ndarray | None = None,
    u: np.ndarray | None = None,
) -> RowProjections:
    """``RowProjections`` of H's own rows onto its top-k right-singular subspaces, from G.

    ‖(I − P_k)g_i‖² = G_ii − Σ_{j≤k} σ_j²·U_ij² (clamped at 0), for each k in ``ks``
    (k ≤ r; k = 0 gives ‖g_i‖²): :func:`row_projections_from_svd` with the row norms
    G_ii. Feed the result to :func:`restricted_lipschitz`.

    Args:
        g: G = H·Hᵀ (r×r).
        ks: ranks.
        sigma, u: a precomputed :func:`gram_eigh` (at least max(ks) columns).
    """
    g = _symmetric(g)
    ks_arr = np.unique(np.asarray(ks, dtype=np.int64))
    r = g.shape[0]
    if ks_arr.size == 0 or ks_arr[0] < 0 or ks_arr[-1] > r:
        raise ValueError(f"ranks must lie in [0, {r}] (r rows), got {np.asarray(ks).tolist()}")
    kmax = int(ks_arr[-1])
    if sigma is None or u is None:
        sigma, u = gram_eigh(g, max(kmax, 1))
    if u.shape[1] < kmax:
        raise ValueError(f"the given U has {u.shape[1]} columns, fewer than max(ks) = {kmax}")
    return row_projections_from_svd(np.diag(g), u, sigma, ks_arr)


def heldout_projections_from_gram(
    g: np.ndarray,
    fit_rows: np.ndarray | Sequence[int],
    eval_rows: np.ndarray | Sequence[int],
    ks: Sequence[int] | np.ndarray,
) -> RowProjections:
    """``RowProjections`` of rows ``eval_rows`` onto the top-k right-singular subspaces of H_fit.

    Out of sample: the subspace of rows ``fit_rows`` (V = H_fitᵀ·U·Σ⁻¹) and rows it did not
    see, so Ĝ_k does not drop to 0 at k = r as it does for H's own rows. With
    G_fe = H_fit·H_evalᵀ: Vᵀ·g_j = Σ⁻¹·Uᵀ·G_fe[:, j], and
    ‖(I − P_k)g_j‖² = G_jj − Σ_{i≤k} (Vᵀg_j)_i² (clamped at 0).

    Args:
        g: the Gram matrix of all rows (r×r).
        fit_rows, eval_rows: disjoint row indices into ``g``.
        ks: ranks, at most the number of positive singular values of H_fit.
    """
    g = _symmetric(g)
    fit = np.asarray(fit_rows, dtype=np.int64)
    ev = np.asarray(eval_rows, dtype=np.int64)
    r = g.shape[0]
    for name, idx in (("fit_rows", fit), ("eval_rows", ev)):
        if idx.size == 0 or idx.min() < 0 or idx.max() >= r:
            raise ValueError(f"{name} must be non-empty indices in [0, {r})")
    if np.intersect1d(fit, ev).size:
        raise ValueError("fit_rows and eval_rows overlap: held-out rows must be rows the subspace did not see")
    ks_arr = np.unique(np.asarray(ks, dtype=np.int64))
    kmax = int(ks_arr[-1]) if ks_arr.size else 0
    if ks_arr.size == 0 or ks_arr[0] < 0 or kmax > fit.size:
        raise ValueError(f"ranks must lie in [0, {fit.size}] (the fitted rows), got {np.asarray(ks).tolist()}")
    sigma, u = gram_eigh(g[np.ix_(fit, fit)], max(kmax, 1))
    if kmax and not sigma[kmax - 1] > 0:
        raise ValueError(f"H_fit has rank below {kmax}: lower the ranks")
    coords = (u[:, :kmax] / sigma[:kmax]).T @ g[np.ix_(fit, ev)]  # k×m: Vᵀ g_j
    sq = np.clip(np.diag(g)[ev].copy(), 0.0, None)
    energy = np.concatenate([np.zeros((ev.size, 1)), np.cumsum(coords.T**2, axis=1)], axis=1)
    resid_all = np.clip(sq[:, None] - energy, 0.0, None)
    return RowProjections(ks=ks_arr, sq_norms=sq, residual_sq=resid_all[:, ks_arr], residual_sq_all=resid_all)
