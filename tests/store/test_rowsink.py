"""The chunk-aligned write-behind writer of V."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from gradspec.store._rowsink import RowBlockWriter


def make_array(tmp_path, n=100, k=3, chunk=16):
    return zarr.create_array(
        store=str(tmp_path / "a.zarr"), shape=(n, k), chunks=(chunk, k), dtype="float32", fill_value=0
    )


def test_rows_land_once_per_chunk(tmp_path, monkeypatch):
    arr = make_array(tmp_path)
    v = np.random.default_rng(0).standard_normal((100, 3)).astype(np.float32)
    writes = []
    real = type(arr).__setitem__

    def counting(self, key, value):
        writes.append((key.start, key.stop))
        real(self, key, value)

    monkeypatch.setattr(type(arr), "__setitem__", counting)
    with RowBlockWriter(arr) as w:
        for a in range(0, 100, 7):  # unaligned with the 16-row chunks
            w(a, v[a : a + 7])
    assert sorted(writes) == [(c, min(c + 16, 100)) for c in range(0, 100, 16)]
    np.testing.assert_array_equal(arr[:], v)


def test_flush_writes_incomplete_chunks(tmp_path):
    arr = make_array(tmp_path)
    w = RowBlockWriter(arr)
    w(3, np.ones((2, 3), np.float32))
    w.flush()
    expect = np.zeros((100, 3), np.float32)
    expect[3:5] = 1
    np.testing.assert_array_equal(arr[:], expect)
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w(0, np.ones((1, 3), np.float32))


def test_a_failed_write_is_raised_and_abort_drops_pending(tmp_path, monkeypatch):
    arr = make_array(tmp_path)

    def failing(self, key, value):
        raise OSError("disk full")

    monkeypatch.setattr(type(arr), "__setitem__", failing)
    w = RowBlockWriter(arr)
    w(0, np.ones((16, 3), np.float32))
    with pytest.raises(OSError, match="disk full"):
        w.flush()
    w.abort()
    monkeypatch.undo()
    assert not arr[:].any()


def test_bad_rows_are_refused(tmp_path):
    with RowBlockWriter(make_array(tmp_path)) as w:
        with pytest.raises(ValueError, match="do not fit"):
            w(95, np.ones((10, 3), np.float32))
        with pytest.raises(ValueError, match="do not fit"):
            w(0, np.ones((10, 4), np.float32))
