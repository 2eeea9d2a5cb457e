"""Per-chunk checksums: a CRC-32C of every chunk's stored bytes, checked on every read.

Every array gradspec creates ends its Zarr v3 codec chain with ``crc32c``
(``zarr.codecs.Crc32cCodec``): after the bytes codec (and the compressor, if
any) the chunk's encoded bytes are followed by their CRC-32C (Castagnoli),
4 bytes, little-endian (the Zarr v3 crc32c codec spec). A changed byte in a
chunk file — a flipped bit on disk, an edit — no longer decodes to another
plausible value: zarr refuses the chunk (``ValueError``), and gradspec's direct
chunk-file reader (``_fastread``), which bypasses zarr's codec pipeline, checks
the same CRC itself, with the library zarr uses (``google_crc32c``).

Stores written before checksums have no ``crc32c`` codec: they open and read as
before, and a changed byte in them cannot be detected (``gradspec info`` says so).
Nothing else about the format changed, so no format number was bumped; a
gradspec from before reads a checksummed store through zarr, which checks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import google_crc32c

#: The codec name in an array's ``zarr.json``.
CODEC = "crc32c"
#: Bytes the checksum adds to every chunk file.
TRAILER = 4
#: The problem a chunk whose bytes changed is reported with (after "chunk X is ...").
PROBLEM = ("corrupt: its bytes do not match their crc32c checksum (they changed on disk after "
           "gradspec wrote them)")


#: The problem of a chunk whose own checksum holds but that is not what its store recorded for it
#: (the store's rows' checksums, ``_rowsums``, or a finished store's chunk manifest, ``_manifest``).
FOREIGN = ("not this store's: its own checksum holds, but it is not what this store recorded for it "
           "(a chunk file copied in from another store, moved within this one, or rewritten outside "
           "gradspec)")


def checksum_codecs(compressors: list[Any] | None = None) -> list[Any]:
    """The bytes-to-bytes codecs of a new array: ``compressors`` (if any), then crc32c last."""
    from zarr.codecs import Crc32cCodec

    return [*(compressors or []), Crc32cCodec()]


def has_checksum(array: Any) -> bool:
    """The array's codec chain ends with crc32c (every chunk carries a checksum)."""
    try:
        codecs = tuple(array.metadata.codecs)
    except AttributeError:
        return False
    return bool(codecs) and type(codecs[-1]).__name__ == "Crc32cCodec"


#: The CRC-32C of any message followed by its own CRC-32C (4 bytes, little-endian): a whole
#: chunk file is intact exactly when its CRC-32C is this constant (the CRC's residue).
RESIDUE = 0x48674BC7


def raw_matches(raw: bytes) -> bool:
    """Whether a whole chunk file (payload then its 4-byte checksum) is intact.

    One CRC over the file's bytes as read (its residue, :data:`RESIDUE`): no slice is copied,
    and google_crc32c releases the GIL for ``bytes`` of 1 MiB or more, so a read-ahead thread
    checking a chunk never stalls the thread that computes (it holds the GIL for numpy arrays
    and memoryviews: ~1 ms per 8 MiB chunk, a pca's every panel product waiting on it).
    """
    return len(raw) >= TRAILER and google_crc32c.value(raw) == RESIDUE


def trailer_matches(chunk: Any, trailer: bytes) -> bool:
    """Whether a chunk read into a buffer (``chunk``: its bytes, any C-contiguous buffer) and
    the 4 bytes stored after it in its file are intact: the CRC-32C of both is the residue.
    Holds the GIL while the CRC runs (~1 ms an 8 MiB chunk: see ``_fastread``)."""
    return len(trailer) == TRAILER and google_crc32c.extend(google_crc32c.value(chunk), trailer) == RESIDUE


def checksum_summary(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """Which of ``arrays`` ({name: zarr array}) carry per-chunk checksums (`gradspec info`).

    Returns:
        ``{"codec": "crc32c", "arrays": n, "checksummed": [names], "unchecked": [names]}``.
    """
    with_crc = [name for name, arr in arrays.items() if has_checksum(arr)]
    return {"codec": CODEC, "arrays": len(arrays), "checksummed": with_crc,
            "unchecked": [name for name in arrays if name not in with_crc]}


def _raw_chunk(array: Any, coords: tuple[int, ...]) -> bytes | None:
    """The stored bytes of chunk ``coords`` (None when it is not stored), through the array's store."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store, prefix = array.store_path.store, array.store_path.path
    key = array.metadata.encode_chunk_key(tuple(int(c) for c in coords))
    buf = sync(store.get(f"{prefix}/{key}" if prefix else key, prototype=default_buffer_prototype()))
    return None if buf is None else buf.to_bytes()


def corrupt_chunks(array: Any, coords: Iterable[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The chunks of ``coords`` whose stored bytes fail their checksum (none in an array without one).

    Reads each chunk's bytes again: for naming the chunk after a read failed, not for every read.
    """
    if not has_checksum(array):
        return []
    out = []
    for c in coords:
        raw = _raw_chunk(array, c)
        if raw is not None and not raw_matches(raw):
            out.append(tuple(c))
    return out
