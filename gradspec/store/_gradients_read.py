"""Reading a gradient store: row selection, row and column blocks, metadata, Dask.

A mixin of :class:`gradspec.store.GradientStore` (its core, ``_gradients``, holds the
arrays this reads); every read is checked against the committed rows and chunks.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np

from gradspec.store._checked_view import CheckedArray
from gradspec.store._gradients_schema import (
    ColRanges,
    RowSelection,
)
from gradspec.store._integrity import (
    StoreDamagedError,
    row_chunks,
)
from gradspec.store._prefetch import prefetch_iter
from gradspec.store._source import as_slice, resolve_rows
from gradspec.store._zarr import (
    from_disk_dtype,
)


def _count(idx: slice | np.ndarray) -> int:
    """Rows a resolved selection (``_row_index``: a run of rows or indices) names."""
    return idx.stop - idx.start if isinstance(idx, slice) else int(idx.size)


class _Ring:
    """``n`` reusable 1-D buffers of ``dtype``; block ``i`` is read into buffer ``i mod n``
    (grown as needed). With a read-ahead of n − 1 blocks, block i's buffer is taken again only
    when block i + n is read, which starts after the consumer asked for block i + 1."""

    def __init__(self, n: int, dtype: np.dtype) -> None:
        self.bufs: list[np.ndarray | None] = [None] * max(1, n)
        self.dtype = dtype

    def slot(self, i: int, size: int) -> np.ndarray:
        j = i % len(self.bufs)
        buf = self.bufs[j]
        if buf is None or buf.size < size:
            buf = self.bufs[j] = np.empty(size, dtype=self.dtype)
        return buf


class GradientReads:
    """The reading half of a :class:`~gradspec.store.GradientStore`."""

    def _row_index(self, rows: RowSelection) -> slice | np.ndarray:
        """The committed rows a selection names, as a slice (a run of rows) or indices.

        ``None`` is every committed row (none in an empty store). Any other selection goes
        through :func:`~gradspec.store.resolve_rows`, the one row-selection rule of
        gradspec: bounds and indices outside the committed rows, a repeated index, a
        boolean mask or a selection of no rows are errors, never clipped or read as fill.
        """
        if rows is None:
            return slice(0, self._rows)
        idx = resolve_rows(rows, self._rows, what="the row selection", distinct=True,
                           counted_in="the rows read")
        return as_slice(idx)

    def n_selected(self, rows: RowSelection) -> int:
        """How many committed rows ``rows`` selects (checked as :meth:`read` checks it)."""
        return _count(self._row_index(rows))

    def _forget_listings(self) -> None:
        """Start of a read: chunks are listed again (remote stores) before they are trusted."""
        for pres in self._presence.values():
            pres.forget()

    def _read(
        self, idx: slice | np.ndarray, c0: int, c1: int, narrow: bool = False, into: np.ndarray | None = None
    ) -> np.ndarray:
        """Rows ``idx`` of columns c0..c1 as float32, or (``narrow``) as stored on disk:
        uint16 bit patterns for bfloat16, float16 for float16 (half the bytes in flight).
        ``into``: a 1-D buffer of the on-disk dtype that a direct read may fill and view."""
        widen = (lambda raw: np.asarray(raw)) if narrow else (lambda raw: from_disk_dtype(np.asarray(raw), self._dtype))
        if self._direct is not None:  # a missing or wrong-sized chunk file raises in the reader
            if isinstance(idx, slice):
                raw = self._direct.read(idx.start, idx.stop, c0, c1, into=into)
            else:
                raw = self._direct.read_rows(idx, c0, c1, into=into)
            return widen(raw)
        self._require(idx, [(c0, c1)])
        # whole column chunks, so that every chunk the read touches is checked against the rows'
        # recorded checksums (found by review: `pca --params` of a compressed store read part of a
        # chunk copied from elsewhere, unchecked, exit 0); zarr decodes the whole chunk anyway
        cc = int(self.chunks[1])
        w0, w1 = (c0, c1) if self._row_sums is None else ((c0 // cc) * cc, min(-(-c1 // cc) * cc, self.p))
        try:
            if isinstance(idx, slice):
                raw = self._grads[idx, w0:w1]
            else:
                raw = self._grads.get_orthogonal_selection((idx, slice(w0, w1)))
        except (RuntimeError, ValueError, OSError) as exc:
            raise self._unreadable("grads", idx, exc, (w0, w1)) from exc
        want = _count(idx)
        if raw.shape[0] != want:
            raise StoreDamagedError(f"{self.path}: grads holds fewer rows than the {self._rows} committed")
        self._check_bound(idx, w0, w1, raw)
        return widen(raw[:, c0 - w0 : c1 - w0] if (w0, w1) != (c0, c1) else raw)

    def read(self, rows: RowSelection = None, cols: slice | None = None) -> np.ndarray:
        """Committed rows (selection) and a column slice as float32."""
        idx = self._row_index(rows)
        c0, c1, step = (cols or slice(None)).indices(self.p)
        if step != 1:
            raise ValueError("column slices must be contiguous")
        self._forget_listings()
        return self._read(idx, c0, c1)

    def _col_blocks(self, col_ranges: ColRanges, block_cols: int | None) -> list[tuple[int, int]]:
        ranges = [(0, self.p)] if col_ranges is None else [(int(a), int(b)) for a, b in col_ranges]
        chunk = self.chunks[1]
        width = chunk if block_cols is None else max(1, int(block_cols))
        blocks = []
        for a, b in ranges:
            if not 0 <= a < b <= self.p:
                raise ValueError(f"column range ({a}, {b}) is outside [0, {self.p})")
            c = a
            while c < b:
                # End at a chunk boundary so that each chunk is read once.
                end = min(b, (c // chunk) * chunk + max(chunk, -(-width // chunk) * chunk))
                blocks.append((c, end))
                c = end
        return blocks

    def iter_col_blocks(
        self,
        *,
        rows: RowSelection = None,
        col_ranges: ColRanges = None,
        block_cols: int | None = None,
        prefetch: int = 2,
        narrow: bool = False,
        reuse: bool = False,
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(offset, block)``: column blocks (n_rows_selected, c) over the selected rows.

        ``offset`` counts columns within the selection (the concatenated
        ``col_ranges``). Blocks end on chunk boundaries; ``prefetch`` blocks are
        read ahead on a background thread. Blocks are float32, or with ``narrow`` as
        stored (bfloat16 as its uint16 bit patterns, float16 as float16): the reader then
        only reads, and whoever multiplies widens panel by panel.

        ``reuse``: a block is valid only until the next one is asked for. Direct reads
        (``_fastread``) then fill a ring of ``prefetch + 1`` buffers instead of a new array a
        block: each new block of hundreds of MB was fresh memory whose first touch (the
        kernel's page faults and zeroing) cost more than the read itself (a 1,500 × 4e5
        float32 store read in 1.62 s, 1.42 s of it CPU, on a 2-core Xeon).
        """
        idx = self._row_index(rows)
        blocks = self._col_blocks(col_ranges, block_cols)
        offsets = np.cumsum([0] + [b - a for a, b in blocks])[:-1]
        self._forget_listings()
        ring = _Ring(prefetch + 1, self._direct.dtype) if reuse and self._direct is not None else None
        n_rows = _count(idx)
        tasks = [
            (lambda i=i, a=a, b=b: self._read(idx, a, b, narrow, None if ring is None else ring.slot(i, n_rows * (b - a))))
            for i, (a, b) in enumerate(blocks)
        ]
        for off, block in zip(offsets, prefetch_iter(tasks, prefetch), strict=True):
            yield int(off), block

    def iter_tiles(
        self,
        *,
        rows: RowSelection = None,
        col_ranges: ColRanges = None,
        tile_rows: int,
        prefetch: int = 2,
    ) -> Iterator[tuple[int, int, np.ndarray]]:
        """Yield ``(row_offset, col_offset, tile)``: the column blocks of :meth:`iter_col_blocks`
        cut into tiles of at most ``tile_rows`` selected rows (float32), one column block after
        another, each block's tiles in row order.

        ``row_offset`` counts rows within the selection, ``col_offset`` columns within it. A
        reader of many rows holds ``prefetch + 1`` tiles instead of as many column blocks of
        all the rows, so its memory is bounded by ``tile_rows`` whatever the selection; tiles
        of a multiple of the chunk rows, on a selection that starts on a chunk boundary, decode
        each chunk once.
        """
        if isinstance(tile_rows, bool) or not isinstance(tile_rows, int | np.integer) or tile_rows < 1:
            raise ValueError(f"tile_rows must be a positive integer, got {tile_rows!r}")
        idx = self._row_index(rows)
        idx = np.arange(idx.start, idx.stop) if isinstance(idx, slice) else idx
        blocks = self._col_blocks(col_ranges, None)
        offsets = np.cumsum([0] + [b - a for a, b in blocks])[:-1]
        tr = int(tile_rows)
        tiles = [(i, int(off), as_slice(idx[i : i + tr]), a, b)
                 for off, (a, b) in zip(offsets, blocks, strict=True) for i in range(0, idx.size, tr)]
        self._forget_listings()
        tasks = [(lambda s=s, a=a, b=b: self._read(s, a, b)) for _, _, s, a, b in tiles]
        for (i, off, *_), tile in zip(tiles, prefetch_iter(tasks, prefetch), strict=True):
            yield i, off, tile

    def iter_row_blocks(
        self,
        *,
        rows: RowSelection = None,
        col_ranges: ColRanges = None,
        block_rows: int | None = None,
        prefetch: int = 2,
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(offset, block)``: row blocks (b, p_selected) of the selection."""
        idx = self._row_index(rows)
        idx = np.arange(idx.start, idx.stop) if isinstance(idx, slice) else idx
        br = max(1, int(block_rows or self.chunks[0]))
        ranges = [(0, self.p)] if col_ranges is None else list(col_ranges)
        self._forget_listings()

        def read(sel: np.ndarray) -> np.ndarray:
            contiguous = sel.size and sel[-1] - sel[0] == sel.size - 1
            s = slice(int(sel[0]), int(sel[-1]) + 1) if contiguous else sel
            parts = [self._read(s, a, b) for a, b in ranges]
            return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

        tasks = [(lambda s=idx[i : i + br]: read(s)) for i in range(0, idx.size, br)]
        for i, block in enumerate(prefetch_iter(tasks, prefetch)):
            yield i * br, block

    def row_meta(self, rows: RowSelection = None) -> dict[str, np.ndarray]:
        """Per-row metadata of the committed (selected) rows."""
        idx = self._row_index(rows)
        if self._strict:
            for name, arr in self._meta.items():
                key = f"meta/{name}"
                pres = self._presence[key]
                pres.forget()
                self._missing(key, pres.missing([(i,) for i in row_chunks(idx, int(arr.chunks[0]))]))
        return {name: self._read_array(f"meta/{name}", idx) for name in self._meta}

    def to_dask(self, rows: RowSelection = None, col_ranges: ColRanges = None):
        """The committed (selected) rows as a float32 dask array, chunked like the store.

        Every chunk the selection touches is checked to be stored before the graph is built.
        """
        import dask.array as da

        idx = self._row_index(rows)
        self._forget_listings()
        self._require(idx, [(0, self.p)] if col_ranges is None else [(int(a), int(b)) for a, b in col_ranges])
        sums = None if self._row_sums is None else self._row_sums.recorded(self._rows, slice(0, self._rows))
        source = CheckedArray(self._grads, self.path, self._rows, self._strict, sums)
        arr = da.from_array(source, chunks=self._grads.chunks, name=f"gradspec-grads-{uuid.uuid4().hex}",
                            asarray=False, fancy=False)
        arr = arr[idx]
        if col_ranges is not None:
            arr = da.concatenate([arr[:, a:b] for a, b in col_ranges], axis=1)
        dtype = self._dtype
        return arr.map_blocks(from_disk_dtype, dtype, dtype=np.float32)

