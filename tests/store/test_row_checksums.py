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
from gradspec.store._rowsums import ROW_SUMS_ARRAY, Shift, segment_crcs
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
    rec = store._read_array(ROW_SUMS_ARRAY, slice(0, 22))
    assert rec.shape == (22, 4) and rec.dtype == np.uint32
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


def test_a_store_that_says_it_records_row_checksums_but_lost_them_is_refused(tmp_path):
    make(tmp_path / "g")
    shutil.rmtree(tmp_path / "g" / ROW_SUMS_ARRAY)
    with pytest.raises(ValueError, match="has no array 'row_crc32c'"):
        GradientStore.open(tmp_path / "g")
