"""Lazy arrays whose every read is checked: a spectrum store's ``V`` (:class:`CheckedView`) and
a gradient store's ``grads`` as Dask reads it (:class:`CheckedArray`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gradspec.store._checksum import FOREIGN, corrupt_chunks
from gradspec.store._checksum import PROBLEM as CORRUPT
from gradspec.store._integrity import (
    ArrayChecker,
    ChunkPresence,
    chunk_region,
    chunk_span,
    col_chunks,
    damage_error,
    row_chunks,
    unreadable,
)
from gradspec.store._rowsums import first_mismatch


class CheckedView:
    """A lazy 2-D zarr array read through :meth:`ArrayChecker.read` (``SpectrumStore.V``): each
    slice checks the chunks it touches, and a chunk that fails its checksum is named."""

    def __init__(self, checker: ArrayChecker, name: str, array: Any) -> None:
        self._checker, self._name, self._array = checker, name, array
        self.shape = tuple(int(s) for s in array.shape)
        self.chunks = tuple(int(c) for c in array.chunks)
        self.dtype = np.dtype(array.dtype)
        self.ndim = len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, sel: Any) -> np.ndarray:
        return self._checker.read(self._name, self._array, sel)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype, copy=False)


class CheckedArray:
    """A 2-D zarr array as dask reads it (``dask.array.from_array``), block by block, with checks.

    A block whose chunks are not all stored (in a store that writes every chunk),
    or that fails to decode, raises :class:`StoreDamagedError` instead of reading
    as fill. Plain attributes only, so a distributed scheduler can ship it.
    """

    def __init__(self, array: Any, path: str, n_rows: int, strict: bool,
                 row_sums: np.ndarray | None = None) -> None:
        self.array, self.path, self.n_rows, self.strict = array, path, int(n_rows), strict
        self.row_sums = row_sums  # the committed rows' recorded segment CRCs (``_rowsums``), if any
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
                                   self.n_rows, pres.problem(missing[0]) or "missing", len(missing) - 1)
        try:
            block = np.asarray(self.array[sel])
        except (RuntimeError, ValueError, OSError) as exc:
            bad = corrupt_chunks(self.array, chunk_region(self.array, rows[0], rows[1], cols[:2]))
            if bad:
                raise damage_error(self.path, "grads", ChunkPresence(self.array).key(bad[0]),
                                   chunk_span(bad[0][0], rc, self.n_rows), self.n_rows, CORRUPT,
                                   len(bad) - 1) from exc
            raise unreadable(self.path, f"rows {rows[0]}..{rows[1] - 1}, columns {cols[0]}..{cols[1] - 1}",
                             exc) from exc
        stop = min(rows[1], self.n_rows)
        if self.row_sums is not None and stop > rows[0] and rows[2] == 1 and cols[2] == 1:
            bad = first_mismatch(self.row_sums, np.arange(rows[0], stop), cols[0], cols[1],
                                 block[: stop - rows[0]], (rc, cc), self.shape[1])
            if bad is not None:
                raise damage_error(self.path, "grads", ChunkPresence(self.array).key(bad),
                                   chunk_span(bad[0], rc, self.n_rows), self.n_rows, FOREIGN)
        return block
