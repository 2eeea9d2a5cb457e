"""G_k (Li et al. Definition 3.1): the streamed pass against a dense float64 projector."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.spectrum import (
    RestrictedLipschitz,
    lipschitz_decay,
    project_rows,
    rank_grid,
    restricted_lipschitz,
)


def _blocks(H: np.ndarray, width: int):
    return [(a, H[:, a : a + width]) for a in range(0, H.shape[1], width)]


def _matrix(n: int, p: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, p)) * np.arange(1, p + 1) ** -0.7


def _dense_residuals(H: np.ndarray, V: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """‖(I − V_k V_kᵀ) g_i‖ with the explicit p × p projector, float64."""
    p = H.shape[1]
    out = np.empty((H.shape[0], ks.size))
    for j, k in enumerate(ks):
        P = V[:, :k] @ V[:, :k].T
        out[:, j] = np.linalg.norm(H @ (np.eye(p) - P).T, axis=1)
    return out


def test_rank_grid():
    assert rank_grid(10).tolist() == [0, 1, 2, 4, 8, 10]
    assert rank_grid(8).tolist() == [0, 1, 2, 4, 8]
    assert rank_grid(4, every=True).tolist() == [0, 1, 2, 3, 4]
    assert rank_grid(5, include_zero=False).tolist() == [1, 2, 4, 5]
    assert rank_grid(0).tolist() == [0]


@pytest.mark.parametrize("width", [1, 7, 70], ids=lambda w: f"block{w}")
@pytest.mark.parametrize("heldout", [False, True], ids=["in-sample", "held-out"])
def test_streamed_equals_dense_projector(width, heldout):
    H = _matrix(30, 70, seed=0)
    basis_rows = _matrix(40, 70, seed=1) if heldout else H
    V = np.linalg.svd(basis_rows, full_matrices=False)[2].T  # 70 × 30
    ks = rank_grid(V.shape[1], every=True)
    proj = project_rows(_blocks(H, width), V, ks=ks)
    ref = _dense_residuals(H, V, ks)
    scale = np.linalg.norm(H, axis=1).max()
    np.testing.assert_allclose(proj.residual_norms(), ref, rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(proj.sq_norms, (H**2).sum(axis=1), rtol=1e-12)
    G = restricted_lipschitz(proj)
    np.testing.assert_allclose(G.max, ref.max(axis=0), rtol=1e-6, atol=1e-6 * scale)
    np.testing.assert_allclose(
        G.quantiles["p95"], np.quantile(ref, 0.95, axis=0), rtol=1e-6, atol=1e-6 * scale
    )
    np.testing.assert_allclose(
        G.quantiles["p50"], np.median(ref, axis=0), rtol=1e-6, atol=1e-6 * scale
    )
    assert np.all(np.diff(G.max) <= 1e-12 * scale)  # nested projectors: non-increasing
    assert pytest.approx(np.linalg.norm(H, axis=1).max()) == G.G0


def test_float32_blocks_and_zarr_like_basis():
    """float32 gradient blocks (as a store yields them) against the float64 reference on the same data."""
    H = _matrix(20, 50, seed=2).astype(np.float32)
    V = np.linalg.svd(H.astype(np.float64), full_matrices=False)[2].T
    ks = np.array([0, 3, 10, 20])
    proj = project_rows(_blocks(H, 16), V.astype(np.float32), ks=ks, atol=1e-5)
    ref = _dense_residuals(H.astype(np.float64), V.astype(np.float32).astype(np.float64), ks)
    np.testing.assert_allclose(proj.residual_norms()[:, :3], ref[:, :3], rtol=1e-5)


def test_exact_projector_resolves_float32_basis():
    """A float32 V is orthonormal to ~1e-7; the Cholesky correction keeps G_p at ~0. Either way the
    residual at the rank of H is at the rounding level of V, so it is reported as 0."""
    H = _matrix(40, 30, seed=5)
    V32 = np.linalg.svd(H, full_matrices=False)[2].T.astype(np.float32)
    norms = np.linalg.norm(H, axis=1)
    exact_proj = project_rows(_blocks(H, 8), V32, ks=[30])
    naive_proj = project_rows(_blocks(H, 8), V32, ks=[30], exact_projector=False)
    exact, naive = np.sqrt(exact_proj.residual_sq[:, 0]), np.sqrt(naive_proj.residual_sq[:, 0])
    assert np.all(exact < 1e-6 * norms)
    assert naive.max() > 10 * exact.max()
    for proj in (exact_proj, naive_proj):
        assert proj.unresolved().all() and not proj.residual_norms().any()


def test_keep_coords_and_relative():
    H = _matrix(10, 30, seed=3)
    V = np.linalg.svd(H, full_matrices=False)[2].T
    proj = project_rows(_blocks(H, 8), V, ks=[0, 5], keep_coords=True)
    np.testing.assert_allclose(proj.coords, H @ V[:, :5], rtol=1e-12)
    np.testing.assert_allclose(proj.relative_residuals()[:, 0], 1.0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda H, V: (_blocks(H, 8), 2 * V, None), "not unit vectors"),
        (lambda H, V: (_blocks(H, 8)[:-1], V, None), "cover"),
        (lambda H, V: (_blocks(H, 8), V, [0, 99]), "ranks must lie"),
        (lambda H, V: ([], V, None), "no column blocks"),
        (lambda H, V: ([(25, H[:, :8])], V, None), "outside"),
    ],
    ids=["not-orthonormal", "missing-columns", "rank-too-large", "empty", "out-of-range"],
)
def test_bad_input(make, match):
    H = _matrix(10, 30, seed=4)
    V = np.linalg.svd(H, full_matrices=False)[2].T
    blocks, basis, ks = make(H, V)
    with pytest.raises(ValueError, match=match):
        project_rows(blocks, basis, ks=ks)


def _tiles(H: np.ndarray, width: int, rows: int):
    """Column blocks of ``width`` columns, each as tiles of ``rows`` rows (GradientStore.iter_tiles)."""
    return [(i, a, H[i : i + rows, a : a + width])
            for a in range(0, H.shape[1], width) for i in range(0, H.shape[0], rows)]


@pytest.mark.parametrize("rows", [1, 4, 30], ids=lambda r: f"tile{r}")
def test_tiles_equal_whole_column_blocks(rows):
    """Tiles of rows give the numbers of whole column blocks: V is read once per column block."""
    H = _matrix(30, 70, seed=6)
    V = np.linalg.svd(_matrix(40, 70, seed=7), full_matrices=False)[2].T
    whole = project_rows(_blocks(H, 16), V, ks=[0, 3, 30], keep_coords=True)
    read: list[tuple[int, int]] = []

    class Basis:  # V that records which of its rows are read
        shape = V.shape

        def __getitem__(self, key):
            read.append((key[0].start, key[0].stop))
            return V[key]

    tiled = project_rows(_tiles(H, 16, rows), Basis(), ks=[0, 3, 30], n_rows=30, keep_coords=True)
    np.testing.assert_allclose(tiled.residual_sq, whole.residual_sq, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(tiled.coords, whole.coords, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(tiled.sq_norms, whole.sq_norms)
    assert read == [(a, min(a + 16, 70)) for a in range(0, 70, 16)]  # each row of V once


def test_panels_of_a_wide_block_equal_one_product(monkeypatch):
    """A block wider than PANEL_COLS is multiplied panel by panel, to the same numbers."""
    import gradspec.spectrum._projection as lip

    H = _matrix(12, 50, seed=8)
    V = np.linalg.svd(H, full_matrices=False)[2].T
    ref = project_rows([(0, H)], V, ks=[0, 2, 12])
    monkeypatch.setattr(lip, "PANEL_COLS", 7)
    got = project_rows([(0, H)], V, ks=[0, 2, 12])
    np.testing.assert_allclose(got.residual_sq, ref.residual_sq, rtol=1e-10, atol=1e-12 * ref.sq_norms.max())


@pytest.mark.parametrize(
    "tiles, match",
    [
        (lambda H: [t for t in _tiles(H, 8, 4) if t[0] != 4], r"rows 8\.\.9 .* row 4 of 10 was due"),
        (lambda H: _tiles(H, 8, 4)[::-1], r"rows 8\.\.9 of column block \[24, 30\) came where row 0"),
        (lambda H: [t for t in _tiles(H, 8, 4) if not (t[1] == 24 and t[0] == 8)],
         r"column block \[24, 30\) end at row 8 of 10"),
        (lambda H: [(0, 0, H[:, :8]), (0, 8, H[:4, 8:])], r"column block \[8, 30\) end at row 4 of 10"),
    ],
    ids=["row-gap", "out-of-order", "last-block-short", "short-block"],
)
def test_tiles_must_cover_each_block_once_in_order(tiles, match):
    H = _matrix(10, 30, seed=4)
    V = np.linalg.svd(H, full_matrices=False)[2].T
    with pytest.raises(ValueError, match=match):
        project_rows(tiles(H), V, n_rows=10)


def _synthetic_G(c: float, K: int = 256) -> RestrictedLipschitz:
    ks = rank_grid(K)
    g = 2.0 * np.maximum(ks, 1).astype(float) ** -c
    return RestrictedLipschitz(ks=ks, max=g, quantiles={"p50": g / 2}, n_rows=10)


@pytest.mark.parametrize("c, above", [(0.8, True), (0.3, False)])
def test_lipschitz_decay(c, above):
    dec = lipschitz_decay(_synthetic_G(c))
    assert dec.c == pytest.approx(c, abs=1e-10)
    assert dec.envelope_c == pytest.approx(c, abs=1e-10)
    assert dec.c_gt_half is above and dec.envelope_c_gt_half is above
    assert dec.G0 == 2.0
    assert "Theorem 3.3" in dec.verdict()
    d = dec.to_dict()
    assert d["c_gt_half"] is above and d["fit"]["quantity"] == "G_k"


def test_lipschitz_decay_drops_rounding_zeros():
    G = _synthetic_G(0.8)
    G.max[-1] = 1e-12  # in-sample G at the rank of H
    dec = lipschitz_decay(G)
    assert dec.c == pytest.approx(0.8, abs=1e-10)
    assert dec.fit.k_max == G.ks[-2]


def test_round_trip():
    G = _synthetic_G(0.7)
    G2 = RestrictedLipschitz.from_dict(G.to_dict())
    np.testing.assert_array_equal(G2.max, G.max)
    np.testing.assert_array_equal(G2.quantiles["p50"], G.quantiles["p50"])
