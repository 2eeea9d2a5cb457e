"""A committed row never reads as fill: missing, truncated and foreign chunks are damage."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import zarr

from gradspec.store import (
    META_FIELDS,
    GradientStore,
    ParamLayout,
    StoreDamagedError,
    open_store,
    update_attrs,
)
from gradspec.store._integrity import ChunkPresence
from tests.store.test_checksums import drop_row_sums

# (compressor, dtype): the fast chunk-file path, zarr's path (compressed), a 16-bit store
STORES = [(None, "float32"), ("zstd", "float32"), (None, "bfloat16"), ("blosc", "float16")]
IDS = ["direct-f32", "zstd-f32", "direct-bf16", "blosc-f16"]


def build(path, n=20, p=60, rpc=4, cpc=16, compressor=None, dtype="float32", seed=0):
    lay = ParamLayout.from_shapes([("a", (p // 2,)), ("b", (p - p // 2,))])
    store = GradientStore.create(path, layout=lay, rows_per_chunk=rpc, cols_per_chunk=cpc,
                                 compressor=compressor, dtype=dtype)
    data = np.random.default_rng(seed).standard_normal((n, p)).astype(np.float32)
    store.append(data, {f: np.arange(n) for f in META_FIELDS})
    return GradientStore.open(path), data


def chunk_file(store, name, coords):
    return ChunkPresence(store._arrays()[name]).path(coords)


def every_reader(store):
    """Every way of reading the gradient rows, each forced to completion."""
    n = store.n_rows
    return {
        "read": lambda: store.read(),
        "read-cols": lambda: store.read(cols=slice(16, 32)),
        "strided": lambda: store.read(rows=slice(1, None, 3)),
        "listed": lambda: store.read(rows=[n - 1, 9, 2]),  # unordered (a repeated index is refused)
        "col-blocks": lambda: [b for _, b in store.iter_col_blocks(block_cols=7)],
        "col-blocks-ranges": lambda: [b for _, b in store.iter_col_blocks(col_ranges=[(0, 20), (40, 60)])],
        "row-blocks": lambda: [b for _, b in store.iter_row_blocks(block_rows=3)],
        "dask": lambda: store.to_dask().compute(),
    }


@pytest.mark.parametrize("compressor,dtype", STORES, ids=IDS)
def test_a_deleted_chunk_of_committed_rows_is_an_error_on_every_path(tmp_path, compressor, dtype):
    store, _ = build(tmp_path / "g", compressor=compressor, dtype=dtype)
    assert (store._direct is not None) == (compressor is None)
    os.remove(chunk_file(store, "grads", (2, 1)))  # rows 8..11, columns 16..31
    for name, read in every_reader(store).items():
        with pytest.raises(StoreDamagedError, match=r"grads/c/2/1.*rows 8\.\.11 of 20.*truncate\(8\)") as err:
            read()
        assert "\n" not in str(err.value), name
    # reads that do not touch the chunk still work
    np.testing.assert_array_equal(store.read(rows=slice(0, 8)).shape, (8, 60))
    assert store.read(cols=slice(32, 60)).shape == (20, 28)


def test_a_deleted_metadata_chunk_is_an_error(tmp_path):
    store, _ = build(tmp_path / "g")
    os.remove(chunk_file(store, "meta/loss", (0,)))
    with pytest.raises(StoreDamagedError, match="meta/loss/c/0"):
        store.row_meta()


def test_all_zero_chunks_are_stored_and_read_back(tmp_path):
    """zarr skips all-zero chunks by default; a gradient store must not (a missing chunk is damage)."""
    lay = ParamLayout.from_shapes([("w", (40,))])
    s = GradientStore.create(tmp_path / "g", layout=lay, rows_per_chunk=4, cols_per_chunk=10)
    data = np.zeros((8, 40), np.float32)
    data[:, 30:] = 1.0
    s.append(data[:4], {f: np.zeros(4) for f in META_FIELDS})  # metadata all zero too
    r = GradientStore.open(tmp_path / "g", mode="r+")  # reopened for writing: same rule
    r.append(data[4:], {f: np.zeros(4) for f in META_FIELDS})
    got = GradientStore.open(tmp_path / "g")
    assert got.find_missing_chunks() == []
    np.testing.assert_array_equal(got.read(), data)
    assert got.verify()["ok"]


def test_a_store_written_before_full_chunks_reads_absent_chunks_as_zeros_with_a_warning(tmp_path, caplog):
    store, data = build(tmp_path / "g")
    g = zarr.open_group(str(tmp_path / "g"), mode="r+")
    update_attrs(g, {}, remove=("gradspec.all_chunks",))  # as written by an older gradspec
    drop_row_sums(tmp_path / "g")  # which kept no row checksums either
    os.remove(chunk_file(store, "grads", (0, 0)))
    os.remove(chunk_file(store, "meta/epoch", (0,)))
    old = GradientStore.open(tmp_path / "g")
    with caplog.at_level(logging.WARNING, logger="gradspec.store"):
        got = old.read()
        old.read()
    assert not got[:4, :16].any() and np.array_equal(got[4:], data[4:])
    assert caplog.text.count("may be an all-zero chunk or a lost file") == 1
    old.row_meta()  # an absent metadata chunk of an old store may be all zero: no error
    summary = old.summary()
    assert summary["status"] == "writing" and [m["chunk"] for m in summary["missing_chunks"]] == ["c/0/0"]
    rep = old.verify()
    assert not rep["ok"] and rep["damaged"][0]["chunk"] == "c/0/0" and rep["absent_zero_chunks"] == 1


@pytest.mark.parametrize("compressor", [None, "zstd"])
@pytest.mark.parametrize("size", [12, "long"])
def test_a_chunk_file_of_the_wrong_size_is_an_error(tmp_path, compressor, size):
    store, _ = build(tmp_path / "g", compressor=compressor)
    path = chunk_file(store, "grads", (2, 1))  # rows 8..11, columns 16..31: every reader touches it
    if size == "long":
        with open(path, "ab") as f:
            f.write(b"\0" * 8)
    else:
        with open(path, "r+b") as f:
            f.truncate(size)
    # a compressed chunk has no fixed size, but its checksum (the last 4 bytes) no longer matches:
    # trailing bytes after a zstd frame used to decode unnoticed
    for read in every_reader(store).values():
        with pytest.raises(StoreDamagedError, match=r"damaged.*c/2/1"):
            read()
    rep = store.verify()
    assert not rep["ok"]
    assert [(d["chunk"], d["rows"]) for d in rep["damaged"]] == [("c/2/1", [8, 11])]
    problem = rep["damaged"][0]["problem"]
    assert problem.startswith(("too long" if size == "long" else "truncated") if compressor is None else "corrupt")


def test_verify_counts_non_finite_values(tmp_path):
    lay = ParamLayout.from_shapes([("w", (30,))])
    s = GradientStore.create(tmp_path / "g", layout=lay, rows_per_chunk=4, cols_per_chunk=10, dtype="bfloat16")
    data = np.ones((9, 30), np.float32)
    data[6, 3] = np.nan
    data[2, 25] = np.inf
    meta = {f: np.arange(9) for f in META_FIELDS}
    meta["loss"] = np.where(np.arange(9) == 4, np.inf, 1.0)
    meta["norm_mean"] = np.where(np.arange(9) == 5, np.nan, 1.0)  # NaN: "unknown", as recorded
    s.append(data, meta)
    rep = GradientStore.open(tmp_path / "g").verify()
    assert not rep["ok"] and rep["damaged"] == []
    assert rep["non_finite"]["grads"] == {"count": 2, "rows": [2, 6]}
    assert rep["non_finite"]["meta/loss"] == {"count": 1, "rows": [4]}
    assert "meta/norm_mean" not in rep["non_finite"]
    assert rep["chunks"] == 3 * 3 + len(META_FIELDS) + 1 + 1  # grads, metadata, dtype stats, row checksums


def test_verify_of_a_healthy_store_reads_every_byte(tmp_path):
    store, _ = build(tmp_path / "g", n=10)
    rep = store.verify()
    assert rep["ok"] and rep["chunks"] == 3 * 4 + len(META_FIELDS) + 1  # grads, metadata, row checksums
    grads = 3 * 4 * (4 * 16 * 4)  # 3 x 4 chunks of 4 x 16 float32
    crc = 4 * rep["chunks"]  # each chunk file ends with its crc32c, read and checked
    row_sums = 4096 * (4 + len(META_FIELDS)) * 4  # 4,096 rows of a uint32 per column chunk and per meta array
    assert rep["bytes"] == grads + sum(4096 * np.dtype(dt).itemsize for dt in META_FIELDS.values()) + row_sums + crc
    assert rep["checksummed_chunks"] == rep["chunks"]


def test_summary_does_not_claim_complete_when_a_chunk_is_missing(tmp_path):
    store, _ = build(tmp_path / "g")
    GradientStore.open(tmp_path / "g", mode="r+").set_status("complete")
    assert open_store(tmp_path / "g").summary()["status"] == "complete"
    os.remove(chunk_file(store, "grads", (4, 3)))
    os.remove(chunk_file(store, "meta/step", (0,)))
    summary = open_store(tmp_path / "g").summary()
    assert summary["status"] == "damaged" and summary["recorded_status"] == "complete"
    assert {m["array"] + "/" + m["chunk"] for m in summary["missing_chunks"]} == {"grads/c/4/3", "meta/step/c/0"}
    assert summary["rows"] == {} and "meta/step/c/0" in summary["meta_error"]


def test_a_store_is_not_marked_complete_with_a_chunk_missing(tmp_path):
    store, _ = build(tmp_path / "g")
    os.remove(chunk_file(store, "grads", (0, 0)))
    w = GradientStore.open(tmp_path / "g", mode="r+")
    with pytest.raises(StoreDamagedError, match="c/0/0"):
        w.set_status("complete")
    assert GradientStore.open(tmp_path / "g").status == "writing"


def test_rows_whose_chunks_were_not_written_are_not_committed(tmp_path):
    lay = ParamLayout.from_shapes([("w", (30,))])
    s = GradientStore.create(tmp_path / "g", layout=lay, rows_per_chunk=4, cols_per_chunk=10)
    s.append(np.ones((4, 30), np.float32), {f: np.arange(4) for f in META_FIELDS})
    s.write_rows(4, np.ones((4, 30), np.float32), {f: np.arange(4) for f in META_FIELDS})
    os.remove(chunk_file(s, "grads", (1, 2)))  # a write that never landed
    with pytest.raises(StoreDamagedError, match="c/1/2"):
        s.commit(8)
    assert GradientStore.open(tmp_path / "g").n_rows == 4


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda g: update_attrs(g, {"gradspec.rows": 40}), "40 rows are committed but grads holds only"),
        (lambda g: update_attrs(g, {"gradspec.rows": -1}), "not an integer >= 0"),
        (lambda g: update_attrs(g, {"gradspec.rows": 2.5}), "not an integer >= 0"),
        (lambda g: update_attrs(g, {"gradspec.layout": [{"name": "a", "shape": [7], "offset": 0, "numel": 7}]}),
         r"shape \(20, 60\) but its parameter layout has p = 7"),
        (lambda g: update_attrs(g, {"gradspec.layout": []}), "no valid parameter layout"),
        (lambda g: update_attrs(g, {"gradspec.dtype": "float16"}), "stored as float32 but the store says float16"),
        (lambda g: update_attrs(g, {"gradspec.dtype": "int8"}), "not one of float32"),
        (lambda g: g["meta"].__delitem__("loss"), "no array 'meta/loss'"),
        (lambda g: update_attrs(g, {"gradspec.format": "1x"}), "not a format number"),
    ],
    ids=["rows>capacity", "negative-rows", "float-rows", "layout-p", "empty-layout", "dtype", "bad-dtype",
         "no-meta", "format"],
)
def test_inconsistent_attributes_are_refused_at_open(tmp_path, edit, match):
    build(tmp_path / "g")
    edit(zarr.open_group(str(tmp_path / "g"), mode="r+"))
    with pytest.raises((ValueError, StoreDamagedError), match=match):
        GradientStore.open(tmp_path / "g")


def test_unknown_status_words_are_refused(tmp_path):
    build(tmp_path / "g")
    w = GradientStore.open(tmp_path / "g", mode="r+")
    with pytest.raises(ValueError, match="unknown store status 'done'; choose one of writing, complete"):
        w.set_status("done")
    w.set_status("complete")
    assert GradientStore.open(tmp_path / "g").status == "complete"


def test_a_reader_refreshes_its_arrays_with_the_row_count(tmp_path):
    """A reader opened early must not read a grown store through its old, smaller shape."""
    lay = ParamLayout.from_shapes([("w", (30,))])
    w = GradientStore.create(tmp_path / "g", layout=lay, rows_per_chunk=4, cols_per_chunk=10, compressor="zstd")
    w.append(np.ones((4, 30), np.float32), {f: np.arange(4) for f in META_FIELDS})
    r = GradientStore.open(tmp_path / "g")
    w.append(np.full((40, 30), 2, np.float32), {f: np.arange(40) for f in META_FIELDS})
    r.refresh()
    assert r.n_rows == 44
    np.testing.assert_array_equal(r.read()[4:], 2)


def test_chunk_listing_of_a_store_that_is_not_on_local_disk():
    """Remote stores are listed (once per read) instead of stat'ed."""
    from zarr.storage import MemoryStore

    g = zarr.open_group(store=MemoryStore(), mode="w")
    arr = g.create_array("grads", shape=(8, 6), chunks=(4, 3), dtype="float32", fill_value=0)
    arr.with_config({"write_empty_chunks": True})[:] = 0
    pres = ChunkPresence(arr)
    zarr.core.sync.sync(arr.store_path.store.delete("grads/c/1/1"))
    assert not pres.local and pres.missing([(0, 0), (1, 1)]) == [(1, 1)]
    arr.with_config({"write_empty_chunks": True})[4:8, 3:6] = 1
    assert pres.missing([(1, 1)]) == []  # written after the listing: listed again before it is called missing
    zarr.core.sync.sync(arr.store_path.store.delete("grads/c/0/0"))
    pres.forget()  # what every read does first
    assert pres.missing([(0, 0), (1, 1)]) == [(0, 0)]
