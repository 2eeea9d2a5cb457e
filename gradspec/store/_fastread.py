"""Reading uncompressed local chunks straight into the caller's array.

For the spectral engine a pass over H is a stream of column blocks spanning
every selected row. zarr-python's general read path (async codec pipeline,
a buffer per chunk, then a copy into the output) costs several CPU-seconds
per GB — on a 2-core machine that is time taken from the matrix products
running beside it. When a store is local, uncompressed (the default; only
the ``bytes`` codec, little-endian) and regularly chunked, a chunk file *is*
the C-order chunk, so a chunk whose rows fall inside the block is read with
one ``readinto`` directly into the block (it is a contiguous slab of it when
the block spans the chunk's columns). Strided and listed rows read each
chunk that holds one of them once. Everything else — compressed or remote
stores — goes through zarr.

A store that checksums its chunks (``_checksum``: codecs ``bytes`` then
``crc32c``) has a chunk file of the C-order chunk followed by its 4-byte
CRC-32C. The chunk is read into the block, its 4 trailing bytes after it, and
the CRC-32C of both is checked there — the check zarr's codec pipeline would
make, which this path bypasses. The CRC of a numpy buffer holds the GIL (about
1 ms an 8 MiB chunk). Until 2026-11-28 the file was read whole into ``bytes``
instead (whose CRC releases the GIL) and copied into the block, which measured
faster when each block was fresh memory; with reused block buffers
(``iter_col_blocks(reuse=True)``) reading in place measured faster on a quiet
2-core Xeon, interleaved medians of 3-4 passes over a 1,500 × 4e5 store: a
read-only pass 1.27 s against 1.64 s, the V pass 4.21 s against 4.46 s, the Gram
pass 6.24 s against 6.34 s (``benchmarks/bench_checksums.py`` for the whole
pca).

Chunks are replaced atomically on local disk (``_zarr``), so a file is read
whole in its old or new version. A chunk file that is missing, short, long or
fails its checksum goes to the ``on_damage`` callback, which raises (a
gradient store whose rows are committed: see ``_integrity``) or, for a missing
file, returns to read it as the fill value.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from gradspec.store._checksum import FOREIGN, TRAILER, has_checksum, trailer_matches
from gradspec.store._checksum import PROBLEM as CORRUPT

#: A chunk's name that is a symbolic link: never read through (a store from someone else could
#: link a chunk to any file its reader can read), on every read path and in ``verify``.
LINKED = "a symbolic link (gradspec reads no chunk through a link)"
#: A chunk's name that holds a directory, a FIFO or a device.
NOT_REGULAR = "not a regular file"


def local_root(array: Any) -> str | None:
    """The directory of ``array``'s files when it lives in a local zarr store, else None."""
    try:
        from zarr.storage import LocalStore

        store = array.store_path.store
    except (ImportError, AttributeError):
        return None
    if not isinstance(store, LocalStore):
        return None
    return os.path.join(str(store.root), array.path) if array.path else str(store.root)


#: ``on_damage(i, j, problem)``: raise, or return to read a missing chunk as fill.
OnDamage = Callable[[int, int, str], None]
#: ``bound(i, j, chunk, checksum)``: whether chunk (i, j), read whole and intact into ``chunk``
#: and ending in ``checksum``, holds the rows its store recorded (``_rowsums``).
Bound = Callable[[int, int, np.ndarray, int], bool]


