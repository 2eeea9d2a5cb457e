"""Narrow (bfloat16/float16) panels widened into a reused buffer, and the rates each pass records."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec.linalg import GradientOperator, pca
from gradspec.linalg import _precision as prec
from gradspec.store import META_FIELDS, GradientStore, ParamLayout, SpectrumStore
from tests.linalg.cases import Case


@pytest.mark.parametrize("src", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dst", [torch.float32, torch.float64])
def test_cast_into_widens_exactly_into_the_buffer(src, dst):
    a = torch.from_numpy(np.random.default_rng(0).standard_normal((37, 50))).to(src)
    flat = torch.full((37 * 64,), np.nan, dtype=dst)
    out = prec.cast_into(flat, a)
    assert out.shape == (37, 50) and out.is_contiguous() and out.data_ptr() == flat.data_ptr()
    torch.testing.assert_close(out, a.to(dst), rtol=0, atol=0)
    part = prec.cast_into(flat, a[:, :7])  # a narrower last panel reuses the same buffer
    assert part.is_contiguous() and part.data_ptr() == flat.data_ptr()
    torch.testing.assert_close(part, a[:, :7].to(dst), rtol=0, atol=0)


def _narrow_inputs(h: np.ndarray):
    t = torch.from_numpy(h)
    return {
        "torch-bfloat16": t.to(torch.bfloat16),
        "torch-float16": t.to(torch.float16),
        "numpy-float16": h.astype(np.float16),
    }


@pytest.mark.parametrize("kind", ["torch-bfloat16", "torch-float16", "numpy-float16"])
def test_narrow_arrays_stay_narrow_and_multiply_as_widened(kind):
    h = Case("p", r=40, p=1500, k=5, spectrum="power").matrix()
    a = _narrow_inputs(h)[kind]
    exact = (a.float().numpy() if hasattr(a, "detach") else a.astype(np.float32)).astype(np.float64)
    op = GradientOperator(a, block_cols=400)
    op.panel_cols = 300  # several panels per block, and a short last one
    assert str(op.source._a.dtype).endswith("16")  # no float32 copy of H is kept
    assert op.precision == "float32"
    ref = exact @ exact.T
    np.testing.assert_allclose(op.gram(), ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    buf = op._buf.data_ptr()
    op.gram()
    assert op._buf.data_ptr() == buf  # one widening buffer for every panel of every pass
    f64 = GradientOperator(a, precision="float64", block_cols=400)
    np.testing.assert_allclose(f64.gram(), ref, rtol=1e-13, atol=1e-12)
    res = pca(source=a, k=5)
    np.testing.assert_allclose(res.sigma, np.linalg.svd(exact, compute_uv=False)[:5], rtol=1e-7)


def test_every_pass_records_its_rates():
    h = np.random.default_rng(0).standard_normal((30, 1000)).astype(np.float32)
    op = GradientOperator(h, block_cols=300)
    op.gram()
    op.hht(np.ones((30, 2)))
    gram, hht = op.pass_log
    assert gram["pass"] == "gram" and hht["pass"] == "hht"
    for entry, flops in ((gram, 30 * 30 * 1000), (hht, 4 * 30 * 1000 * 2)):
        assert entry["bytes_read"] == 30 * 1000 * 4
        assert entry["seconds"] > 0 and entry["read_wait"] >= 0
        assert entry["gflops"] == pytest.approx(flops / entry["seconds"] / 1e9)
        assert entry["gb_per_s"] == pytest.approx(entry["bytes_read"] / entry["seconds"] / 1e9)


def test_pca_records_rates_and_kernel_in_the_spectrum_store(tmp_path):
    h = Case("p", r=24, p=600, k=4, spectrum="power").matrix()
    lay = ParamLayout.from_shapes([("w", (600,))])
    store = GradientStore.create(tmp_path / "g.zarr", layout=lay, dtype="bfloat16", rows_per_chunk=8,
                                 cols_per_chunk=128)
    store.write_rows(0, h.astype(np.float32), {f: np.arange(24) for f in META_FIELDS})
    store.commit(24)
    res = pca(source=tmp_path / "g.zarr", k=4, out=tmp_path / "s.zarr", kernel="numpy-syrk")
    rates = res.params["rates"]
    assert [e["pass"] for e in rates] == ["gram", "project"]
    assert all(e["bytes_read"] == 24 * 600 * 2 for e in rates)  # bfloat16 on disk: 2 bytes each
    assert rates[1]["gflops"] == pytest.approx(2 * 24 * 600 * 4 / rates[1]["seconds"] / 1e9)
    saved = SpectrumStore.open(tmp_path / "s.zarr")
    # pytest >= 9 refuses approx() of nested data (a list of dicts holding strings): compare the
    # entries field by field, numbers to rounding (the JSON round trip) and the rest exactly.
    assert len(saved.params["rates"]) == len(rates) and saved.params["kernel"] == "numpy-syrk"
    for got, want in zip(saved.params["rates"], rates, strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value), key
            else:
                assert got[key] == value, key
    assert saved.accuracy["check"] == "cheap" and saved.accuracy["ok"] is True


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrow_stores_stream_as_stored_and_match_their_widened_copy_exactly(tmp_path, dtype):
    """A bfloat16/float16 store's blocks travel at 2 bytes an entry (no float32 copy of a block
    on the read thread) and are widened panel by panel: every product equals, bit for bit, the
    same pass over the float32 copy of the store cut into the same blocks and panels."""
    from gradspec.linalg._sources import StoreSource

    h = Case("p", r=40, p=900, k=5, spectrum="power").matrix()
    lay = ParamLayout.from_shapes([("w", (900,))])
    store = GradientStore.create(tmp_path / "g.zarr", layout=lay, dtype=dtype, rows_per_chunk=16,
                                 cols_per_chunk=256)
    store.write_rows(0, h.astype(np.float32), {f: np.arange(40) for f in META_FIELDS})
    store.commit(40)
    wide = GradientStore.open(tmp_path / "g.zarr").read()  # float32, exactly the stored values
    offsets = []
    # a block is valid until the next is asked for (the store reuses its buffers): check each in turn
    for off, block in StoreSource(GradientStore.open(tmp_path / "g.zarr")).iter_col_blocks(256, 1):
        offsets.append(off)
        size = block.element_size() if hasattr(block, "element_size") else block.itemsize
        assert size == 2, f"a {dtype} block travels as {block.dtype}"
        as32 = block.float().numpy() if hasattr(block, "float") else block.astype(np.float32)
        np.testing.assert_array_equal(as32, wide[:, off : off + block.shape[1]])
    assert offsets == [0, 256, 512, 768]
    q = np.random.default_rng(0).standard_normal((40, 3))
    for precision in ("float32", "float64"):
        narrow = GradientOperator(tmp_path / "g.zarr", precision=precision, kernel="torch-gemm")
        ref = GradientOperator(wide, precision=precision, kernel="torch-gemm", block_cols=256)
        assert narrow.panel_cols == ref.panel_cols
        np.testing.assert_array_equal(narrow.gram(), ref.gram())
        np.testing.assert_array_equal(narrow.hht(q), ref.hht(q))
        np.testing.assert_array_equal(narrow.rmatmat(q), ref.rmatmat(q))
