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

A chunk whose bytes changed is damage too, in arrays that carry per-chunk
checksums (``_checksum``): zarr (or the fast reader) refuses it, and the
error names the chunk whose checksum fails (``corrupt_chunks``).
"""

from __future__ import annotations

import logging
import math
import os
import stat
import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

import numpy as np

from gradspec._files import FileTooLarge, NotRegularFile, read_regular
from gradspec.store._checksum import FOREIGN, TRAILER, corrupt_chunks, has_checksum, raw_matches
from gradspec.store._checksum import PROBLEM as CORRUPT
from gradspec.store._fastread import LINKED, NOT_REGULAR, local_root

logger = logging.getLogger(__name__)

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

    def problem(self, coords: tuple[int, ...]) -> str | None:
        """What is wrong at a chunk's name: None when it is stored, else ``"missing"``, or on
        local disk `LINKED` (a symbolic link, read through by no path) or `NOT_REGULAR`."""
        if self._root is None:
            return "missing" if self.missing([coords]) else None
        return _local_problem(self.path(coords))  # type: ignore[arg-type]

    def missing(self, coords: Iterable[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The chunks of ``coords`` that are not stored as a regular file of their own (missing,
        or on local disk a symbolic link or not a regular file: :meth:`problem` says which)."""
        coords = list(coords)
        if self._root is not None:
            return [c for c in coords if _local_problem(self.path(c)) is not None]  # type: ignore[arg-type]
        if self._listed is None:
            self._listed = self._list()
        miss = [c for c in coords if self.key(c) not in self._listed]
        if miss:
            self._listed = self._list()
            miss = [c for c in miss if self.key(c) not in self._listed]
        return miss