class ChunkFileReader:
    """Direct reads of row-slice × column-range selections of one local, uncompressed 2-D array."""

    def __init__(self, root: str, array: Any, on_damage: OnDamage | None = None,
                 bound: Bound | None = None) -> None:
        self._a = array
        self._root = root
        self._rc, self._cc = (int(c) for c in array.chunks)
        #: The stored dtype: what reads return, and what a buffer given to them must hold.
        self.dtype = np.dtype(array.dtype)
        self._fill = array.fill_value
        self._chunk_bytes = self._rc * self._cc * self.dtype.itemsize
        self._crc = has_checksum(array)
        self._trailer = TRAILER if self._crc else 0  # bytes after the chunk in its file
        self._on_damage = on_damage
        self._bound = bound if self._crc else None

    @classmethod
    def for_array(cls, array: Any, on_damage: OnDamage | None = None,
                  bound: Bound | None = None) -> ChunkFileReader | None:
        """A reader when ``array`` qualifies for direct reads, else None (use zarr).

        ``on_damage(i, j, problem)`` hears of a missing (``problem == "missing"``) or
        wrong-sized chunk file; it raises, or returns to read a missing one as fill.
        Without it a missing chunk reads as fill and a wrong-sized one raises ``OSError``.
        ``bound`` (:data:`Bound`) checks each intact chunk of a checksummed array against
        its store's recorded rows; one that fails is damage too (``_checksum.FOREIGN``).
        """
        try:
            from zarr.codecs import BytesCodec

            meta = array.metadata
            root = local_root(array)
            if root is None or len(array.shape) != 2:
                return None
            codecs = tuple(meta.codecs)
            if has_checksum(array):  # bytes, then crc32c: the chunk, then its checksum
                codecs = codecs[:-1]
            if len(codecs) != 1 or not isinstance(codecs[0], BytesCodec):
                return None
            endian = codecs[0].endian
            little = sys.byteorder == "little"
            if np.dtype(array.dtype).itemsize > 1 and (endian is None or (endian.value == "little") != little):
                return None
            if getattr(meta.chunk_grid, "chunk_shape", None) is None:
                return None
            return cls(root, array, on_damage, bound)
        except Exception:  # any zarr internals we do not recognise: the general path
            return None

    def _path(self, i: int, j: int) -> str:
        return os.path.join(self._root, *self._a.metadata.encode_chunk_key((i, j)).split("/"))

    def _read_file(self, f: Any, into: np.ndarray) -> tuple[int, bool, bytes]:
        """Read an open chunk file into ``into``: (bytes read, the checksum holds, the bytes after
        the chunk: its checksum).

        ``into`` may hold a partial chunk when the file is damaged; the caller raises then."""
        flat = into.reshape(-1).view(np.uint8)
        view = memoryview(flat)
        got = 0
        while got < self._chunk_bytes:
            n = f.readinto(view[got:])
            if not n:
                break
            got += n
        if got < self._chunk_bytes:
            return got, True, b""
        tail = f.read(self._trailer + 1)  # its checksum, and one byte more: a longer file is damage
        while 0 < len(tail) < self._trailer + 1:  # a short read (rare): read on to the end
            more = f.read(self._trailer + 1 - len(tail))
            if not more:
                break
            tail += more
        got += len(tail)
        if not self._crc or got != self._chunk_bytes + self._trailer:
            return got, True, tail
        return got, trailer_matches(flat, tail), tail

    def _read_chunk(self, i: int, j: int, into: np.ndarray) -> None:
        """Fill ``into`` (a C-contiguous chunk-shaped buffer) with chunk (i, j), its checksum checked."""
        try:
            # O_NOFOLLOW: a chunk linked out of the store (to any file the user can read) is
            # damage, never read through
            # O_NONBLOCK: a FIFO in a chunk's place blocked the read forever; fstat of the opened
            # descriptor, before anything wraps it, then refuses anything but a regular file (a
            # FIFO, a directory: a file object over a directory raised "Is a directory: 7")
            fd = os.open(self._path(i, j), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            if self._on_damage is not None:
                self._on_damage(i, j, "missing")
            into.fill(self._fill)
            return
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            if self._on_damage is not None:
                self._on_damage(i, j, LINKED)
            raise ValueError(f"chunk {self._path(i, j)!r} is {LINKED}; the store is damaged or not its own") from None
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except BaseException:
            os.close(fd)
            raise
        if regular:
            with open(fd, "rb", buffering=0) as f:
                got, intact, tail = self._read_file(f, into)
        else:
            os.close(fd)
            got, intact, tail = 0, True, b""
        size = self._chunk_bytes + self._trailer
        problem = None
        if not regular:
            problem = NOT_REGULAR
        elif got != size:
            problem = (f"truncated ({got} of {size} bytes)" if got < size
                       else f"longer than the {size} bytes of a chunk")
        elif not intact:
            problem = CORRUPT
        elif self._bound is not None and not self._bound(i, j, into, int.from_bytes(tail, "little")):
            problem = FOREIGN
        if problem is not None:
            if self._on_damage is not None:
                self._on_damage(i, j, problem)
            raise OSError(f"chunk {i}/{j} of {self._root!r} is {problem}; the store is damaged")

    def _out(self, shape: tuple[int, int], into: np.ndarray | None) -> np.ndarray:
        """A C-order array of ``shape``: a new one, or a view of the 1-D buffer ``into``."""
        if into is None:
            return np.empty(shape, dtype=self.dtype)
        n = shape[0] * shape[1]
        if into.dtype != self.dtype or into.ndim != 1 or into.size < n:
            raise ValueError(f"a buffer of {into.size} {into.dtype} cannot hold {shape} {self.dtype}")
        return into[:n].reshape(shape)

    def read(self, r0: int, r1: int, c0: int, c1: int, into: np.ndarray | None = None) -> np.ndarray:
        """Rows [r0, r1) × columns [c0, c1) as a C-order array of the stored dtype: new, or a
        view of ``into`` (a 1-D buffer of the stored dtype, at least that large)."""
        out = self._out((r1 - r0, c1 - c0), into)
        rc, cc = self._rc, self._cc
        scratch: np.ndarray | None = None
        whole_cols = c0 % cc == 0 and (c1 - c0 == cc)
        for i in range(r0 // rc, -(-r1 // rc)):
            a, b = max(r0, i * rc), min(r1, (i + 1) * rc)
            for j in range(c0 // cc, -(-c1 // cc)):
                ca, cb = max(c0, j * cc), min(c1, (j + 1) * cc)
                if whole_cols and a == i * rc and b == (i + 1) * rc:
                    self._read_chunk(i, j, out[a - r0 : b - r0])  # a contiguous slab of out
                    continue
                if scratch is None:
                    scratch = np.empty((rc, cc), dtype=self.dtype)
                self._read_chunk(i, j, scratch)
                out[a - r0 : b - r0, ca - c0 : cb - c0] = scratch[
                    a - i * rc : b - i * rc, ca - j * cc : cb - j * cc
                ]
        return out

    def read_rows(self, rows: np.ndarray, c0: int, c1: int, into: np.ndarray | None = None) -> np.ndarray:
        """Listed rows (any order, repeats allowed) × columns [c0, c1), each chunk read once
        (into a view of ``into`` as for :meth:`read`)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = self._out((rows.size, c1 - c0), into)
        rc, cc = self._rc, self._cc
        scratch = np.empty((rc, cc), dtype=self.dtype)
        chunk_of = rows // rc
        for i in np.unique(chunk_of):
            pos = np.flatnonzero(chunk_of == i)
            local = rows[pos] - i * rc
            for j in range(c0 // cc, -(-c1 // cc)):
                ca, cb = max(c0, j * cc), min(c1, (j + 1) * cc)
                self._read_chunk(int(i), j, scratch)
                out[pos, ca - c0 : cb - c0] = scratch[local, ca - j * cc : cb - j * cc]
        return out
