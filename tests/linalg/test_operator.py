"""The streamed operator against dense float64 products."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import torch

from gradspec.linalg import ArraySink, GradientOperator, parse_rows
from gradspec.linalg._passes import _Gram, _HHt, _Matmat


@pytest.fixture
def h() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((37, 1000))


SELECTIONS = {
    "all": (None, None),
    "slice": (slice(5, 30), None),
    "stride": (slice(2, None, 3), None),
    "indices": ([0, 7, 3, 36, 20], None),
    "cols": (None, [(0, 100), (400, 1000)]),
    "rows+cols": (slice(10, 37), [(250, 260), (900, 999)]),
}


def dense_of(h: np.ndarray, rows, cols) -> np.ndarray:
    x = h if rows is None else h[rows] if isinstance(rows, slice) else h[np.asarray(rows)]
    return x if cols is None else np.concatenate([x[:, a:b] for a, b in cols], axis=1)


@pytest.mark.parametrize("sel", list(SELECTIONS), ids=list(SELECTIONS))
@pytest.mark.parametrize("kind", ["numpy", "torch", "dask"])
def test_products_match_dense(h, sel, kind, device):
    rows, cols = SELECTIONS[sel]
    src = {"numpy": h, "torch": torch.from_numpy(h), "dask": da.from_array(h, chunks=(37, 300))}[
        kind
    ]
    op = GradientOperator(src, rows=rows, col_ranges=cols, block_cols=130, device=device)
    ref = dense_of(h, rows, cols)
    assert op.shape == ref.shape
    rng = np.random.default_rng(1)
    x = rng.standard_normal((ref.shape[1], 4))
    y = rng.standard_normal((ref.shape[0], 3))
    np.testing.assert_allclose(op.gram(), ref @ ref.T, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(op.matmat(x), ref @ x, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(op.rmatmat(y), ref.T @ y, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(op.hht(y), ref @ (ref.T @ y), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(op.frob2, (ref**2).sum(), rtol=1e-12)


def test_center_is_explicit(h):
    hc = h - h.mean(axis=0)
    op = GradientOperator(h, center=True, block_cols=128)
    np.testing.assert_allclose(op.gram(), hc @ hc.T, atol=1e-9)
    assert not np.allclose(GradientOperator(h).gram(), hc @ hc.T)


def test_fused_pass_reads_once(h):
    """One pass serves the Gram, H·Hᵀ·Q and H·X; the source is read once."""
    reads = []
    op = GradientOperator(h, block_cols=200)
    orig = op.source.iter_col_blocks

    def counting(*a, **kw):
        for item in orig(*a, **kw):
            reads.append(item[0])
            yield item

    op.source.iter_col_blocks = counting
    q = np.random.default_rng(2).standard_normal((37, 2))
    x = np.random.default_rng(3).standard_normal((1000, 2))
    g, z, hx = op.fused([_Gram(op), _HHt(op, q), _Matmat(op, x)])
    assert reads == [0, 200, 400, 600, 800] and op.passes == 1
    np.testing.assert_allclose(g, h @ h.T, atol=1e-10)
    np.testing.assert_allclose(z, h @ h.T @ q, atol=1e-9)
    np.testing.assert_allclose(hx, h @ x, atol=1e-10)


def test_rmatmat_streams_to_sink(h):
    y = np.random.default_rng(4).standard_normal((37, 2))
    sink = ArraySink(1000, 2, np.float64)
    assert GradientOperator(h, block_cols=333).rmatmat(y, sink=sink) is None
    np.testing.assert_allclose(sink.array, h.T @ y, atol=1e-10)


@pytest.mark.parametrize("center", [False, True])
def test_project_checks_with_the_gram_equal_direct_products(center):
    """With the Gram of pass 1, H·V_s and V_sᵀV_s of the stored float32 V equal dense float64 ones."""
    rng = np.random.default_rng(5)
    h = (rng.standard_normal((30, 20)) @ rng.standard_normal((20, 900))).astype(np.float32)
    op = GradientOperator(h, block_cols=200, center=center, precision="float64")
    g = op.gram()
    lam, u = np.linalg.eigh(g)
    u, sigma = u[:, ::-1][:, :8], np.sqrt(lam[::-1][:8])
    sink = ArraySink(900, 8, np.float32)
    via_gram = op.project(u, sigma, sink, gram=g)
    direct = op.project(u, sigma, ArraySink(900, 8, np.float32))
    hc = h.astype(np.float64) - (h.mean(axis=0, dtype=np.float64) if center else 0.0)
    vs = sink.array.astype(np.float64)
    for stats in (via_gram, direct):
        np.testing.assert_allclose(stats["hv"], hc @ vs, rtol=0, atol=1e-11 * np.abs(hc @ vs).max())
        np.testing.assert_allclose(stats["vtv"], vs.T @ vs, rtol=0, atol=1e-12)
        exact = (hc.T @ (u / sigma)) * sigma
        np.testing.assert_allclose(stats["rt2"], ((exact - vs * sigma) ** 2).sum(0), rtol=1e-3)
    assert np.abs(vs - hc.T @ (u / sigma)).max() > 0  # the float32 rounding is really there


def test_to_scipy_is_a_linear_operator(h):
    lo = GradientOperator(h).to_scipy()
    x = np.arange(1000.0)
    np.testing.assert_allclose(lo @ x, h @ x, rtol=1e-12)
    np.testing.assert_allclose(lo.rmatvec(np.ones(37)), h.T @ np.ones(37), rtol=1e-12)


def test_float32_precision_is_close(h):
    g32 = GradientOperator(h.astype(np.float32), precision="float32").gram()
    g64 = GradientOperator(h.astype(np.float32)).gram()
    assert np.abs(g32 - g64).max() / np.abs(g64).max() < 1e-5


def test_nan_rows_are_named():
    x = np.ones((10, 50))
    x[7, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or inf .* row 7"):
        GradientOperator(x).gram()


@pytest.mark.parametrize(
    "rows,match",
    [
        (slice(5, 5), "selects no rows"),
        ([], "selects no rows"),
        (slice(20, 30), "--rows 20:30 lies outside the 10 committed rows"),
        (slice(5, 30), "--rows 5:30 lies outside the 10 committed rows"),
        (slice(-30, None), "--rows -30: lies outside"),
        ([3, 10], "row index 10 outside the 10 committed rows"),
    ],
    ids=["empty", "no-indices", "beyond", "clipped-before", "negative-beyond", "index-beyond"],
)
def test_empty_or_out_of_range_selection(h, rows, match):
    """Bounds beyond the rows are an error: before, 5:30 of 10 rows silently meant 5:10."""
    with pytest.raises(ValueError, match=match):
        GradientOperator(h[:10], rows=rows)


def test_bad_inputs(h):
    with pytest.raises(ValueError, match="2-D"):
        GradientOperator(np.ones(5))
    with pytest.raises(TypeError, match="cannot read a gradient matrix"):
        GradientOperator({"a": 1})
    with pytest.raises(ValueError, match="outside"):
        GradientOperator(h, col_ranges=[(0, 5000)])
    with pytest.raises(ValueError, match="unknown precision"):
        GradientOperator(h, precision="half")
    with pytest.raises(ValueError, match="params .* need a gradient store"):
        GradientOperator(h, params="*.weight")
    with pytest.raises(ValueError, match="matmat needs X with 1000 rows"):
        GradientOperator(h).matmat(np.ones((3, 2)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_unavailable_is_a_clear_error(h):
    with pytest.raises(ValueError, match="CUDA is not available"):
        GradientOperator(h, device="cuda")
    assert GradientOperator(h, device="auto").device.type == "cpu"


def test_memory_budget_too_small_for_a_store_block():
    class Fake:  # a store-like source whose chunks are wide
        shape, dtype, chunk_cols = (1000, 10**6), np.dtype("float32"), 65536

        def describe(self):
            return {}

    with pytest.raises(ValueError, match="over the memory budget"):
        op = GradientOperator.__new__(GradientOperator)
        op.source, op.shape, op.memory, op.panel_cols = Fake(), Fake.shape, 2**20, 256
        op._plan(None, 2)


def test_parse_rows():
    assert parse_rows("300:1300") == slice(300, 1300)
    assert parse_rows("::2") == slice(None, None, 2)
    assert parse_rows(None) is None
    with pytest.raises(ValueError, match="START:STOP"):
        parse_rows("300-1300")


@pytest.mark.gpu
def test_cuda_matches_cpu(h):
    for precision, tol in [("float64", 1e-12), ("float32", 1e-5), ("tf32", 1e-2)]:
        g = GradientOperator(h.astype(np.float32), device="cuda", precision=precision).gram()
        ref = GradientOperator(h.astype(np.float32)).gram()
        assert np.abs(g - ref).max() / np.abs(ref).max() < tol, precision
