"""Row checksums: every gradient chunk bound to the rows its own store recorded.

A chunk's CRC-32C (``_checksum``) finds bytes that changed, not a chunk that belongs
elsewhere: a chunk file copied in from another store of the same chunking, or two chunk
files swapped (a bad merge, an rsync of the wrong run), carries a CRC of its own that
holds. So a gradient store written since ``gradspec.row_checksums`` records, with each
row's metadata, the CRC-32C of the row's bytes in each column chunk (its *segments*, the
last one padded with the fill value, 0, to the chunk's width, as the chunk stores it):
``row_crc32c``, (rows, column chunks), uint32. It is written and committed with the rows'
other metadata, so it is as crash-safe as they are.

A chunk of ``rc`` rows is the concatenation of its rows' segments, and the CRC is linear:
crc(A·B) = shift_|B|(crc(A)) ⊕ crc(B), where shift_L is the GF(2)-linear map of feeding L
zero bytes (a 32 × 32 bit matrix, applied with four 256-entry tables). So the checksum a
chunk file ends with must equal the fold of its rows' recorded segment CRCs (folded once per
store): the direct reader, which reads that checksum anyway, checks it with a lookup and no
pass over the data. In the chunk at the committed frontier (which may also hold rows not yet committed,
never recorded) the committed rows' segments are checksummed from the bytes read. Compressed
or remote stores, read through zarr (whose CRC covers the compressed bytes), are checked the
second way on the decoded rows, wherever a read spans whole column chunks.

The arrays beside grads (``meta/*``, ``param_norms``, ``dtype_stats``: a step's loss, an
example's norms) are bound the same way: ``row_crc32c`` has one more column per array the
attribute lists (``{"arrays": [...]}``), each row's CRC of its row there. Their chunks hold
4,096 rows and every column, so a whole committed chunk is checked by the CRC its file ends
with against the fold of that column's CRCs, the chunk at the frontier row by row. A store
whose attribute is ``True`` (written before they were bound) has segment columns only.

Measured (2-core AMD EPYC, ``benchmarks/bench_row_checksums.py``, docs/bench_row_checksums.txt):
recording runs at 3-13 GB/s on the writer's thread (1.2-4.9% of writing the rows); a read
pass checked and unchecked took the same CPU time (paired ratio 1.005).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import google_crc32c
import numpy as np

from gradspec.store._manifest import stored_trailer

#: The store attribute saying its rows' segment checksums are recorded.
ROW_SUMS_KEY = "gradspec.row_checksums"
#: The (rows, column chunks) uint32 array of them.
ROW_SUMS_ARRAY = "row_crc32c"

_MASK = 0xFFFFFFFF


def _crc(buf: np.ndarray, pad: bytes) -> int:
    c = google_crc32c.value(buf)
    return google_crc32c.extend(c, pad) if pad else c


def row_crcs(values: np.ndarray) -> np.ndarray:
    """(b,) uint32: the CRC-32C of each row's stored bytes (a 1-D array's values, a 2-D one's rows)."""
    v = np.ascontiguousarray(values)
    flat = v.reshape(v.shape[0], -1).view(np.uint8) if v.shape[0] else np.zeros((0, 0), dtype=np.uint8)
    return np.fromiter((google_crc32c.value(r) for r in flat), dtype=np.uint32, count=flat.shape[0])


