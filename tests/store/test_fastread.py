"""Direct chunk-file reads equal zarr's own reads, and are used only where they apply."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradspec.store import META_FIELDS, GradientStore, ParamLayout
from gradspec.store._fastread import ChunkFileReader


def build(path, n, p, rpc, cpc, dtype="float32", compressor=None, seed=0):
    lay = ParamLayout.from_shapes([("w", (p,))])
    store = GradientStore.create(
        path, layout=lay, rows_per_chunk=rpc, cols_per_chunk=cpc, dtype=dtype, compressor=compressor
    )
    data = np.random.default_rng(seed).standard_normal((n, p)).astype(np.float32)
    store.append(data, {f: np.arange(n) for f in META_FIELDS})
    return GradientStore.open(path), data


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 40),
    p=st.integers(1, 90),
    rpc=st.integers(1, 9),
    cpc=st.integers(1, 30),
    sel=st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 90), st.integers(0, 90)),
)
def test_direct_reads_equal_zarr(tmp_path_factory, n, p, rpc, cpc, sel):
    store, data = build(tmp_path_factory.mktemp("s") / "g", n, p, rpc, cpc)
    assert store._direct is not None
    r0, r1 = sorted((min(sel[0], n), min(sel[1], n)))
    c0, c1 = sorted((min(sel[2], p), min(sel[3], p)))
    if c0 == c1:
        c1 = min(p, c0 + 1)
        c0 = c1 - 1
    direct = store._direct.read(r0, r1, c0, c1)
    np.testing.assert_array_equal(direct, np.asarray(store._grads[r0:r1, c0:c1]))
    np.testing.assert_array_equal(direct, data[r0:r1, c0:c1])
    blocks = np.concatenate([b for _, b in store.iter_col_blocks(block_cols=7)], axis=1)
    np.testing.assert_array_equal(blocks, data)
    listed = np.random.default_rng(n + p).integers(0, n, size=5)  # any order, with repeats
    np.testing.assert_array_equal(store._direct.read_rows(listed, c0, c1), data[listed, c0:c1])
    if r0 < n:
        np.testing.assert_array_equal(store.read(rows=slice(r0, None, 3)), data[r0::3])
    else:  # a selection of no rows is an error (gradspec.store.resolve_rows), never an empty read
        with pytest.raises(ValueError, match="selects no rows"):
            store.read(rows=slice(r0, None, 3))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_direct_reads_of_16_bit_stores(tmp_path, dtype):
    store, data = build(tmp_path / "g", 10, 50, 4, 16, dtype=dtype)
    assert store._direct is not None
    via_zarr = GradientStore.open(tmp_path / "g")
    via_zarr._direct = None
    np.testing.assert_array_equal(store.read(), via_zarr.read())
    np.testing.assert_allclose(store.read(), data, rtol=1e-2, atol=1e-2)


def test_a_missing_chunk_goes_to_on_damage(tmp_path):
    """The reader asks its caller; the gradient store raises (tests/store/test_integrity.py)."""
    import os

    store, _ = build(tmp_path / "g", 8, 20, 4, 10)
    os.remove(store._direct._path(1, 1))
    with pytest.raises(OSError, match=r"c/1/1.*rows 4\.\.7.*missing"):
        store._direct.read(0, 8, 0, 20)
    heard = []
    lenient = ChunkFileReader.for_array(store._grads, on_damage=lambda i, j, problem: heard.append((i, j, problem)))
    got = lenient.read(0, 8, 0, 20)  # a callback that returns reads the chunk as fill
    assert heard == [(1, 1, "missing")]
    assert not got[4:8, 10:20].any() and got[:4].any()


def test_a_truncated_chunk_is_an_error(tmp_path):
    store, _ = build(tmp_path / "g", 8, 20, 4, 10)
    with open(store._direct._path(0, 0), "r+b") as f:
        f.truncate(12)
    with pytest.raises(OSError, match="damaged"):
        store.read()


def test_compressed_stores_use_zarr(tmp_path):
    store, data = build(tmp_path / "g", 6, 40, 3, 8, compressor="zstd")
    assert store._direct is None and ChunkFileReader.for_array(store._grads) is None
    np.testing.assert_array_equal(store.read(), data)


@pytest.mark.parametrize("prefetch", [0, 1, 2])
@pytest.mark.parametrize("rows", [None, slice(3, 37, 2), np.array([30, 2, 5, 11])])
def test_reused_block_buffers_hold_each_block_until_the_next_is_asked_for(tmp_path, prefetch, rows):
    """``iter_col_blocks(reuse=True)`` reads a direct store into a ring of prefetch + 1 buffers
    (a fresh array a block cost more in page faults than the read): each block, checked before
    the next is asked for, equals the data, including a narrower last block; the ring's buffers
    really are reused; and without ``reuse`` every block is its own array."""
    store, data = build(tmp_path / "g", 40, 100, 8, 16)
    assert store._direct is not None
    want = data if rows is None else data[rows]
    seen, bases = [], []
    for off, block in store.iter_col_blocks(rows=rows, block_cols=32, prefetch=prefetch, reuse=True):
        np.testing.assert_array_equal(block, want[:, off : off + block.shape[1]])
        seen.append((off, block.shape[1]))
        bases.append(block.base if block.base is not None else block)
    assert seen == [(0, 32), (32, 32), (64, 32), (96, 4)]
    n = prefetch + 1
    assert len({id(b) for b in bases}) == min(n, len(bases))  # the ring, not a buffer a block
    for i in range(n, len(bases)):
        assert np.shares_memory(bases[i], bases[i - n])
    fresh = [b for _, b in store.iter_col_blocks(rows=rows, block_cols=32, prefetch=prefetch)]
    np.testing.assert_array_equal(np.concatenate(fresh, axis=1), want)  # kept whole: not reused
