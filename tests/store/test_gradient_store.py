"""The gradient store: round trips, selections, metadata, errors."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradspec.store import META_FIELDS, BackgroundWriter, GradientStore, ParamLayout, open_store


def meta(b: int, start: int = 0) -> dict[str, np.ndarray]:
    m = {k: np.arange(start, start + b) for k in META_FIELDS}
    m["loss"] = np.linspace(0, 1, b)
    return m


def layout(p: int = 300) -> ParamLayout:
    return ParamLayout.from_shapes([("w", (p // 3, 2)), ("b", (p - 2 * (p // 3),))])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    rows_per_chunk=st.integers(1, 8),
    cols_per_chunk=st.integers(7, 400),
    commit_each=st.booleans(),
    background=st.booleans(),
)
def test_round_trip_any_chunking(tmp_path_factory, sizes, rows_per_chunk, cols_per_chunk, commit_each, background):
    """Whatever the chunking and the batching of writes, what is read is what was written."""
    path = tmp_path_factory.mktemp("s") / "g.zarr"
    lay = layout(300)
    store = GradientStore.create(path, layout=lay, rows_per_chunk=rows_per_chunk, cols_per_chunk=cols_per_chunk)
    rng = np.random.default_rng(len(sizes))
    data = rng.standard_normal((sum(sizes), lay.p)).astype(np.float32)
    w = BackgroundWriter(store, background=background, max_queue=3)
    start = 0
    for b in sizes:
        w.put(data[start : start + b], meta(b, start))
        start += b
        if commit_each:
            w.commit()
    w.close()
    s = GradientStore.open(path)
    assert s.shape == data.shape
    np.testing.assert_array_equal(s.read(), data)
    # column blocks over a strided row selection, with prefetch (a selection of no rows,
    # as this one is of a one-row store, is an error: see test_row_selection_is_strict)
    sel = slice(1, None, 2) if data.shape[0] > 1 else slice(0, 1)
    got = np.concatenate([blk for _, blk in s.iter_col_blocks(rows=sel, prefetch=2)], axis=1)
    np.testing.assert_array_equal(got, data[sel])
    got = np.concatenate([blk for _, blk in s.iter_row_blocks(block_rows=3)], axis=0)
    np.testing.assert_array_equal(got, data)
    np.testing.assert_array_equal(s.row_meta()["step"], np.arange(data.shape[0]))


@pytest.mark.parametrize("dtype,atol", [("float32", 0), ("float16", 1e-3), ("bfloat16", 8e-3)])
def test_dtypes(tmp_path, dtype, atol):
    lay = layout(120)
    data = np.random.default_rng(1).uniform(-1, 1, (5, lay.p)).astype(np.float32)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, dtype=dtype)
    s.append(data, meta(5))
    r = GradientStore.open(tmp_path / "g.zarr")
    assert r.dtype == dtype
    got = r.read()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, data, atol=atol, rtol=0)
    if dtype == "bfloat16":  # stored as the raw 16 bits: exactly torch's rounding
        import torch

        np.testing.assert_array_equal(got, torch.from_numpy(data).bfloat16().float().numpy())
    np.testing.assert_allclose(r.to_dask().compute(), got)


def test_parameter_subset_is_column_ranges(tmp_path):
    lay = ParamLayout.from_shapes([("a.query.weight", (4, 5)), ("a.key.weight", (4, 5)), ("a.value.weight", (3,))])
    data = np.arange(3 * lay.p, dtype=np.float32).reshape(3, lay.p)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, cols_per_chunk=7)
    s.append(data, meta(3))
    ranges = s.layout.column_ranges(["*.query.weight", "*.value.weight"])
    assert ranges == [(0, 20), (40, 43)]
    got = np.concatenate([b for _, b in s.iter_col_blocks(col_ranges=ranges)], axis=1)
    np.testing.assert_array_equal(got, np.concatenate([data[:, 0:20], data[:, 40:43]], axis=1))
    got = np.concatenate([b for _, b in s.iter_row_blocks(col_ranges=ranges, block_rows=2)])
    np.testing.assert_array_equal(got, np.concatenate([data[:, 0:20], data[:, 40:43]], axis=1))
    with pytest.raises(ValueError, match="no parameter matches"):
        s.layout.column_ranges("*.nothing")


def test_uncommitted_rows_are_invisible(tmp_path):
    lay = layout(60)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, rows_per_chunk=4)
    s.append(np.ones((3, lay.p), np.float32), meta(3))
    s.write_rows(3, np.full((5, lay.p), 7, np.float32), meta(5, 3))  # written, not committed
    r = GradientStore.open(tmp_path / "g.zarr")
    assert r.n_rows == 3
    np.testing.assert_array_equal(r.read(), 1)
    with pytest.raises(ValueError, match="committed rows"):
        r.read(rows=[0, 5])
    # resume: the uncommitted rows are overwritten
    w = GradientStore.open(tmp_path / "g.zarr", mode="r+")
    w.append(np.full((2, lay.p), 2, np.float32), meta(2, 3))
    np.testing.assert_array_equal(GradientStore.open(tmp_path / "g.zarr").read()[3:], 2)


def test_row_selection_is_strict(tmp_path):
    """The store reads rows by gradspec.store.resolve_rows, the rule of pca --rows and decay
    --heldout-rows: before, a slice past the end was clipped, a repeated index read twice,
    float indices truncated and an empty selection read as zero rows, all without a word."""
    lay = layout(60)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, rows_per_chunk=4)
    data = np.arange(10 * lay.p, dtype=np.float32).reshape(10, lay.p)
    s.append(data, meta(10))
    r = GradientStore.open(tmp_path / "g.zarr")
    for rows, message in [
        (slice(0, 12), r"the row selection 0:12 lies outside the 10 committed rows \(valid bounds are 0\.\.10\)"),
        (slice(-11, None), r"-11: lies outside the 10 committed rows"),
        ([3, 10], r"has row index 10 outside the 10 committed rows \[0, 10\)"),
        ([-1], r"row index -1 outside"),
        ([2, 5, 2], r"repeats row index 2 \(1 repeats\): a row would count twice in the rows read"),
        (slice(4, 4), r"4:4 selects no rows of the 10 committed rows"),
        ([], r"\[\] selects no rows"),
        (np.array([1.0, 2.0]), r"indices must be integers"),
        (np.ones(10, bool), r"boolean mask"),
        (slice(0, 5, -1), r"needs a positive step"),
    ]:
        for read in (r.read, r.row_meta, lambda rows: next(r.iter_col_blocks(rows=rows)), r.n_selected):
            with pytest.raises(ValueError, match=message):
                read(rows)
    # what is valid reads as numpy indexing would, in the order given
    for rows in (None, slice(2, 9, 3), slice(-3, None), [7, 1, 4], np.array([0]), slice(0, 10)):
        want = data if rows is None else data[rows]
        np.testing.assert_array_equal(r.read(rows=rows), want)
        np.testing.assert_array_equal(r.row_meta(rows)["step"], want[:, 0] // lay.p)
        assert r.n_selected(rows) == want.shape[0]
    empty = GradientStore.create(tmp_path / "e.zarr", layout=lay)
    assert GradientStore.open(tmp_path / "e.zarr").read().shape == (0, lay.p)  # all of no rows
    assert empty.row_meta()["step"].size == 0


def test_open_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no gradients store"):
        GradientStore.open(tmp_path / "missing.zarr")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a gradspec store"):
        GradientStore.open(tmp_path / "plain")
    zarr.open_group(str(tmp_path / "other.zarr"), mode="w").attrs["x"] = 1
    with pytest.raises(ValueError, match="not a gradspec store"):
        open_store(tmp_path / "other.zarr")
    g = zarr.open_group(str(tmp_path / "spec.zarr"), mode="w")
    g.attrs.update({"gradspec.kind": "spectrum", "gradspec.format": 1})
    with pytest.raises(ValueError, match="is a spectrum store, not a gradients store"):
        GradientStore.open(tmp_path / "spec.zarr")
    s = GradientStore.create(tmp_path / "g.zarr", layout=layout(30))
    with pytest.raises(FileExistsError, match="--overwrite"):
        GradientStore.create(tmp_path / "g.zarr", layout=layout(30))
    with pytest.raises(ValueError, match="shape"):
        s.append(np.zeros((2, 31), np.float32), meta(2))
    with pytest.raises(ValueError, match="read-only"):
        GradientStore.open(tmp_path / "g.zarr").append(np.zeros((1, 30), np.float32), meta(1))


def test_writer_reports_failure_and_keeps_committed_rows(tmp_path):
    """A write that fails (as on a full disk) surfaces in the caller; committed rows stay."""
    lay = layout(60)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, rows_per_chunk=2)
    w = BackgroundWriter(s)
    w.put(np.ones((2, lay.p), np.float32), meta(2))
    w.commit(wait=True)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    s.write_rows = broken  # the next flush fails like a full disk
    w.put(np.ones((2, lay.p), np.float32), meta(2))
    with pytest.raises(OSError, match="No space left on device.*2 rows were committed before it"):
        w.close()
    assert GradientStore.open(tmp_path / "g.zarr").n_rows == 2


def test_summary_while_writing(tmp_path):
    lay = layout(60)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, config={"task": "t"})
    s.append(np.ones((4, lay.p), np.float32), meta(4))
    info = open_store(tmp_path / "g.zarr").summary()
    assert info["status"] == "writing" and info["shape"] == [4, 60]
    assert info["rows"]["steps"] == [0, 3] and info["size_on_disk"] > 4 * 60 * 4


def test_arrays_of_unequal_capacity_after_a_kill_between_resizes(tmp_path):
    """A kill between resizing the row array and the metadata arrays must not lose metadata."""
    lay = layout(30)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, rows_per_chunk=4)
    s.append(np.zeros((4, lay.p), np.float32), meta(4))
    s._grads.resize((64, lay.p))  # as if killed right after the first of the resizes
    w = GradientStore.open(tmp_path / "g.zarr", mode="r+")
    w.append(np.ones((10, lay.p), np.float32), meta(10, 4))
    r = GradientStore.open(tmp_path / "g.zarr")
    np.testing.assert_array_equal(r.row_meta()["step"], np.arange(14))


def test_the_writer_queue_bounds_rows_and_bytes_not_hand_offs(tmp_path):
    """A batch of per-example rows counts each row: at most max_queue rows (or max_bytes)
    wait for the thread, yet one batch larger than the bound still goes through."""
    import threading
    import time

    lay = layout(300)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, rows_per_chunk=4)
    gate = threading.Event()
    real_write = s.write_rows

    def slow(*args, **kwargs):
        gate.wait()  # the disk stalls until the caller has tried to queue too much
        return real_write(*args, **kwargs)

    s.write_rows = slow
    w = BackgroundWriter(s, max_queue=10, max_bytes=10**9)
    data = np.arange(40 * lay.p, dtype=np.float32).reshape(40, lay.p)
    peak = []
    done = threading.Event()

    def producer():
        for i in range(5):  # 5 batches of 8 rows: 8 fit, 16 would not
            w.put(data[8 * i : 8 * i + 8], meta(8, 8 * i))
            peak.append(w.waiting[0])
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    time.sleep(0.5)
    assert not done.is_set()  # blocked on the second batch, not 64 hand-offs later
    assert max(peak) <= 10
    gate.set()
    t.join(10)
    w.close()
    np.testing.assert_array_equal(GradientStore.open(tmp_path / "g.zarr").read(), data)
    assert w.waiting == (0, 0)
    # bytes: one 30-row batch exceeds a 1 kB budget but enters the empty queue
    s2 = GradientStore.create(tmp_path / "h.zarr", layout=lay, rows_per_chunk=4)
    w2 = BackgroundWriter(s2, max_queue=64, max_bytes=1000)
    w2.put(data[:30], meta(30))
    w2.put(data[30:], meta(10))
    w2.close()
    np.testing.assert_array_equal(GradientStore.open(tmp_path / "h.zarr").read(), data)


def test_row_metadata_is_written_once_per_commit_not_per_row_chunk(tmp_path, monkeypatch):
    """Each meta/* array (thousands of rows a chunk) used to be rewritten with every row chunk of
    grads: a read-modify-write per array per chunk, as costly as the gradient bytes at p ~ 1e5.
    Now their rows are held until the commit and written in one piece per array."""
    lay = layout(60)
    s = GradientStore.create(tmp_path / "g.zarr", layout=lay, rows_per_chunk=4)
    calls: dict[str, int] = {}
    real = zarr.Array.__setitem__

    def counted(self, key, value):
        calls[self.path] = calls.get(self.path, 0) + 1
        return real(self, key, value)

    monkeypatch.setattr(zarr.Array, "__setitem__", counted)
    data = np.arange(24 * lay.p, dtype=np.float32).reshape(24, lay.p)
    for i in range(6):  # six row chunks, then one commit
        s.write_rows(4 * i, data[4 * i : 4 * i + 4], meta(4, 4 * i))
    assert calls.get("grads") == 6 and not any(k.startswith("meta/") for k in calls)
    s.commit(24)
    assert {k: v for k, v in calls.items() if k.startswith("meta/")} == {f"meta/{k}": 1 for k in META_FIELDS}
    monkeypatch.undo()
    r = GradientStore.open(tmp_path / "g.zarr")
    np.testing.assert_array_equal(r.read(), data)
    want = {k: np.concatenate([meta(4, 4 * i)[k] for i in range(6)]) for k in META_FIELDS}
    for k, v in r.row_meta().items():
        np.testing.assert_array_equal(v, want[k].astype(v.dtype))  # loss is stored as float32
    # rows written but never committed are dropped with their held metadata, not written later
    s.write_rows(24, data[:4], meta(4, 100))
    s.finalize()
    s.commit(24)
    assert GradientStore.open(tmp_path / "g.zarr").n_rows == 24
    np.testing.assert_array_equal(GradientStore.open(tmp_path / "g.zarr").row_meta()["step"], want["step"])
