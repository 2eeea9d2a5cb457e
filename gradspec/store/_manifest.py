"""A finished store's chunk manifest: every chunk's checksum, recorded where it cannot move.

A chunk's CRC-32C (``_checksum``) says its bytes did not change, not that it is this store's: a
chunk file copied in from another spectrum store of the same shape and chunking, or two chunk
files of one array swapped, ends in a CRC of its own that holds. A spectrum store is written
once, so when its run finishes (``SpectrumWrites.finish``) the CRC each chunk file of each
result array ends with is recorded in the group's attributes (``gradspec.chunk_crcs``: per
array, one integer per chunk in C order of the chunk grid), which their SHA-256 digest covers
(``_zarr.DIGEST_KEY``). A checked read then compares the CRC each chunk it read ends with
against the record: a read of 4 bytes a chunk. (A gradient store is appended to and resumed,
so it binds its chunks to its rows instead: ``_rowsums``.)
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gradspec.store._checksum import TRAILER, has_checksum
from gradspec.store._fastread import local_root

MANIFEST_KEY = "gradspec.chunk_crcs"


def _grid(array: Any) -> tuple[int, ...]:
    return tuple(-(-int(n) // int(c)) for n, c in zip(array.shape, array.chunks, strict=True))


def _index(array: Any, coords: tuple[int, ...]) -> int:
    """The chunk's place in C order of the array's chunk grid."""
    out = 0
    for c, n in zip(coords, _grid(array), strict=True):
        out = out * n + int(c)
    return out


def stored_trailer(array: Any, coords: tuple[int, ...]) -> int | None:
    """The CRC-32C (little-endian, its last 4 bytes) that chunk ``coords``'s file ends with; None
    when the chunk is not stored or too short to hold one."""
    key = array.metadata.encode_chunk_key(tuple(int(c) for c in coords))
    root = local_root(array)
    if root is not None:
        try:
            fd = os.open(os.path.join(root, *key.split("/")),
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            tail = os.pread(fd, TRAILER, size - TRAILER) if size >= TRAILER else b""
        finally:
            os.close(fd)
    else:
        from zarr.abc.store import SuffixByteRequest
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        store, prefix = array.store_path.store, array.store_path.path
        buf = sync(store.get(f"{prefix}/{key}" if prefix else key, prototype=default_buffer_prototype(),
                             byte_range=SuffixByteRequest(TRAILER)))
        tail = b"" if buf is None else buf.to_bytes()
    return int.from_bytes(tail, "little") if len(tail) == TRAILER else None


def record(arrays: Mapping[str, Any]) -> dict[str, list[int]]:
    """Every chunk's stored CRC of each checksummed array, in C order of its chunk grid (the
    value of ``gradspec.chunk_crcs``); a chunk not stored is recorded as -1."""
    out: dict[str, list[int]] = {}
    for name, arr in arrays.items():
        if not has_checksum(arr):
            continue
        crcs = (stored_trailer(arr, coords) for coords in itertools.product(*map(range, _grid(arr))))
        out[name] = [-1 if crc is None else crc for crc in crcs]
    return out


class Manifest:
    """The recorded chunk CRCs of a finished store (``gradspec.chunk_crcs``), checked on reads."""

    def __init__(self, recorded: Mapping[str, list[int]]) -> None:
        self._recorded = {k: list(v) for k, v in recorded.items() if isinstance(v, list)}

    def holds(self, name: str, array: Any, coords: tuple[int, ...], crc: int | None) -> bool:
        """Whether chunk ``coords`` of array ``name``, whose file ends in ``crc``, is the one recorded
        (True for an array the manifest does not list, and for a chunk not stored, ``crc`` None: a
        missing chunk is the chunk checks' to report, ``_integrity``)."""
        want = self._recorded.get(name)
        if want is None or crc is None:
            return True
        i = _index(array, coords)
        return i < len(want) and int(want[i]) == int(crc)

    def moved(self, name: str, array: Any, coords: Iterable[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The chunks of ``coords`` whose files end in another CRC than the one recorded (a read of
        4 bytes each)."""
        if name not in self._recorded:
            return []
        return [tuple(c) for c in coords if not self.holds(name, array, tuple(c), stored_trailer(array, tuple(c)))]

    def bound(self, name: str, array: Any) -> Callable[[tuple[int, ...], Any, int | None], bool]:
        """The check ``_integrity.verify_arrays`` takes for array ``name``: the CRC the chunk's file
        ends with (read again where the read did not see it) against the record."""
        def check(coords: tuple[int, ...], chunk: Any, crc: int | None) -> bool:
            return self.holds(name, array, coords, crc if crc is not None else stored_trailer(array, coords))
        return check
