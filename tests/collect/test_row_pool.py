"""`RowPool` (the reused per-example row blocks of the Opacus adapter) and the writer's
`release`: a block is handed out again only after the writer has copied it."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from gradspec.collect._rows import RowPool
from gradspec.store import META_FIELDS, BackgroundWriter, GradientStore, ParamLayout


def test_a_given_block_of_the_shape_is_taken_again_and_others_are_new():
    pool = RowPool(keep=2)
    a = pool.take(4, 10)
    assert a.shape == (4, 10) and a.dtype == torch.float32
    pool.give(a)
    assert pool.take(4, 10).data_ptr() == a.data_ptr()
    pool.give(a)
    b = pool.take(3, 10)  # another shape: a new block, the given one stays
    assert b.data_ptr() != a.data_ptr()
    assert pool.take(4, 10).data_ptr() == a.data_ptr()


def test_at_most_keep_blocks_wait():
    pool = RowPool(keep=2)
    blocks = [pool.take(2, 5) for _ in range(3)]
    for block in blocks:
        pool.give(block)
    assert len(pool._free) == 2


def test_a_releaser_gives_its_block_back_once():
    pool = RowPool(keep=4)
    a = pool.take(2, 5)
    release = pool.releaser(a)
    release()
    release()
    assert [t.data_ptr() for t in pool._free] == [a.data_ptr()]


def _store(tmp_path) -> GradientStore:
    return GradientStore.create(tmp_path / "g.zarr", layout=ParamLayout.from_shapes([("w", (6,))]), rows_per_chunk=4)


def _meta(b: int, step: int) -> dict[str, np.ndarray]:
    return {k: np.full(b, step) for k in META_FIELDS}


@pytest.mark.parametrize("background", [True, False])
def test_the_writer_releases_rows_after_copying_them(tmp_path, background):
    store = _store(tmp_path)
    writer = BackgroundWriter(store, background=background)
    released = []
    rows = np.arange(12, dtype=np.float32).reshape(2, 6)
    writer.put(rows, _meta(2, 0), release=lambda: released.append(rows.copy()))
    writer.commit(wait=True)
    rows[:] = -1  # the caller reuses the memory: what was stored is the copy
    writer.close()
    assert len(released) == 1
    np.testing.assert_array_equal(GradientStore.open(tmp_path / "g.zarr").read(), released[0])


def _failing_writer(tmp_path, monkeypatch, *, background: bool) -> BackgroundWriter:
    """A writer whose every chunk write fails (a full disk)."""
    store = _store(tmp_path)

    def broken(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(store, "write_rows", broken)
    return BackgroundWriter(store, background=background)


def test_rows_a_failed_writer_never_writes_are_released(tmp_path, monkeypatch):
    writer = _failing_writer(tmp_path, monkeypatch, background=True)
    released = []
    for step in range(3):
        # the writer's error surfaces on a later call; a put it refuses released its rows
        with contextlib.suppress(Exception):
            writer.put(np.ones((8, 6), np.float32), _meta(8, step), release=lambda s=step: released.append(s))
    with pytest.raises(Exception, match="disk full"):
        writer.close()
    assert sorted(released) == [0, 1, 2]  # each block came back once: written-and-failed, skipped, or refused


def test_a_synchronous_writer_that_fails_releases_once(tmp_path, monkeypatch):
    """Without a thread the rows are handled inside put: a failed write releases them there,
    and put's own error path must not release them a second time."""
    writer = _failing_writer(tmp_path, monkeypatch, background=False)
    released = []
    with pytest.raises(OSError, match="disk full"):
        writer.put(np.ones((4, 6), np.float32), _meta(4, 0), release=lambda: released.append(1))
    assert released == [1]
