"""A committed row never reads as fill: finding missing and damaged chunks.

zarr reads a chunk that is not stored as the array's fill value (zeros), so a
lost chunk file turns committed gradients into zeros with no error. Stores
created by this version write every chunk, even an all-zero one (zarr skips
those unless ``write_empty_chunks``), and say so with the attribute
``gradspec.all_chunks``; in them a missing chunk of a committed row is damage,
and every reader raises :class:`StoreDamagedError` naming it. Older stores
cannot tell a skipped all-zero chunk from a lost one: their readers warn.

Checking costs a stat per chunk on local disk (the fast reader's ``open``
failing, at no cost at all) and one listing per read elsewhere.
:func:`verify_arrays` reads every chunk of every committed row in full.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from gradspec.store._fastread import local_root

ALL_CHUNKS_KEY = "gradspec.all_chunks"


class StoreDamagedError(OSError):
    """A committed row's chunk is missing or unreadable; reading on would give wrong values."""


def damage_error(path: str, array: str, key: str, rows: tuple[int, int], n_rows: int,
                 problem: str, more: int = 0) -> StoreDamagedError:
    """The one-line error for a damaged chunk holding committed rows ``rows`` (half-open)."""
    a, b = rows
    fix = (
        f"restore the file from a copy, or keep the {a} rows before it with "
        f"GradientStore.open({path!r}, mode='r+').truncate({a}) and collect the rest again"
        if a > 0 else "restore the file from a copy, or collect the run again"
    )
    extra = f" (and {more} more damaged chunks; `gradspec info --verify` lists them)" if more else ""
    return StoreDamagedError(
        f"{path} is damaged: chunk {array}/{key}, holding committed rows {a}..{b - 1} of {n_rows}, "
        f"is {problem}{extra}; reading on would give wrong values: {fix}"
    )


def chunk_span(index: int, chunk: int, n: int) -> tuple[int, int]:
    """The rows [a, b) of row chunk ``index`` that lie below ``n``."""
    return index * chunk, min((index + 1) * chunk, n)


