"""Per-chunk crc32c checksums: a changed byte in a chunk is damage on every read path.

Before checksums, one XOR-flipped byte inside a committed chunk decoded (uncompressed, or
zstd) to another plausible value: every reader returned it and `verify` said ok.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from gradspec.linalg import pca
from gradspec.store import META_FIELDS, GradientStore, ParamLayout, StoreDamagedError, open_store
from gradspec.store._checksum import checksum_summary, has_checksum
from gradspec.store._fastread import ChunkFileReader
from gradspec.store._integrity import ChunkPresence
from gradspec.store._spectrum import SpectrumStore

# (compressor, dtype): the direct chunk-file path, zarr's path (compressed), 16-bit stores
STORES = [(None, "float32"), ("zstd", "float32"), (None, "bfloat16"), ("blosc", "float16")]
IDS = ["direct-f32", "zstd-f32", "direct-bf16", "blosc-f16"]


def build(path, n=20, p=60, rpc=4, cpc=16, compressor=None, dtype="float32", per_example=False):
    lay = ParamLayout.from_shapes([("a", (p // 2,)), ("b", (p - p // 2,))])
    store = GradientStore.create(path, layout=lay, rows_per_chunk=rpc, cols_per_chunk=cpc,
                                 compressor=compressor, dtype=dtype, per_example=per_example)
    data = np.random.default_rng(0).standard_normal((n, p)).astype(np.float32)
    meta = {f: np.arange(n) for f in META_FIELDS}
    if per_example:
        meta |= {"example_index": np.arange(n), "pre_clip_norm": np.full(n, 2.0),
                 "clip_factor": np.full(n, 0.5), "param_norms": np.ones((n, 2))}
    store.append(data, meta)
    store.set_status("complete")
    return GradientStore.open(path), data


def chunk_file(store, name, coords):
    return ChunkPresence(store._arrays()[name]).path(coords)


def flip(path, at=None):
    """XOR one byte of a chunk file (its middle by default): its size stays the same."""
    raw = bytearray(Path(path).read_bytes())
    at = len(raw) // 2 if at is None else at
    raw[at] ^= 0x10
    Path(path).write_bytes(bytes(raw))


def every_reader(store):
    n = store.n_rows
    return {
        "read": lambda: store.read(),
        "read-cols": lambda: store.read(cols=slice(16, 32)),
        "strided": lambda: store.read(rows=slice(1, None, 3)),
        "listed": lambda: store.read(rows=[n - 1, 9, 2]),
        "col-blocks": lambda: [b for _, b in store.iter_col_blocks(block_cols=7)],
        "col-blocks-narrow": lambda: [b for _, b in store.iter_col_blocks(narrow=True)],
        "col-blocks-inline": lambda: [b for _, b in store.iter_col_blocks(prefetch=0)],
        "col-blocks-reused": lambda: [b.sum() for _, b in store.iter_col_blocks(block_cols=7, reuse=True)],
        "col-blocks-reused-inline": lambda: [b.sum() for _, b in store.iter_col_blocks(prefetch=0, reuse=True)],
        "row-blocks": lambda: [b for _, b in store.iter_row_blocks(block_rows=3)],
        "dask": lambda: store.to_dask().compute(),
    }


def test_every_array_a_store_creates_carries_a_checksum(tmp_path):
    store, _ = build(tmp_path / "g", dtype="float16", per_example=True)
    arrays = store._arrays()
    assert {"grads", "meta/step", "meta/clip_factor", "param_norms", "dtype_stats"} <= set(arrays)
    assert all(has_checksum(a) for a in arrays.values())
    summ = store.summary()["checksums"]
    assert summ["unchecked"] == [] and len(summ["checksummed"]) == len(arrays)
    # crc32c is the last codec, after the compressor
    zstd, _ = build(tmp_path / "z", compressor="zstd")
    codecs = json.loads((tmp_path / "z" / "grads" / "zarr.json").read_text())["codecs"]
    assert [c["name"] for c in codecs] == ["bytes", "zstd", "crc32c"]


def test_the_direct_reader_checks_the_crc_zarr_wrote(tmp_path):
    """The direct path still serves uncompressed stores, and checks the trailer zarr writes:
    the CRC-32C of the chunk's bytes, little-endian."""
    store, data = build(tmp_path / "g")
    assert store._direct is not None
    raw = Path(chunk_file(store, "grads", (1, 2))).read_bytes()
    assert len(raw) == 4 * 16 * 4 + 4
    assert raw[-4:] == google_crc32c.value(raw[:-4]).to_bytes(4, "little")
    np.testing.assert_array_equal(store.read(), data)
    np.testing.assert_array_equal(store._direct.read(0, 20, 0, 60), store._grads[:])