def _local_problem(path: str, size: int | None = None) -> str | None:
    """None when ``path`` is a regular file (not a link to one) and, given ``size``, of that
    many bytes; else what it is instead (one ``lstat``)."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    if stat.S_ISLNK(info.st_mode):
        return LINKED
    if not stat.S_ISREG(info.st_mode):
        return NOT_REGULAR
    if size is not None and info.st_size != size:
        return f"{'truncated' if info.st_size < size else 'too long'}: {info.st_size} bytes, expected {size}"
    return None


def chunk_problems(presence: ChunkPresence, coords: Iterable[tuple[int, ...]],
                   size: int | None) -> list[tuple[tuple[int, ...], str]]:
    """The chunks of ``coords`` that are missing or, given their byte ``size``, the wrong size.

    ``size`` is :func:`raw_chunk_bytes` of the array (None: sizes are not checked);
    sizes are checked with a stat on local disk only.

    Returns:
        ``[(coords, problem)]``, problem ``"missing"``, `LINKED`, `NOT_REGULAR` or
        ``"truncated: ..."`` / ``"too long: ..."``.
    """
    coords = list(coords)
    if not presence.local:
        return [(c, "missing") for c in presence.missing(coords)]
    found = [(c, p) for c in coords if (p := _local_problem(presence.path(c), size)) is not None]  # type: ignore[arg-type]
    sized = ("truncated", "too long")  # the chunks not stored first, then those of the wrong size
    return [e for e in found if not e[1].startswith(sized)] + [e for e in found if e[1].startswith(sized)]


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
    """The byte size of every chunk file when the array is local and uncompressed, else None
    (the chunk's bytes, and its 4-byte checksum in an array that carries one)."""
    from zarr.codecs import BytesCodec

    try:
        codecs = tuple(array.metadata.codecs)
    except AttributeError:
        return None
    crc = has_checksum(array)
    codecs = codecs[:-1] if crc else codecs
    if local_root(array) is None or len(codecs) != 1 or not isinstance(codecs[0], BytesCodec):
        return None
    endian = codecs[0].endian
    if np.dtype(array.dtype).itemsize > 1 and (endian is None or endian.value != sys.byteorder):
        return None
    return math.prod(int(c) for c in array.chunks) * np.dtype(array.dtype).itemsize + (TRAILER if crc else 0)


def chunk_region(array: Any, start: int, stop: int, cols: tuple[int, int] | None = None) -> list[tuple[int, ...]]:
    """The chunks holding rows [start, stop) (of columns ``cols``, every column by default)."""
    rows = range(start // int(array.chunks[0]), -(-stop // int(array.chunks[0])))
    if len(array.shape) == 1:
        return [(i,) for i in rows]
    c0, c1 = cols or (0, int(array.shape[1]))
    return [(i, j) for i in rows for j in col_chunks(c0, c1, int(array.chunks[1]))]


def unreadable(path: str, what: str, exc: BaseException) -> StoreDamagedError:
    """The error of a read that failed, where no chunk can be named."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return StoreDamagedError(f"{path}: reading {what} failed ({type(exc).__name__}: {first}); a chunk is "
                             f"damaged: `gradspec info --verify {path}` finds it")


def _nonfinite(values: np.ndarray, dtype: str | None, nan_ok: bool = False) -> np.ndarray:
    """Per row (first axis): how many entries are NaN or ±inf (only ±inf with ``nan_ok``)."""
    if dtype == "bfloat16":  # raw bits: exponent all ones
        bad = (values.view(np.uint16) & np.uint16(0x7F80)) == np.uint16(0x7F80)
    elif values.dtype.kind == "f":
        bad = np.isinf(values) if nan_ok else ~np.isfinite(values)
    else:
        return np.zeros(values.shape[0], dtype=np.int64)
    return bad.reshape(values.shape[0], -1).sum(axis=1)


def verify_arrays(
    arrays: dict[str, Any],
    n_rows: int,
    *,
    strict: bool,
    dtypes: dict[str, str] | None = None,
    nan_ok: Collection[str] = (),
    progress: bool = False,
    bound: dict[str, Callable[[tuple[int, ...], np.ndarray, int | None], bool]] | None = None,
    start: int = 0,
) -> dict[str, Any]:
    """Read every chunk of every committed row of ``arrays`` ({name: zarr array}), or of the rows
    from ``start`` on (the chunks holding them).

    Args:
        arrays: the store's row arrays (rows on the first axis).
        n_rows: committed rows.
        strict: the store writes every chunk, so a missing one is damage; otherwise a
            missing chunk of a metadata array may be a skipped all-zero chunk and is
            only counted (a missing gradient chunk is still reported).
        dtypes: logical dtype per array where it differs from the stored one (bfloat16).
        nan_ok: arrays where NaN is a recorded value ("unknown"), not damage; ±inf still is.
        progress: show a progress bar on stderr.
        bound: per array, ``bound(coords, chunk, checksum)``: whether an intact chunk (read whole
            from its file with the ``checksum`` it ends with, or decoded by zarr: None and its
            rows below ``n_rows``) holds the rows its store recorded (``_rowsums``); a chunk that
            does not is damaged, problem ``_checksum.FOREIGN``.

    Returns:
        ``{"ok", "chunks", "bytes", "damaged": [{array, chunk, rows, problem}],
        "non_finite": {array: {"count", "rows"}}, "absent_zero_chunks", "checksummed_chunks"}``:
        ``checksummed_chunks`` counts the chunks read whose checksum was checked (a chunk
        that fails it is damaged, problem ``"corrupt: ..."``).
    """
    dtypes = dtypes or {}
    jobs = [(name, arr, c) for name, arr in arrays.items() for c in committed_chunks(arr, n_rows, start)]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="verify", unit="chunk", leave=False)
    damaged: list[dict[str, Any]] = []
    non_finite: dict[str, dict[str, Any]] = {}
    absent = 0
    nbytes = 0
    checked = 0
    presence = {name: ChunkPresence(arr) for name, arr in arrays.items()}
    sizes = {name: raw_chunk_bytes(arr) for name, arr in arrays.items()}
    for name, arr, c in jobs:
        if bar is not None:
            bar.update(1)
        check = (bound or {}).get(name, lambda c, block, crc: True)
        rc = int(arr.chunks[0])
        a, b = chunk_span(c[0], rc, n_rows)
        pres = presence[name]
        entry = {"array": name, "chunk": pres.key(c), "rows": [a, b - 1]}
        odd = pres.problem(c)
        if odd is not None:
            if odd != "missing" or strict or name == "grads":
                damaged.append({**entry, "problem": odd})
            else:
                absent += 1
            continue
        region = tuple(
            slice(k * s, min((k + 1) * s, int(n))) for k, s, n in zip(c, arr.chunks, arr.shape, strict=True)
        )
        try:
            if sizes[name] is not None:
                path = pres.path(c)
                try:  # without blocking (a FIFO in a chunk's place hung the check), a regular file only
                    raw = read_regular(path, max_bytes=sizes[name], follow_links=False)  # type: ignore[arg-type]
                except FileTooLarge as exc:
                    damaged.append({**entry, "problem": f"too long: {exc.size} bytes, expected {sizes[name]}"})
                    continue
                except NotRegularFile as exc:  # replaced since the stat above: what it is now
                    damaged.append({**entry, "problem": LINKED if exc.linked else NOT_REGULAR})
                    continue
                if len(raw) != sizes[name]:
                    what = "truncated" if len(raw) < sizes[name] else "too long"
                    damaged.append({**entry, "problem": f"{what}: {len(raw)} bytes, expected {sizes[name]}"})
                    continue
                if has_checksum(arr) and not raw_matches(raw):
                    damaged.append({**entry, "problem": CORRUPT})
                    continue
                nbytes += len(raw)
                shape = tuple(int(s) for s in arr.chunks)
                block = np.frombuffer(raw, dtype=np.dtype(arr.dtype), count=math.prod(shape)).reshape(shape)
                binds = check(c, block, int.from_bytes(raw[-TRAILER:], "little") if has_checksum(arr) else None)
                block = block[: b - a]
            else:
                block = np.asarray(arr[(slice(a, b), *region[1:])])
                nbytes += block.nbytes
                binds = check(c, block, None)
        except Exception as exc:  # noqa: BLE001 - any decoding failure is damage to report
            problem = CORRUPT if corrupt_chunks(arr, [c]) else f"unreadable ({type(exc).__name__}: {exc})"
            damaged.append({**entry, "problem": problem})
            continue
        checked += has_checksum(arr)
        if not binds:
            damaged.append({**entry, "problem": FOREIGN})
            continue
        bad = _nonfinite(np.ascontiguousarray(block), dtypes.get(name), name in nan_ok)
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
        "checksummed_chunks": checked,
    }


class ArrayChecker:
    """Chunk checks for the arrays of a store that writes every chunk of them (a spectrum store).

    Rows are on each array's first axis and every row of an array given to it is
    written: a missing, short or long chunk is damage (:class:`StoreDamagedError`).
    In a store that predates writing all-zero chunks (``strict=False``) a missing
    chunk may be one zarr skipped, and is warned about once instead.

    Args:
        path: the store, for messages.
        strict: the store records :data:`ALL_CHUNKS_KEY`.
        fix: what the reader can do about damage, ending the error message.
    """

    def __init__(self, path: str, *, strict: bool, fix: str, manifest: Any = None) -> None:
        self.path, self.strict, self.fix = path, strict, fix
        self.manifest = manifest  # a finished store's recorded chunk CRCs (``_manifest.Manifest``), if any
        self._warned: set[str] = set()

    def problems(self, name: str, array: Any, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        """``[{array, chunk, rows, problem}]`` for the chunks holding rows [start, stop) (a stat or a listing each)."""
        n = int(array.shape[0])
        stop = n if stop is None else min(int(stop), n)
        if stop <= start:
            return []
        pres = ChunkPresence(array)
        rc = int(array.chunks[0])
        out = []
        for c, problem in chunk_problems(pres, committed_chunks(array, stop, start), raw_chunk_bytes(array)):
            a, b = chunk_span(c[0], rc, n)
            out.append({"array": name, "chunk": pres.key(c), "rows": [a, b - 1], "problem": problem})
        return out

    def damage(self, bad: list[dict[str, Any]], n_rows: int) -> StoreDamagedError:
        first = bad[0]
        a, b = first["rows"]
        more = len(bad) - 1
        extra = f" (and {more} more damaged chunks; `gradspec info --verify` lists them)" if more else ""
        return StoreDamagedError(
            f"{self.path} is damaged: chunk {first['array']}/{first['chunk']}, holding rows {a}..{b} of "
            f"{n_rows}, is {first['problem']}{extra}; reading on would give wrong values: {self.fix}"
        )

    def require(self, name: str, array: Any, start: int = 0, stop: int | None = None) -> None:
        """Raise for a damaged chunk holding rows [start, stop) of ``array`` (warn once for an absent one
        in a store that predates writing every chunk)."""
        bad = self.problems(name, array, start, stop)
        if not bad:
            return
        if not self.strict:
            wrong = [d for d in bad if d["problem"] != "missing"]
            if not wrong:
                if name not in self._warned:
                    self._warned.add(name)
                    logger.warning(
                        "%s: chunk %s/%s is absent and reads as zeros; this store predates gradspec writing "
                        "every chunk, so it may be an all-zero chunk or a lost file: `gradspec info --verify` "
                        "lists them", self.path, name, bad[0]["chunk"],
                    )
                return
            bad = wrong
        raise self.damage(bad, int(array.shape[0]))

    def read(self, name: str, array: Any, sel: Any = None) -> np.ndarray:
        """``array[sel]`` (all of it by default) after checking the chunks it touches; a chunk that fails
        to decode or its checksum raises :class:`StoreDamagedError` (naming it, for a checksum)."""
        sel = slice(None) if sel is None else sel
        rows = sel[0] if isinstance(sel, tuple) and sel else sel
        n = int(array.shape[0])
        a, b = 0, n
        if isinstance(rows, slice):
            a, b, step = rows.indices(n)
            b = b if step > 0 else a
            self.require(name, array, a, b)
        else:
            self.require(name, array)
        try:
            out = np.asarray(array[sel])
        except (RuntimeError, ValueError, OSError) as exc:
            bad = corrupt_chunks(array, chunk_region(array, a, b))
            if bad:
                raise self.damage(self._entries(name, array, bad, CORRUPT), n) from exc
            raise unreadable(self.path, name, exc) from exc
        moved = [] if self.manifest is None else self.manifest.moved(name, array, chunk_region(array, a, b))
        if moved:
            raise self.damage(self._entries(name, array, moved, FOREIGN), n)
        return out

    def _entries(self, name: str, array: Any, coords: list[tuple[int, ...]], problem: str) -> list[dict[str, Any]]:
        rc, n, pres = int(array.chunks[0]), int(array.shape[0]), ChunkPresence(array)
        return [{"array": name, "chunk": pres.key(c), "rows": [lo, hi - 1], "problem": problem}
                for c, (lo, hi) in ((c, chunk_span(c[0], rc, n)) for c in coords)]

    def verify(self, arrays: dict[str, Any], *, progress: bool = False,
               finite_not_required: tuple[str, ...] = ()) -> dict[str, Any]:
        """:func:`verify_arrays` over arrays of different row counts, merged.

        ``finite_not_required`` names arrays in which NaN/inf is a value (a residual not measured).
        """
        by_rows: dict[int, dict[str, Any]] = {}
        for name, arr in arrays.items():
            by_rows.setdefault(int(arr.shape[0]), {})[name] = arr
        out: dict[str, Any] = {"ok": True, "chunks": 0, "bytes": 0, "damaged": [], "non_finite": {},
                               "absent_zero_chunks": 0, "checksummed_chunks": 0}
        for n, group in by_rows.items():
            bound = None if self.manifest is None else {k: self.manifest.bound(k, a) for k, a in group.items()}
            rep = verify_arrays(group, n, strict=self.strict, progress=progress, bound=bound)
            for key in ("chunks", "bytes", "absent_zero_chunks", "checksummed_chunks"):
                out[key] += rep[key]
            out["damaged"] += rep["damaged"]
            out["non_finite"].update({k: v for k, v in rep["non_finite"].items() if k not in finite_not_required})
        out["ok"] = not out["damaged"] and not out["non_finite"]
        return out

