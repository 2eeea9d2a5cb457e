"""Row checksums: a gradient chunk copied from another store, or moved within one, is damage.

Before them, a chunk file copied in from another store of the same chunking (or two chunk files
swapped) carried its own valid CRC-32C: every reader returned another run's gradients with no
error, and `verify` said ok.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from gradspec.store import META_FIELDS, GradientStore, ParamLayout, StoreDamagedError
from gradspec.store._checksum import raw_matches
from gradspec.store._rowsums import ROW_SUMS_ARRAY, Shift, row_crcs, segment_crcs
from tests.store.test_checksums import IDS, STORES, chunk_file, drop_row_sums, every_reader

N, P, RPC, CPC = 20, 60, 4, 16  # 5 row chunks x 4 column chunks, the last 12 columns wide


def make(path, seed=0, n=N, compressor=None, dtype="float32", commit=True):
    lay = ParamLayout.from_shapes([("a", (P // 2,)), ("b", (P - P // 2,))])
    store = GradientStore.create(path, layout=lay, rows_per_chunk=RPC, cols_per_chunk=CPC,
                                 compressor=compressor, dtype=dtype)
    data = np.random.default_rng(seed).standard_normal((n, P)).astype(np.float32)
    store.write_rows(0, data, {f: np.arange(n) for f in META_FIELDS})
    if commit:
        store.commit(n)
    return store, data


def swap(a, b):
    ta, tb = Path(a).read_bytes(), Path(b).read_bytes()
    Path(a).write_bytes(tb)
    Path(b).write_bytes(ta)


def raises_foreign(read, chunk, rows):
    with pytest.raises(StoreDamagedError, match=rf"chunk grads/c/{chunk}, holding committed rows {rows} of "
                       r"\d+, is not this store's: its own checksum holds") as err:
        read()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_chunk_file_ends_with_the_fold_of_its_rows_recorded_checksums(tmp_path, dtype):
    store, data = make(tmp_path / "g", n=22, dtype=dtype)  # rows 20, 21: a partial row chunk
    both = store._read_array(ROW_SUMS_ARRAY, slice(0, 22))
    small = store._row_sums.small
    assert both.shape == (22, 4 + len(small)) and both.dtype == np.uint32
    assert list(small) == sorted([f"meta/{f}" for f in META_FIELDS] + (["dtype_stats"] if dtype != "float32" else []))
    rec = both[:, :4]
    # after the segments, each row's CRC in each array beside grads, as stored
    for t, name in enumerate(small):
        np.testing.assert_array_equal(both[:, 4 + t], row_crcs(np.asarray(store._arrays()[name][:22])))
    disk = np.asarray(store._grads[:22])
    # a row's segment: its bytes in one column chunk, the last one padded with zeros as stored
    last = np.concatenate([disk[3, 48:], np.zeros(4, dtype=disk.dtype)])
    assert rec[3, 3] == google_crc32c.value(last.tobytes())
    assert rec[5, 1] == google_crc32c.value(disk[5, 16:32].tobytes())
    np.testing.assert_array_equal(segment_crcs(disk, CPC), rec)
    shift = Shift(CPC * disk.dtype.itemsize)
    for i in range(5):
        for j in range(4):
            raw = Path(chunk_file(store, "grads", (i, j))).read_bytes()
            want = shift.fold(rec[i * RPC : (i + 1) * RPC, j : j + 1])[0]
            assert int.from_bytes(raw[-4:], "little") == want, (i, j)


@pytest.mark.parametrize("compressor,dtype", STORES, ids=IDS)
def test_a_chunk_copied_from_another_store_is_damage_on_every_path(tmp_path, compressor, dtype):
    store, _ = make(tmp_path / "g", compressor=compressor, dtype=dtype)
    other, _ = make(tmp_path / "o", seed=1, compressor=compressor, dtype=dtype)
    for read in every_reader(store).values():  # a healthy store reads on every path
        read()
    assert store.verify()["ok"]
    first = store.read(rows=slice(0, 8))
    src, dst = chunk_file(other, "grads", (2, 1)), chunk_file(store, "grads", (2, 1))
    shutil.copy(src, dst)
    assert raw_matches(Path(dst).read_bytes())  # what the chunk's own checksum cannot tell
    store = GradientStore.open(tmp_path / "g")
    for read in every_reader(store).values():
        raises_foreign(read, "2/1", r"8\.\.11")
    np.testing.assert_array_equal(store.read(rows=slice(0, 8)), first)  # reads that miss it still work
    rep = store.verify()
    assert not rep["ok"] and [(d["chunk"], d["rows"]) for d in rep["damaged"]] == [("c/2/1", [8, 11])]
    assert rep["damaged"][0]["problem"].startswith("not this store's")


@pytest.mark.parametrize("compressor,dtype", STORES, ids=IDS)
@pytest.mark.parametrize("cols", [(20, 30), (5, 40), (16, 17)], ids=["inside-one-chunk", "across", "one-column"])
def test_a_read_of_part_of_a_copied_chunk_is_damage(tmp_path, compressor, dtype, cols):
    """A column slice (pca --params) that covers a chunk only partly: the chunk is checked whole
    (found by review: a zstd store's copied chunk read through --params was unchecked, exit 0)."""
    store, data = make(tmp_path / "g", compressor=compressor, dtype=dtype)
    other, _ = make(tmp_path / "o", seed=1, compressor=compressor, dtype=dtype)
    good = store.read(rows=slice(0, 20), cols=slice(*cols))
    shutil.copy(chunk_file(other, "grads", (2, 1)), chunk_file(store, "grads", (2, 1)))
    store = GradientStore.open(tmp_path / "g")
    raises_foreign(lambda: store.read(rows=slice(0, 20), cols=slice(*cols)), "2/1", r"8\.\.11")
    np.testing.assert_array_equal(store.read(rows=slice(0, 8), cols=slice(*cols)), good[:8])


def test_two_chunks_swapped_within_a_store_are_both_damage(tmp_path):
    store, _ = make(tmp_path / "g")
    swap(chunk_file(store, "grads", (0, 0)), chunk_file(store, "grads", (3, 2)))
    store = GradientStore.open(tmp_path / "g")
    raises_foreign(store.read, "0/0", r"0\.\.3")
    raises_foreign(lambda: store.read(rows=slice(12, 16)), "3/2", r"12\.\.15")
    assert [d["chunk"] for d in store.verify()["damaged"]] == ["c/0/0", "c/3/2"]


def test_the_partial_last_chunk_is_checked_and_rows_not_committed_never_alarm(tmp_path):
    store, data = make(tmp_path / "g", n=22)
    # two rows written after the commit, never committed (a run killed before its commit): the
    # chunk holding committed rows 20, 21 is rewritten with them
    more = np.random.default_rng(5).standard_normal((2, P)).astype(np.float32)
    store.write_rows(22, more, {f: np.arange(2) for f in META_FIELDS})
    again = GradientStore.open(tmp_path / "g")
    assert again.n_rows == 22 and again.verify()["ok"]
    np.testing.assert_array_equal(again.read(), data)
    other, _ = make(tmp_path / "o", seed=1, n=22)
    shutil.copy(chunk_file(other, "grads", (5, 0)), chunk_file(store, "grads", (5, 0)))
    again = GradientStore.open(tmp_path / "g")
    raises_foreign(again.read, "5/0", r"20\.\.21")
    assert [d["chunk"] for d in again.verify()["damaged"]] == ["c/5/0"]


def test_rows_rewritten_after_a_truncate_read_back_in_the_same_store_object(tmp_path):
    store, data = make(tmp_path / "g")
    np.testing.assert_array_equal(store.read(), data)  # the recorded checksums are loaded
    store.truncate(10)
    new = np.random.default_rng(7).standard_normal((10, P)).astype(np.float32)
    store.write_rows(10, new, {f: np.arange(10) for f in META_FIELDS})
    store.commit(20)
    want = np.concatenate([data[:10], new])
    np.testing.assert_array_equal(store.read(), want)
    np.testing.assert_array_equal(GradientStore.open(tmp_path / "g").read(), want)
    assert GradientStore.open(tmp_path / "g").verify()["ok"]


def test_a_store_written_before_row_checksums_reads_and_says_so(tmp_path):
    store, data = make(tmp_path / "g")
    drop_row_sums(tmp_path / "g")
    old = GradientStore.open(tmp_path / "g")
    assert old.summary()["row_checksums"] is False and ROW_SUMS_ARRAY not in old._arrays()
    np.testing.assert_array_equal(old.read(), data)
    assert old.verify()["ok"]
    rw = GradientStore.open(tmp_path / "g", mode="r+")  # a resume appends in the old format
    rw.append(data[:3], {f: np.arange(3) for f in META_FIELDS})
    assert GradientStore.open(tmp_path / "g").read().shape == (N + 3, P)


def test_a_store_whose_row_checksums_cover_grads_only_reads_resumes_and_checks_grads(tmp_path):
    """The format gradspec wrote before the arrays beside grads were bound (attribute True, one
    column per column chunk): it opens, reads, verifies and resumes as it was written, and a
    grads chunk of another store is still damage."""
    import zarr

    from gradspec.store import _checksum
    from gradspec.store._rowsums import ROW_SUMS_KEY
    from gradspec.store._zarr import update_attrs

    def segments_only(path, seed):
        make(path, seed=seed)
        group = zarr.open_group(str(path), mode="r+")
        nseg = -(-P // CPC)
        old = np.asarray(group[ROW_SUMS_ARRAY][:N, :nseg])
        del group[ROW_SUMS_ARRAY]  # zarr cannot drop columns in place: write the array again
        new = group.create_array(ROW_SUMS_ARRAY, shape=(N, nseg), chunks=(4096, nseg), dtype="uint32",
                                 fill_value=0, compressors=_checksum.checksum_codecs())
        new[:] = old
        update_attrs(group, {ROW_SUMS_KEY: True})

    segments_only(tmp_path / "g", 0)
    segments_only(tmp_path / "o", 1)
    store = GradientStore.open(tmp_path / "g", mode="r+")
    assert store._row_sums is not None and store._row_sums.small == {}
    assert store.verify()["ok"]
    more = np.random.default_rng(2).standard_normal((3, P)).astype(np.float32)
    store.append(more, {f: np.arange(3) for f in META_FIELDS})
    store = GradientStore.open(tmp_path / "g")
    assert store.read().shape == (N + 3, P) and store.verify()["ok"]
    assert store._read_array(ROW_SUMS_ARRAY, slice(0, N + 3)).shape == (N + 3, -(-P // CPC))
    shutil.copy(chunk_file(GradientStore.open(tmp_path / "o"), "grads", (1, 0)),
                chunk_file(store, "grads", (1, 0)))
    raises_foreign(GradientStore.open(tmp_path / "g").read, "1/0", r"4\.\.7")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_store_resumed_commits_reads_and_verifies(tmp_path, dtype):
    """A commit reads the dtype stats of the rows it is about to commit (not yet recorded as
    committed): after a reopen, those reads span committed and new rows alike."""
    store, data = make(tmp_path / "g", dtype=dtype, n=10)
    more = np.random.default_rng(3).standard_normal((3, P)).astype(np.float32)
    store = GradientStore.open(tmp_path / "g", mode="r+")
    store.append(more, {f: np.arange(3) for f in META_FIELDS})
    again = GradientStore.open(tmp_path / "g")
    assert again.read().shape == (13, P) and again.verify()["ok"]
    assert again.summary()["dtype_report"] is not None


def test_a_store_that_says_it_records_row_checksums_but_lost_them_is_refused(tmp_path):
    make(tmp_path / "g")
    shutil.rmtree(tmp_path / "g" / ROW_SUMS_ARRAY)
    with pytest.raises(ValueError, match="has no array 'row_crc32c'"):
        GradientStore.open(tmp_path / "g")


@pytest.mark.parametrize("name", ["meta/step", "meta/loss", "param_norms", "meta/clip_factor"])
@pytest.mark.parametrize("n", [4096 + 10, 30], ids=["whole-chunk", "last-chunk"])
def test_a_metadata_chunk_copied_from_another_store_is_damage(tmp_path, name, n):
    """The arrays beside grads are bound too: a metadata chunk of another run read as this one's
    steps, losses or norms. A whole committed 4,096-row chunk is checked by its file's CRC against
    the fold of its rows' recorded CRCs, the last one row by row."""
    def per_example(path, seed):
        lay = ParamLayout.from_shapes([("a", (3,)), ("b", (2,))])
        store = GradientStore.create(path, layout=lay, per_example=True)
        rng = np.random.default_rng(seed)
        meta = {f: rng.integers(0, 9, n) for f in META_FIELDS} | {
            "loss": rng.random(n), "example_index": np.arange(n), "pre_clip_norm": rng.random(n) + 1,
            "clip_factor": rng.random(n) * 0.5 + 0.5, "param_norms": rng.random((n, 2))}
        store.write_rows(0, rng.standard_normal((n, 5)).astype(np.float32), meta)
        store.commit(n)
        store.set_status("complete")
        return GradientStore.open(path)

    store, other = per_example(tmp_path / "g", 0), per_example(tmp_path / "o", 1)
    readers = {"meta/step": store.row_meta, "meta/loss": store.row_meta, "param_norms": store.param_norms,
               "meta/clip_factor": store.clip_factors}
    readers[name]()
    assert store.verify()["ok"]
    coords = (0,) if name.startswith("meta/") else (0, 0)
    shutil.copy(chunk_file(other, name, coords), chunk_file(store, name, coords))
    store = GradientStore.open(tmp_path / "g")
    read = {"meta/step": store.row_meta, "meta/loss": store.row_meta, "param_norms": store.param_norms,
            "meta/clip_factor": store.clip_factors}[name]
    key = "/".join(map(str, coords))
    with pytest.raises(StoreDamagedError, match=rf"chunk {name}/c/{key}, holding committed rows 0\.\.\d+ of {n}, "
                       r"is not this store's"):
        read()
    assert [(d["array"], d["chunk"]) for d in store.verify()["damaged"]] == [(name, f"c/{key}")]
