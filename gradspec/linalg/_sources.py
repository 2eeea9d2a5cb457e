"""Block sources: where the columns of the r×p gradient matrix H come from.

A source yields column blocks ``(offset, block)`` with ``block`` a host array of
shape (r, c) — float32, float64 (in-memory float64 arrays), or as stored for
bfloat16/float16 data (widened by the operator panel by panel) — where r is
the number of *selected* rows and ``offset`` counts columns within the selected
parameter subset. Sources never hold H; the in-memory source yields views.

Row selection: None (all rows; committed rows of a store), a slice
(``slice(300, 1300)``, with a positive stride), or a sequence of row indices.
Parameter subset: glob / ``re:`` patterns resolved through a store's layout,
or explicit column ranges.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

RowSelection = slice | Sequence[int] | np.ndarray | None
ColRanges = Sequence[tuple[int, int]] | None
#: Element types kept narrow in memory and widened panel by panel.
NARROW = ("float16", "bfloat16", "torch.float16", "torch.bfloat16")


class BlockSource(Protocol):
    """What the operator streams from. A block it yields need only stay valid until the next
    one is asked for (a store reads into reused buffers): keep a copy, not the block."""

    shape: tuple[int, int]
    dtype: np.dtype

    def iter_col_blocks(
        self, block_cols: int, prefetch: int
    ) -> Iterator[tuple[int, np.ndarray]]: ...

    def describe(self) -> dict[str, Any]: ...


def parse_rows(text: str | None) -> slice | None:
    """``"300:1300"`` / ``"300:1300:2"`` / ``":500"`` -> a slice (for the CLI)."""
    if text is None or text == "":
        return None
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"--rows {text!r} is not START:STOP[:STEP] (e.g. 300:1300)")
    try:
        vals = [int(s) if s.strip() else None for s in parts]
    except ValueError:
        raise ValueError(
            f"--rows {text!r} is not START:STOP[:STEP] with integers (e.g. 300:1300)"
        ) from None
    return slice(*vals)


def row_index(rows: RowSelection, n: int) -> slice | np.ndarray:
    """Normalize a row selection against n available rows; raise on an empty or bad one.

    Strict (``gradspec.store.resolve_rows``): bounds beyond the n rows are an
    error, not clipped, so ``--rows 50:200`` of 100 rows never means rows 50..99.
    """
    from gradspec.store import as_slice, resolve_rows

    idx = resolve_rows(rows, n, what="--rows", distinct=True)
    if rows is None or isinstance(rows, slice):
        return as_slice(idx)
    return np.asarray(rows, dtype=np.int64).reshape(-1)


def describe_rows(rows: RowSelection) -> Any:
    if rows is None:
        return None
    if isinstance(rows, slice):
        return {"start": rows.start, "stop": rows.stop, "step": rows.step}
    arr = np.asarray(rows).reshape(-1)
    return {"indices": arr.tolist()} if arr.size <= 64 else {"n_indices": int(arr.size)}


def _check_ranges(col_ranges: ColRanges, p: int) -> list[tuple[int, int]]:
    ranges = [(0, p)] if col_ranges is None else [(int(a), int(b)) for a, b in col_ranges]
    if not ranges or sum(b - a for a, b in ranges) == 0:
        raise ValueError("the parameter selection is empty; check --params")
    for a, b in ranges:
        if not 0 <= a < b <= p:
            raise ValueError(f"column range ({a}, {b}) is outside [0, {p})")
    ordered = sorted(ranges)
    for (a0, b0), (a1, b1) in zip(ordered, ordered[1:], strict=False):
        if a1 < b0:
            raise ValueError(
                f"column ranges ({a0}, {b0}) and ({a1}, {b1}) overlap: columns {a1}..{min(b0, b1) - 1} "
                "would count twice in H; pass disjoint ranges"
            )
    return ranges


class ArraySource:
    """An in-memory numpy array or torch tensor (r, p); blocks are views.

    float16 arrays and float16/bfloat16 tensors stay as they are (no float32 copy of H):
    the operator widens each panel as it multiplies it (``_precision.cast_into``);
    ``dtype`` is then float32, the dtype that holds their numbers exactly.
    """

    def __init__(
        self, array: Any, *, rows: RowSelection = None, col_ranges: ColRanges = None
    ) -> None:
        if hasattr(array, "detach"):  # torch tensor
            array = array.detach().cpu()
            if str(array.dtype) not in NARROW:
                array = array.numpy()
        else:
            array = np.asarray(array)
        if array.ndim != 2:
            raise ValueError(f"H must be a 2-D (rows, parameters) array, got shape {tuple(array.shape)}")
        narrow = str(array.dtype).removeprefix("torch.") in NARROW
        if not narrow and array.dtype not in (np.float32, np.float64):
            array = array.astype(np.float32)
        idx = row_index(rows, array.shape[0])
        self._rows = rows
        self._a = array[idx]
        self._ranges = _check_ranges(col_ranges, array.shape[1])
        self.shape = (self._a.shape[0], sum(b - a for a, b in self._ranges))
        self.dtype = np.dtype(np.float32) if narrow else self._a.dtype

    def iter_col_blocks(
        self, block_cols: int, prefetch: int = 0
    ) -> Iterator[tuple[int, np.ndarray]]:
        off = 0
        for a, b in self._ranges:
            for c in range(a, b, block_cols):
                e = min(b, c + block_cols)
                yield off + (c - a), self._a[:, c:e]
            off += b - a

    def describe(self) -> dict[str, Any]:
        return {"source": "array", "rows": describe_rows(self._rows), "col_ranges": self._ranges}


class StoreSource:
    """Adapter over a ``gradspec.store.GradientStore`` (its committed rows)."""

    def __init__(
        self,
        store: Any,
        *,
        rows: RowSelection = None,
        params: str | Sequence[str] | None = None,
        col_ranges: ColRanges = None,
    ) -> None:
        if store.n_rows == 0:
            raise ValueError(
                f"{store.path!r} has no committed rows yet; wait for `gradspec collect` to write some"
            )
        if params is not None and col_ranges is not None:
            raise ValueError("give either params (patterns) or col_ranges, not both")
        if params is not None:
            col_ranges = store.layout.column_ranges(params)
        self._ranges = _check_ranges(col_ranges, store.p)
        self._idx = row_index(rows, store.n_rows)
        self._store, self._rows_sel, self._params = store, rows, params
        self._committed = int(store.n_rows)
        self._abs = (
            np.arange(self._idx.start, self._idx.stop, dtype=np.int64)
            if isinstance(self._idx, slice)
            else np.asarray(self._idx, dtype=np.int64)
        )
        self._digest: str | None = None
        self.shape = (int(self._abs.size), sum(b - a for a, b in self._ranges))
        self.dtype = np.dtype(np.float32)

    @property
    def chunk_cols(self) -> int:
        return int(self._store.chunks[1])

    @property
    def read_itemsize(self) -> int:
        """Bytes per entry on disk (bfloat16 and float16 stores: 2)."""
        return 2 if str(getattr(self._store, "dtype", "float32")) in NARROW else 4

    def row_indices(self) -> np.ndarray:
        """Absolute indices of the selected rows in the store."""
        return self._abs.copy()

    def iter_col_blocks(
        self, block_cols: int, prefetch: int = 2
    ) -> Iterator[tuple[int, Any]]:
        """Blocks as stored: float32, float16 (numpy), or bfloat16 (a torch tensor viewing the
        stored bits); the operator widens narrow ones panel by panel (``_precision.cast_into``),
        so a block in flight takes half the memory of a float32 copy and no full-block
        temporary is made. A block is valid until the next one is asked for: the store reads
        into reused buffers (``GradientStore.iter_col_blocks(reuse=True)``)."""
        dtype = str(getattr(self._store, "dtype", "float32"))
        blocks = self._store.iter_col_blocks(
            rows=self._idx, col_ranges=self._ranges, block_cols=block_cols, prefetch=prefetch,
            narrow=dtype in NARROW, reuse=True,
        )
        for off, block in blocks:
            if dtype == "bfloat16":
                import torch

                block = torch.from_numpy(np.ascontiguousarray(block).view(np.int16)).view(torch.bfloat16)
            yield off, block

    def to_dask(self):
        return self._store.to_dask(rows=self._idx, col_ranges=self._ranges)

    def describe(self) -> dict[str, Any]:
        """What a spectrum records of its source (see ``gradspec.store.SpectrumStore``)."""
        from gradspec.store import config_digest, describe_row_indices, resolved_path, rows_digest

        if self._digest is None:
            self._digest = rows_digest(self._store, self._abs)
        config = dict(getattr(self._store, "config", {}) or {})
        return {
            "source": "gradient-store",
            "path": str(self._store.path),
            "abspath": resolved_path(self._store.path),
            "committed_rows": self._committed,
            "status": getattr(self._store, "status", None),
            "rows": describe_rows(self._rows_sel),
            "rows_resolved": describe_row_indices(self._abs),
            "rows_digest": self._digest,
            "config_digest": config_digest(config),
            "params": self._params
            if self._params is None or isinstance(self._params, str)
            else list(self._params),
            "col_ranges": self._ranges,
            "layout": self._store.layout.to_list(),
            "per_example": bool(getattr(self._store, "per_example", False)),
            "row_kind": self._store.row_kind.to_dict() if hasattr(self._store, "row_kind") else None,
            "run": {
                key: config.get(key)
                for key in ("n_train", "final_epsilon", "delta", "steps", "task", "task_options")
                if config.get(key) is not None
            },
        }


class DaskSource:
    """A dask array (r, p) streamed locally column block by column block."""

    def __init__(
        self, array: Any, *, rows: RowSelection = None, col_ranges: ColRanges = None
    ) -> None:
        import dask.array as da

        if array.ndim != 2:
            raise ValueError(f"H must be a 2-D (rows, parameters) array, got shape {array.shape}")
        idx = row_index(rows, array.shape[0])
        arr = array[idx]
        self._ranges = _check_ranges(col_ranges, array.shape[1])
        if col_ranges is not None:
            arr = da.concatenate([arr[:, a:b] for a, b in self._ranges], axis=1)
        if arr.dtype not in (np.float32, np.float64):
            arr = arr.astype(np.float32)
        self.array = arr
        self._rows = rows
        self.shape = tuple(int(s) for s in arr.shape)
        self.dtype = np.dtype(arr.dtype)

    def iter_col_blocks(
        self, block_cols: int, prefetch: int = 0
    ) -> Iterator[tuple[int, np.ndarray]]:
        for c in range(0, self.shape[1], block_cols):
            yield c, np.asarray(self.array[:, c : c + block_cols].compute())

    def to_dask(self):
        return self.array

    def describe(self) -> dict[str, Any]:
        return {"source": "dask", "rows": describe_rows(self._rows), "col_ranges": self._ranges}


def make_source(
    source: Any,
    *,
    rows: RowSelection = None,
    params: str | Sequence[str] | None = None,
    col_ranges: ColRanges = None,
) -> BlockSource:
    """A block source for a store path, a GradientStore, a numpy/torch array or a dask array."""
    if isinstance(source, (ArraySource, StoreSource, DaskSource)):
        return source
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        from gradspec.store import GradientStore

        source = GradientStore.open(source, mode="r")
    if hasattr(source, "iter_col_blocks") and hasattr(source, "layout"):
        return StoreSource(source, rows=rows, params=params, col_ranges=col_ranges)
    if params is not None:
        raise ValueError(
            "params (parameter patterns) need a gradient store with a layout; pass col_ranges instead"
        )
    if type(source).__module__.startswith("dask"):
        return DaskSource(source, rows=rows, col_ranges=col_ranges)
    if isinstance(source, np.ndarray) or hasattr(source, "detach"):
        return ArraySource(source, rows=rows, col_ranges=col_ranges)
    raise TypeError(
        f"cannot read a gradient matrix from {type(source).__name__}; pass a gradient store path, "
        "a GradientStore, a numpy array, a torch tensor or a dask array"
    )