def segment_crcs(rows: np.ndarray, cc: int) -> np.ndarray:
    """(b, segments) uint32: the CRC-32C of each row's bytes in each column chunk of width
    ``cc``, the last segment padded with zero bytes to ``cc`` values.

    ``rows`` (b, w), in their stored dtype, start at a column-chunk boundary.
    """
    rows = np.asarray(rows)
    b, ncols = rows.shape
    nseg = -(-ncols // cc)
    out = np.empty((b, nseg), dtype=np.uint32)
    item = rows.dtype.itemsize
    for j in range(nseg):
        a, e = j * cc, min((j + 1) * cc, ncols)
        pad = bytes((cc - (e - a)) * item)
        for t in range(b):
            out[t, j] = _crc(np.ascontiguousarray(rows[t, a:e]), pad)
    return out


class Shift:
    """shift_L: the linear map of the CRC-32C register of feeding ``nbytes`` zero bytes."""

    def __init__(self, nbytes: int) -> None:
        zeros = bytes(nbytes)
        base = google_crc32c.extend(0, zeros)
        cols = [google_crc32c.extend(1 << k, zeros) ^ base for k in range(32)]
        table = np.zeros((4, 256), dtype=np.uint32)
        for t in range(4):
            for k in range(8):
                bit = 1 << k
                table[t, bit:2 * bit] = table[t, :bit] ^ np.uint32(cols[8 * t + k])
        self.table = table

    def __call__(self, x: np.ndarray) -> np.ndarray:
        t = self.table
        return t[0][x & 0xFF] ^ t[1][(x >> 8) & 0xFF] ^ t[2][(x >> 16) & 0xFF] ^ t[3][x >> 24]

    def fold(self, crcs: np.ndarray) -> np.ndarray:
        """(..., rc, n) segment CRCs of consecutive segments -> (..., n): the CRC of each
        column's concatenated segments."""
        acc = crcs[..., 0, :].astype(np.uint32)
        for t in range(1, crcs.shape[-2]):
            acc = self(acc) ^ crcs[..., t, :]
        return acc


class RowSums:
    """The check of one store's ``grads`` chunks against its recorded row checksums.

    ``load(a, b)`` reads the recorded rows [a, b) (uint32, (b − a, column chunks)); the
    committed row count is given at every check (``n_rows``). A truncate must :meth:`drop`
    the rows it uncommits: rows written again in their place are other rows.
    """

    def __init__(self, load: Callable[[int, int], np.ndarray], chunks: tuple[int, int], p: int,
                 itemsize: int, small: dict[str, Any] | None = None) -> None:
        self._load = load
        self.rc, self.cc = (int(c) for c in chunks)
        self.p = int(p)
        self.nseg = -(-self.p // self.cc)
        #: the per-row arrays beside grads whose rows' CRCs follow the segments', by name: their
        #: zarr array (rows on the first axis, every column in one chunk), in column order
        self.small = dict(small or {})
        self.ncols = self.nseg + len(self.small)
        self._col = {name: self.nseg + t for t, name in enumerate(self.small)}
        self._shift = Shift(self.cc * int(itemsize))
        self._sums = np.zeros((0, self.ncols), dtype=np.uint32)
        self._chunk_sums = np.zeros((0, self.nseg), dtype=np.uint32)  # of whole committed row chunks
        self._small_folds: dict[str, tuple[Shift, np.ndarray]] = {}  # the same for each small array
        self._lock = threading.Lock()  # the read-ahead threads of a pass check chunks side by side

    def drop(self, n_rows: int) -> None:
        """Forget what was loaded for rows from ``n_rows`` on."""
        with self._lock:
            self._sums = self._sums[:n_rows]
            self._chunk_sums = self._chunk_sums[: n_rows // self.rc]
            self._small_folds.clear()

    def _sync(self, n_rows: int) -> None:
        if self._sums.shape[0] == n_rows:
            return
        with self._lock:
            self._sync_locked(n_rows)

    def _sync_locked(self, n_rows: int) -> None:
        sums = self._sums
        if n_rows <= sums.shape[0]:
            self._chunk_sums = self._chunk_sums[: n_rows // self.rc]
            self._small_folds.clear()
            self._sums = sums[:n_rows]
            return
        more = np.asarray(self._load(sums.shape[0], n_rows), dtype=np.uint32)
        sums = np.concatenate([sums, more.reshape(n_rows - sums.shape[0], self.ncols)])
        full, done = n_rows // self.rc, self._chunk_sums.shape[0]
        if full > done:
            new = sums[done * self.rc : full * self.rc, : self.nseg].reshape(full - done, self.rc, self.nseg)
            self._chunk_sums = np.concatenate([self._chunk_sums, self._shift.fold(new)])
        self._sums = sums  # last: a check that finds n_rows loaded finds their chunks' folds too

    def recorded(self, n_rows: int, rows: slice | np.ndarray) -> np.ndarray:
        """The recorded segment CRCs of committed ``rows``."""
        self._sync(n_rows)
        return self._sums[rows, : self.nseg]

    def _small_fold(self, name: str, n_rows: int) -> np.ndarray:
        """The CRC each whole committed chunk of small array ``name`` must end with (cached)."""
        arr = self.small[name]
        rc = int(arr.chunks[0])
        with self._lock:
            shift, folds = self._small_folds.get(name) or (None, np.zeros(0, dtype=np.uint32))
            full = n_rows // rc
            if folds.shape[0] < full:
                if shift is None:
                    shift = Shift(int(np.prod(arr.chunks[1:], dtype=np.int64)) * np.dtype(arr.dtype).itemsize)
                col = self._sums[: full * rc, self._col[name]].reshape(full, rc, 1)
                folds = shift.fold(col)[:, 0]
                self._small_folds[name] = (shift, folds)
            return folds

    def check_small(self, n_rows: int, name: str, rows: np.ndarray, values: np.ndarray) -> int | None:
        """The first row chunk of small array ``name`` whose committed ``rows``, read as
        ``values`` (their stored dtype), are not the ones this store recorded; None when all are.
        Rows at or past ``n_rows`` (written, not yet committed) have no record and are skipped.

        A whole committed chunk is checked by the CRC its file ends with (4 bytes read: the
        fold of its rows' recorded CRCs), the chunk at the frontier (or one whose file's CRC
        cannot be read) by its rows' CRCs."""
        if name not in self.small:
            return None
        self._sync(n_rows)
        arr = self.small[name]
        rc = int(arr.chunks[0])
        rows = np.asarray(rows, dtype=np.int64)
        committed = rows < n_rows
        rows, values = rows[committed], np.asarray(values)[committed]
        for i in np.unique(rows // rc):
            a, b = int(i) * rc, min((int(i) + 1) * rc, n_rows)
            if b - a == rc:
                crc = stored_trailer(arr, (int(i),) + (0,) * (arr.ndim - 1))
                if crc is not None:  # else its rows' CRCs, as at the frontier
                    if crc != int(self._small_fold(name, n_rows)[i]):
                        return int(i)
                    continue
            sel = (rows >= a) & (rows < b)
            if not np.array_equal(row_crcs(values[sel]), self._sums[rows[sel], self._col[name]]):
                return int(i)
        return None

    def small_chunk_ok(self, n_rows: int, name: str, i: int, chunk: np.ndarray, crc: int | None) -> bool:
        """Whether chunk ``i`` of small array ``name`` (``chunk``: its rows from the first, as stored;
        ``crc``: what its file ends with, None where not read) holds the rows this store recorded."""
        arr = self.small[name]
        rc = int(arr.chunks[0])
        a, b = i * rc, min((i + 1) * rc, n_rows)
        if b - a == rc and crc is not None:
            self._sync(n_rows)
            return crc == int(self._small_fold(name, n_rows)[i])
        return self.check_small(n_rows, name, np.arange(a, b), np.asarray(chunk)[: b - a]) is None

    def check_chunk(self, n_rows: int, i: int, j: int, chunk: np.ndarray, trailer: int | None) -> bool:
        """Whether chunk (i, j), read whole into ``chunk`` (its ``rc`` × ``cc`` stored values)
        and ending in checksum ``trailer`` (None: not known), holds this store's rows."""
        self._sync(n_rows)
        if i < self._chunk_sums.shape[0] and trailer is not None:
            return int(self._chunk_sums[i, j]) == int(trailer) & _MASK
        a = i * self.rc
        m = min(self.rc, n_rows - a)
        if m <= 0:
            return True
        got = segment_crcs(np.asarray(chunk).reshape(self.rc, self.cc)[:m], self.cc)
        return bool(np.array_equal(got[:, 0], self._sums[a : a + m, j]))

    def check_block(self, n_rows: int, rows: np.ndarray, c0: int, c1: int,
                    block: np.ndarray) -> tuple[int, int] | None:
        """:func:`first_mismatch` of committed ``rows`` × columns [c0, c1) read as ``block``."""
        return first_mismatch(self.recorded(n_rows, slice(0, n_rows)), rows, c0, c1, block,
                              (self.rc, self.cc), self.p)


def first_mismatch(recorded: np.ndarray, rows: np.ndarray, c0: int, c1: int, block: np.ndarray,
                   chunks: tuple[int, int], p: int) -> tuple[int, int] | None:
    """The first chunk (row chunk, column chunk) whose rows in ``block`` (committed rows
    ``rows`` × columns [c0, c1) of a ``p``-column array of chunk shape ``chunks``, as stored)
    are not the ``recorded`` ones (every committed row's segment CRCs); None when all are, or
    when the block spans no whole column chunk (nothing of it can be checked)."""
    rc, cc = (int(c) for c in chunks)
    j0 = -(-c0 // cc)
    end = c1 if c1 == p else (c1 // cc) * cc
    j1 = -(-end // cc)
    if j1 <= j0:
        return None
    rows = np.asarray(rows, dtype=np.int64)
    got = segment_crcs(np.asarray(block)[:, j0 * cc - c0 : end - c0], cc)
    bad = np.argwhere(got != recorded[rows, j0:j1])
    if bad.size == 0:
        return None
    t, s = bad[0]
    return int(rows[t]) // rc, j0 + int(s)