def row_chunks(idx: slice | np.ndarray, chunk: int) -> Iterable[int]:
    """Indices of the row chunks a row selection touches."""
    if isinstance(idx, slice):
        return range(idx.start // chunk, -(-idx.stop // chunk)) if idx.stop > idx.start else range(0)
    return (int(i) for i in np.unique(np.asarray(idx) // chunk))


def col_chunks(c0: int, c1: int, chunk: int) -> range:
    return range(c0 // chunk, -(-c1 // chunk)) if c1 > c0 else range(0)


class ChunkPresence:
    """Which chunks of one zarr array are stored.

    On local disk a chunk is checked with a stat when asked; elsewhere the
    array's keys are listed once and listed again before a chunk is called
    missing (it may have been written since). :meth:`forget` drops the listing.
    """

    def __init__(self, array: Any) -> None:
        self._a = array
        self._root = local_root(array)
        self._listed: set[str] | None = None

    @property
    def local(self) -> bool:
        """The array is on local disk (a chunk is checked with a stat)."""
        return self._root is not None

    def key(self, coords: tuple[int, ...]) -> str:
        return self._a.metadata.encode_chunk_key(tuple(int(c) for c in coords))

    def path(self, coords: tuple[int, ...]) -> str | None:
        """The chunk's file on local disk (None for other stores)."""
        if self._root is None:
            return None
        return os.path.join(self._root, *self.key(coords).split("/"))

    def forget(self) -> None:
        self._listed = None

    def _list(self) -> set[str]:
        from zarr.core.sync import sync

        store, prefix = self._a.store_path.store, self._a.store_path.path

        async def keys() -> list[str]:
            return [k async for k in store.list_prefix(prefix + "/" if prefix else "")]

        strip = len(prefix) + 1 if prefix else 0
        return {k[strip:] for k in sync(keys())}

    def missing(self, coords: Iterable[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The chunks of ``coords`` that are not stored."""
        coords = list(coords)
        if self._root is not None:
            return [c for c in coords if not os.path.isfile(self.path(c))]  # type: ignore[arg-type]
        if self._listed is None:
            self._listed = self._list()
        miss = [c for c in coords if self.key(c) not in self._listed]
        if miss:
            self._listed = self._list()
            miss = [c for c in miss if self.key(c) not in self._listed]
        return miss


def committed_chunks(array: Any, n_rows: int, start: int = 0) -> Iterator[tuple[int, ...]]:
    """Every chunk holding a row in [start, n_rows) (1-D or 2-D arrays, rows on the first axis)."""
    rc = int(array.chunks[0])
    for i in range(start // rc, -(-n_rows // rc)):
        if len(array.shape) == 1:
            yield (i,)
        else:
            for j in range(-(-int(array.shape[1]) // int(array.chunks[1]))):
                yield (i, j)


def raw_chunk_bytes(array: Any) -> int | None:
    """The byte size of every chunk file when the array is local and uncompressed, else None."""
    from zarr.codecs import BytesCodec

    try:
        codecs = tuple(array.metadata.codecs)
    except AttributeError:
        return None
    if local_root(array) is None or len(codecs) != 1 or not isinstance(codecs[0], BytesCodec):
        return None
    endian = codecs[0].endian
    if np.dtype(array.dtype).itemsize > 1 and (endian is None or endian.value != sys.byteorder):
        return None
    return math.prod(int(c) for c in array.chunks) * np.dtype(array.dtype).itemsize


def _nonfinite(values: np.ndarray, dtype: str | None) -> np.ndarray:
    """Per row (first axis): how many entries are NaN or ±inf."""
    if dtype == "bfloat16":  # raw bits: exponent all ones
        bad = (values.view(np.uint16) & np.uint16(0x7F80)) == np.uint16(0x7F80)
    elif values.dtype.kind == "f":
        bad = ~np.isfinite(values)
    else:
        return np.zeros(values.shape[0], dtype=np.int64)
    return bad.reshape(values.shape[0], -1).sum(axis=1)


def verify_arrays(
    arrays: dict[str, Any],
    n_rows: int,
    *,
    strict: bool,
    dtypes: dict[str, str] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Read every chunk of every committed row of ``arrays`` ({name: zarr array}).

    Args:
        arrays: the store's row arrays (rows on the first axis).
        n_rows: committed rows.
        strict: the store writes every chunk, so a missing one is damage; otherwise a
            missing chunk of a metadata array may be a skipped all-zero chunk and is
            only counted (a missing gradient chunk is still reported).
        dtypes: logical dtype per array where it differs from the stored one (bfloat16).
        progress: show a progress bar on stderr.

    Returns:
        ``{"ok", "chunks", "bytes", "damaged": [{array, chunk, rows, problem}],
        "non_finite": {array: {"count", "rows"}}, "absent_zero_chunks"}``.
    """
    dtypes = dtypes or {}
    jobs = [(name, arr, c) for name, arr in arrays.items() for c in committed_chunks(arr, n_rows)]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="verify", unit="chunk", leave=False)
    damaged: list[dict[str, Any]] = []
    non_finite: dict[str, dict[str, Any]] = {}
    absent = 0
    nbytes = 0
    presence = {name: ChunkPresence(arr) for name, arr in arrays.items()}
    sizes = {name: raw_chunk_bytes(arr) for name, arr in arrays.items()}
    for name, arr, c in jobs:
        if bar is not None:
            bar.update(1)
        rc = int(arr.chunks[0])
        a, b = chunk_span(c[0], rc, n_rows)
        pres = presence[name]
        entry = {"array": name, "chunk": pres.key(c), "rows": [a, b - 1]}
        if pres.missing([c]):
            if strict or name == "grads":
                damaged.append({**entry, "problem": "missing"})
            else:
                absent += 1
            continue
        region = tuple(
            slice(k * s, min((k + 1) * s, int(n))) for k, s, n in zip(c, arr.chunks, arr.shape, strict=True)
        )
        try:
            if sizes[name] is not None:
                path = pres.path(c)
                with open(path, "rb") as f:  # type: ignore[arg-type]
                    raw = f.read()
                if len(raw) != sizes[name]:
                    what = "truncated" if len(raw) < sizes[name] else "too long"
                    damaged.append({**entry, "problem": f"{what}: {len(raw)} bytes, expected {sizes[name]}"})
                    continue
                nbytes += len(raw)
                block = np.frombuffer(raw, dtype=np.dtype(arr.dtype)).reshape(tuple(int(s) for s in arr.chunks))
                block = block[: b - a]
            else:
                block = np.asarray(arr[(slice(a, b), *region[1:])])
                nbytes += block.nbytes
        except Exception as exc:  # noqa: BLE001 - any decoding failure is damage to report
            damaged.append({**entry, "problem": f"unreadable ({type(exc).__name__}: {exc})"})
            continue
        bad = _nonfinite(np.ascontiguousarray(block), dtypes.get(name))
        if bad.any():
            rec = non_finite.setdefault(name, {"count": 0, "rows": []})
            rec["count"] += int(bad.sum())
            rows = (np.flatnonzero(bad) + a).tolist()
            rec["rows"] = sorted(set(rec["rows"]) | set(rows))[:20]
    if bar is not None:
        bar.close()
    return {
        "ok": not damaged and not non_finite,
        "chunks": len(jobs),
        "bytes": nbytes,
        "damaged": damaged,
        "non_finite": non_finite,
        "absent_zero_chunks": absent,
    }


class CheckedArray:
    """A 2-D zarr array as dask reads it (``dask.array.from_array``), block by block, with checks.

    A block whose chunks are not all stored (in a store that writes every chunk),
    or that fails to decode, raises :class:`StoreDamagedError` instead of reading
    as fill. Plain attributes only, so a distributed scheduler can ship it.
    """

    def __init__(self, array: Any, path: str, n_rows: int, strict: bool) -> None:
        self.array, self.path, self.n_rows, self.strict = array, path, int(n_rows), strict
        self.shape = tuple(int(s) for s in array.shape)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)

    def __getitem__(self, sel: tuple[slice, ...]) -> np.ndarray:
        rows, cols = (s.indices(n) for s, n in zip(sel, self.shape, strict=True))
        rc, cc = (int(c) for c in self.array.chunks)
        if self.strict:
            pres = ChunkPresence(self.array)
            coords = [(i, j) for i in row_chunks(slice(rows[0], rows[1]), rc) for j in col_chunks(cols[0], cols[1], cc)]
            missing = pres.missing(coords)
            if missing:
                i = missing[0][0]
                raise damage_error(self.path, "grads", pres.key(missing[0]), chunk_span(i, rc, self.n_rows),
                                   self.n_rows, "missing", len(missing) - 1)
        try:
            return np.asarray(self.array[sel])
        except (RuntimeError, ValueError, OSError) as exc:
            raise StoreDamagedError(
                f"{self.path}: reading rows {rows[0]}..{rows[1] - 1}, columns {cols[0]}..{cols[1] - 1} failed "
                f"({type(exc).__name__}: {exc}); a chunk is damaged: `gradspec info --verify {self.path}` finds it"
            ) from exc
