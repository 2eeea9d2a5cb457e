"""Subspace diagnostics from the Gram matrix against dense float64 references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from gradspec.linalg import GradientOperator, orthogonal_iteration
from gradspec.spectrum import (
    gram_eigh,
    gram_subspace_cosines,
    heldout_projections_from_gram,
    principal_angles,
    project_rows,
    restricted_lipschitz,
    row_projections_from_gram,
    row_projections_from_svd,
)


def _h(r: int = 40, p: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # a decaying spectrum, as gradients have: H = A·diag(k^-0.8)·Bᵀ
    a = np.linalg.qr(rng.standard_normal((r, r)))[0]
    b = np.linalg.qr(rng.standard_normal((p, r)))[0]
    return a @ np.diag(np.arange(1, r + 1) ** -0.8) @ b.T


def _right_vectors(h: np.ndarray, k: int) -> np.ndarray:
    return np.linalg.svd(h, full_matrices=False)[2][:k].T


def test_gram_eigh_matches_svd() -> None:
    h = _h()
    sigma, u = gram_eigh(h @ h.T, 10)
    uu, ss, _ = np.linalg.svd(h, full_matrices=False)
    np.testing.assert_allclose(sigma, ss[:10], rtol=1e-10)
    np.testing.assert_allclose(np.abs(np.sum(u * uu[:, :10], axis=0)), 1.0, atol=1e-8)


def test_principal_angles_match_scipy() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((200, 5)), rng.standard_normal((200, 8))
    np.testing.assert_allclose(principal_angles(a, b), np.sort(scipy.linalg.subspace_angles(a, b)),
                               atol=1e-12)
    # a tiny rotation: the sine branch resolves it where arccos of the cosine cannot
    q = np.linalg.qr(rng.standard_normal((200, 3)))[0]
    perp = rng.standard_normal(200)
    perp -= q @ (q.T @ perp)
    perp /= np.linalg.norm(perp)
    q2 = q.copy()
    q2[:, 0] = np.cos(1e-9) * q[:, 0] + np.sin(1e-9) * perp
    assert principal_angles(q, q2)[-1] == pytest.approx(1e-9, rel=1e-4)


def test_gram_subspace_cosines_of_row_subsets() -> None:
    h = _h(60, 400)
    g = h @ h.T
    ia, ib = np.arange(0, 40), np.arange(20, 60)
    sa, ua = gram_eigh(g[np.ix_(ia, ia)], 8)
    sb, ub = gram_eigh(g[np.ix_(ib, ib)], 12)
    cos = gram_subspace_cosines(g[np.ix_(ia, ib)], ua, sa, ub, sb)
    ref = np.cos(principal_angles(_right_vectors(h[ia], 8), _right_vectors(h[ib], 12)))
    np.testing.assert_allclose(cos, np.sort(ref)[::-1], atol=1e-10)
    # the same subspace: all cosines 1
    same = gram_subspace_cosines(g[np.ix_(ia, ia)], ua, sa, ua, sa)
    np.testing.assert_allclose(same, 1.0, atol=1e-10)


def test_gram_subspace_cosines_refuses_bad_shapes() -> None:
    with pytest.raises(ValueError, match="G_ab has shape"):
        gram_subspace_cosines(np.eye(3), np.eye(4)[:, :2], np.ones(2), np.eye(3)[:, :2], np.ones(2))
    with pytest.raises(ValueError, match="must be > 0"):
        gram_subspace_cosines(np.eye(3), np.eye(3)[:, :2], np.array([1.0, 0.0]), np.eye(3)[:, :2],
                              np.ones(2))


def test_row_projections_from_gram_match_project_rows() -> None:
    h = _h(30, 250)
    ks = [0, 1, 2, 4, 8, 16, 30]
    v = _right_vectors(h, 30)
    ref = project_rows([(0, h)], v, ks=ks)
    got = row_projections_from_gram(h @ h.T, ks)
    np.testing.assert_allclose(got.sq_norms, ref.sq_norms, rtol=1e-10)
    np.testing.assert_allclose(got.residual_sq, ref.residual_sq, atol=1e-12)
    np.testing.assert_allclose(restricted_lipschitz(got).max, restricted_lipschitz(ref).max, atol=1e-6)
    with pytest.raises(ValueError, match="ranks must lie"):
        row_projections_from_gram(h @ h.T, [0, 31])


def test_row_projections_from_svd_match_project_rows() -> None:
    """In-sample G_k from U, σ and the row norms alone equal the streamed projection of H onto V."""
    h = _h(30, 250)
    u, s, vt = np.linalg.svd(h, full_matrices=False)
    ks = [0, 1, 3, 7, 12, 20]  # up to the K = 20 triplets given, fewer than r
    ref = project_rows([(0, h)], vt[:20].T, ks=ks)
    got = row_projections_from_svd((h**2).sum(axis=1), u[:, :20], s[:20], ks)
    np.testing.assert_array_equal(got.ks, ref.ks)
    np.testing.assert_allclose(got.sq_norms, ref.sq_norms, rtol=1e-14)
    np.testing.assert_allclose(got.residual_sq, ref.residual_sq, rtol=1e-10, atol=1e-13 * ref.sq_norms.max())
    with pytest.raises(ValueError, match=r"ranks must lie in \[0, 20\]"):
        row_projections_from_svd((h**2).sum(axis=1), u[:, :20], s[:20], [0, 21])
    with pytest.raises(ValueError, match="one row per norm"):
        row_projections_from_svd((h**2).sum(axis=1)[:-1], u[:, :20], s[:20], ks)
    with pytest.raises(ValueError, match="NaN/inf"):
        row_projections_from_svd(np.full(30, np.nan), u[:, :20], s[:20], ks)


def test_orthogonal_iteration_on_a_gram_factor_equals_on_h() -> None:
    """The iteration runs on H·Hᵀ in row space: a factor A with A·Aᵀ = H·Hᵀ gives the same iterates."""
    h = _h(50, 600)
    g = h @ h.T
    sigma, u = gram_eigh(g)
    a = u * sigma  # A·Aᵀ = U Σ² Uᵀ = G
    on_h = orthogonal_iteration(GradientOperator(h), k=5, iters=3, oversample=2, seed=4)
    on_a = orthogonal_iteration(GradientOperator(a), k=5, iters=3, oversample=2, seed=4)
    np.testing.assert_allclose(on_a.theta, on_h.theta, rtol=1e-9)
    np.testing.assert_allclose(np.abs(np.sum(on_a.u * on_h.u, axis=0))[:5], 1.0, atol=1e-8)


def test_heldout_projections_from_gram_match_project_rows() -> None:
    h = _h(40, 300) + 0.01 * np.random.default_rng(3).standard_normal((40, 300))
    fit, ev = np.arange(0, 30), np.arange(30, 40)
    ks = [0, 1, 3, 10, 30]
    ref = project_rows([(0, h[ev])], _right_vectors(h[fit], 30), ks=ks)
    got = heldout_projections_from_gram(h @ h.T, fit, ev, ks)
    np.testing.assert_allclose(got.sq_norms, ref.sq_norms, rtol=1e-10)
    np.testing.assert_allclose(got.residual_sq, ref.residual_sq, atol=1e-10)
    assert np.all(got.residual_sq[:, -1] > 0)  # out of sample: no zero at k = r_fit
    with pytest.raises(ValueError, match="overlap"):
        heldout_projections_from_gram(h @ h.T, fit, np.arange(25, 35), ks)