@pytest.mark.parametrize("compressor,dtype", STORES, ids=IDS)
def test_a_flipped_byte_in_a_gradient_chunk_is_an_error_on_every_path(tmp_path, compressor, dtype):
    store, _ = build(tmp_path / "g", compressor=compressor, dtype=dtype)
    flip(chunk_file(store, "grads", (2, 1)))  # rows 8..11, columns 16..31: every reader touches it
    for name, read in every_reader(store).items():
        with pytest.raises(StoreDamagedError, match=r"chunk grads/c/2/1, holding committed rows 8\.\.11 "
                           r"of 20, is corrupt: .*crc32c.*truncate\(8\)") as err:
            read()
        assert "\n" not in str(err.value), name
    assert store.read(rows=slice(0, 8)).shape == (8, 60)  # reads that miss the chunk still work
    rep = store.verify()
    assert not rep["ok"] and [(d["array"], d["chunk"], d["rows"]) for d in rep["damaged"]] == [
        ("grads", "c/2/1", [8, 11])]
    assert "crc32c" in rep["damaged"][0]["problem"]


@pytest.mark.parametrize("at", [0, -1, -4])
def test_a_flip_in_the_first_byte_or_the_checksum_itself_is_caught(tmp_path, at):
    store, _ = build(tmp_path / "g")
    path = chunk_file(store, "grads", (0, 0))
    flip(path, at=os.path.getsize(path) + at if at < 0 else at)
    with pytest.raises(StoreDamagedError, match=r"grads/c/0/0.*corrupt"):
        store.read()
    assert not store.verify()["ok"]


@pytest.mark.parametrize("name,coords", [("meta/step", (0,)), ("meta/loss", (0,)),
                                         ("meta/clip_factor", (0,)), ("param_norms", (0, 0)),
                                         ("dtype_stats", (0, 0))])
def test_a_flipped_byte_in_a_metadata_chunk_is_an_error(tmp_path, name, coords):
    store, _ = build(tmp_path / "g", dtype="float16", per_example=True)
    flip(chunk_file(store, name, coords), at=8)  # row 1's value (of 8-byte fields), or row 2's
    readers = {"meta/step": store.row_meta, "meta/loss": store.row_meta,
               "meta/clip_factor": store.clip_factors, "param_norms": store.param_norms,
               "dtype_stats": lambda: store.dtype_report}
    with pytest.raises(StoreDamagedError, match=rf"chunk {name}/c/{'/'.join(map(str, coords))}, .*corrupt"):
        readers[name]()
    rep = store.verify()
    assert not rep["ok"] and [d["array"] for d in rep["damaged"]] == [name]
    if name != "dtype_stats":  # `gradspec info` marks the store damaged instead of failing
        assert store.summary()["status"] == "damaged"


def test_summary_reports_a_corrupt_dtype_stats_chunk_without_failing(tmp_path):
    store, _ = build(tmp_path / "g", dtype="float16")
    flip(chunk_file(store, "dtype_stats", (0, 0)), at=8)
    summ = store.summary()
    assert summ["status"] == "damaged" and "dtype_stats/c/0/0" in summ["meta_error"]


def legacy(monkeypatch):
    """Create stores as gradspec did before checksums: no crc32c codec."""
    import gradspec.store._checksum as checksum

    monkeypatch.setattr(checksum, "checksum_codecs", lambda compressors=None: list(compressors or []) or None)


def restamp_rows(path, arrays=None):
    """Record a gradient store's row checksums (``_rowsums``) again from what ``arrays`` ("grads" or
    those beside it; all by default) hold now, as a writer that stored those values would have: for
    tests that change committed rows or their metadata with plain zarr to test what comes after
    (else every read of a changed chunk is "not this store's")."""
    import zarr

    from gradspec.store._rowsums import ROW_SUMS_ARRAY, ROW_SUMS_KEY, row_crcs, segment_crcs

    group = zarr.open_group(str(path), mode="r+")
    n = group.attrs["gradspec.rows"]
    grads, sums = group["grads"], group[ROW_SUMS_ARRAY]
    nseg = -(-grads.shape[1] // grads.chunks[1])
    new = np.asarray(sums[:n])
    if arrays is None or "grads" in arrays:
        new[:, :nseg] = segment_crcs(np.asarray(grads[:n]), grads.chunks[1])
    for t, name in enumerate(group.attrs[ROW_SUMS_KEY]["arrays"]):
        if arrays is None or name in arrays:
            new[:, nseg + t] = row_crcs(np.asarray(group[name][:n]))
    sums[:n] = new


def rewrite_row(path, i, row):
    """Store ``row`` (in the stored dtype) as row ``i`` of a gradient store with plain zarr, and its
    checksums as a writer that stored it would have (only row ``i``'s are read or written)."""
    import zarr

    from gradspec.store._rowsums import ROW_SUMS_ARRAY, segment_crcs

    group = zarr.open_group(str(path), mode="r+")
    group["grads"][i] = row
    segs = segment_crcs(np.asarray(row)[None], group["grads"].chunks[1])[0]
    sums = group[ROW_SUMS_ARRAY]
    rec = np.asarray(sums[i])
    rec[: segs.size] = segs
    sums[i] = rec


def drop_row_sums(path):
    """Make a gradient store as gradspec wrote them before row checksums (``_rowsums``): no
    ``row_crc32c`` array, and no attribute saying it has one."""
    import shutil

    import zarr

    from gradspec.store._rowsums import ROW_SUMS_ARRAY, ROW_SUMS_KEY
    from gradspec.store._zarr import update_attrs

    update_attrs(zarr.open_group(str(path), mode="r+"), {}, remove=(ROW_SUMS_KEY,))
    shutil.rmtree(Path(path) / ROW_SUMS_ARRAY)


@pytest.mark.parametrize("compressor", [None, "zstd"])
def test_a_store_written_before_checksums_opens_reads_and_says_so(tmp_path, monkeypatch, compressor):
    with monkeypatch.context() as m:
        legacy(m)
        _, data = build(tmp_path / "g", compressor=compressor)
    drop_row_sums(tmp_path / "g")  # it predates them too
    store = GradientStore.open(tmp_path / "g")
    codecs = json.loads((tmp_path / "g" / "grads" / "zarr.json").read_text())["codecs"]
    assert [c["name"] for c in codecs] == ["bytes"] + ([compressor] if compressor else [])
    assert (store._direct is not None) == (compressor is None)
    np.testing.assert_array_equal(store.read(), data)
    summ = store.summary()["checksums"]
    assert summ["checksummed"] == [] and "grads" in summ["unchecked"]
    assert store.verify()["ok"] and store.verify()["checksummed_chunks"] == 0
    if compressor is None:  # what checksums are for: this store cannot tell
        flip(chunk_file(store, "grads", (2, 1)))
        assert store.verify()["ok"]
        assert not np.array_equal(store.read(), data)


def complete_spectrum(path):
    h = np.random.default_rng(1).standard_normal((12, 128))
    res = pca(source=h, k=3, method="gram", v_dtype="float64")
    spec = SpectrumStore.create(path, r=12, p=128, k=3, method="gram", params=res.params,
                                source=res.source, source_rows=np.arange(12), v_dtype="float64",
                                v_chunk_rows=16)
    with spec.v_sink() as sink:
        sink(0, res.V)
    spec.finish(res)
    return SpectrumStore.open(path)


@pytest.mark.parametrize("name,key", [("sigma", "0"), ("U", "0/0"), ("V", "2/0"), ("source_rows", "0"),
                                      ("cumulative_explained_variance", "0")])
def test_a_flipped_byte_in_a_spectrum_chunk_is_an_error(tmp_path, name, key):
    spec = complete_spectrum(tmp_path / "s")
    assert all(has_checksum(spec._arr(n)) for n in spec._written())
    flip(tmp_path / "s" / name / "c" / key, at=9)
    reads = {"sigma": lambda: spec.sigma, "U": lambda: spec.U, "V": lambda: spec.read_v(),
             "source_rows": lambda: spec.source_rows,
             "cumulative_explained_variance": lambda: spec.array("cumulative_explained_variance")}
    with pytest.raises(StoreDamagedError, match=rf"chunk {name}/c/{key}, .*is corrupt: .*crc32c.*gradspec pca"):
        reads[name]()
    if name == "V":  # every way of reading V: blocks, and the lazy array analyses slice
        with pytest.raises(StoreDamagedError, match=r"chunk V/c/2/0"):
            list(spec.iter_v_blocks(40))
        with pytest.raises(StoreDamagedError, match=r"chunk V/c/2/0"):
            spec.V[30:40, :2]
        assert spec.V[:32, :2].shape == (32, 2) and spec.V.shape == (128, 3)
    rep = spec.verify()
    assert not rep["ok"] and [(d["array"], d["chunk"]) for d in rep["damaged"]] == [(name, f"c/{key}")]
    assert open_store(tmp_path / "s").summary()["checksums"]["unchecked"] == []


def test_checksum_summary_names_arrays_without_one(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        legacy(m)
        build(tmp_path / "g")
    drop_row_sums(tmp_path / "g")
    store = GradientStore.open(tmp_path / "g")
    assert ChunkFileReader.for_array(store._grads) is not None
    summ = checksum_summary(store._arrays())
    assert summ["codec"] == "crc32c" and summ["checksummed"] == [] and summ["arrays"] == 1 + len(META_FIELDS)
