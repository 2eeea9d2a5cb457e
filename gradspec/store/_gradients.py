"""The gradient store: a chunked Zarr v3 matrix of gradient rows.

Layout of a store directory::

    STORE/zarr.json        group attributes: kind, format, parameter layout, run config,
                           committed row count, status
    STORE/grads/           (capacity, p) rows = gradient samples, columns = flattened
                           selected parameters; chunks (rows_per_chunk, cols_per_chunk)
    STORE/meta/<field>/    one 1-D array per row-metadata field (step, epoch, loss, ...)

Chunking. The default chunk is 32 rows x (8 MiB / (32 x itemsize)) columns,
i.e. 32 x 65,536 in float32 and 32 x 131,072 in 16-bit. Appending is done a
row block at a time (the background writer buffers 32 rows, so every chunk is
written once), and a column block across all r rows — what the spectral
engine streams — is r/32 whole chunks: 512 MB at r = 2000 in float32. No
compression by default: gradients are dense floats that compress poorly and
decompression would halve read bandwidth; ``compressor="zstd"`` is an option.

Crash safety. Rows become visible only through the committed row count
(attribute ``gradspec.rows``), which is advanced after the rows' chunks are
written. Chunks and metadata documents are replaced atomically on local disk
(see ``_zarr``), so a process killed at any moment leaves a store that opens
and shows exactly its committed rows; bytes beyond them are ignored and are
overwritten on resume.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import zarr

from gradspec.store._fastread import ChunkFileReader
from gradspec.store._layout import ParamLayout
from gradspec.store._prefetch import prefetch_iter
from gradspec.store._zarr import (
    create_group,
    disk_numpy_dtype,
    from_disk_dtype,
    open_checked,
    size_on_disk,
    to_disk_dtype,
)

logger = logging.getLogger(__name__)

KIND = "gradients"
ROWS_KEY = "gradspec.rows"
STATUS_KEY = "gradspec.status"
CHUNK_BYTES = 8 * 2**20
DEFAULT_ROWS_PER_CHUNK = 32

#: Row-metadata fields and their dtypes; per-example stores add ``example_index``.
META_FIELDS: dict[str, str] = {
    "step": "int64",
    "epoch": "int32",
    "loss": "float32",
    "batch_size": "int32",
    "norm_mean": "float32",
    "norm_max": "float32",
    "frac_clipped": "float32",
}
PER_EXAMPLE_FIELDS: dict[str, str] = {"example_index": "int64"}

RowSelection = slice | Sequence[int] | np.ndarray | None
ColRanges = Sequence[tuple[int, int]] | None


def _codecs(compressor: str | None):
    if compressor in (None, "none"):
        return None
    from zarr.codecs import BloscCodec, ZstdCodec

    if compressor == "zstd":
        return [ZstdCodec(level=3)]
    if compressor == "blosc":
        return [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")]
    raise ValueError(f"unknown compressor {compressor!r}; choose none, zstd or blosc")


class GradientStore:
    """A gradient matrix on disk: rows = gradient samples, columns = parameters.

    Create with :meth:`create`, open with :meth:`open`. Writing is done by
    :meth:`write_rows` then :meth:`commit` (or :meth:`append` for both); the
    background writer in ``gradspec.store.BackgroundWriter`` does this off the
    training thread.
    """

    def __init__(self, group: zarr.Group, path: str, mode: str) -> None:
        self._group = group
        self.path = str(path)
        self.mode = mode
        attrs = group.attrs.asdict()
        self._layout = ParamLayout.from_list(attrs["gradspec.layout"])
        self._dtype = str(attrs["gradspec.dtype"])
        self._config = dict(attrs.get("gradspec.config", {}))
        self._per_example = bool(attrs.get("gradspec.per_example", False))
        self._rows = int(attrs.get(ROWS_KEY, 0))
        self._status = str(attrs.get(STATUS_KEY, "writing"))
        self._grads = group["grads"]
        self._direct = ChunkFileReader.for_array(self._grads)
        self._meta_fields = dict(META_FIELDS, **(PER_EXAMPLE_FIELDS if self._per_example else {}))
        self._meta = {name: group[f"meta/{name}"] for name in self._meta_fields}
        if self._grads.shape[1] != self._layout.p:
            raise ValueError(f"{self.path!r}: grads has {self._grads.shape[1]} columns but its layout has {self._layout.p}")

    # ------------------------------------------------------------------ create / open
    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        *,
        layout: ParamLayout,
        config: dict[str, Any] | None = None,
        dtype: str = "float32",
        per_example: bool = False,
        rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK,
        cols_per_chunk: int | None = None,
        compressor: str | None = None,
        overwrite: bool = False,
    ) -> GradientStore:
        """Create an empty store for rows of ``layout.p`` columns.

        Args:
            path: a local directory (or a URL zarr accepts).
            layout: the parameter layout of a row.
            config: the run config, saved in the store's attributes.
            dtype: on-disk dtype, ``float32`` | ``float16`` | ``bfloat16``.
            per_example: rows are per-example gradients (adds ``example_index``).
            rows_per_chunk: rows per chunk (the writer's flush unit).
            cols_per_chunk: columns per chunk; default fills 8 MiB chunks.
            compressor: ``None`` | ``"zstd"`` | ``"blosc"``.
            overwrite: replace an existing store at ``path``.
        """
        if dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"unknown gradient dtype {dtype!r}; choose float32, float16 or bfloat16")
        if rows_per_chunk < 1:
            raise ValueError("rows_per_chunk must be >= 1")
        itemsize = 4 if dtype == "float32" else 2
        if cols_per_chunk is None:
            cols_per_chunk = max(1024, CHUNK_BYTES // (rows_per_chunk * itemsize))
        cols_per_chunk = int(min(cols_per_chunk, layout.p))
        attrs = {
            "gradspec.layout": layout.to_list(),
            "gradspec.dtype": dtype,
            "gradspec.config": config or {},
            "gradspec.per_example": per_example,
            "gradspec.created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            ROWS_KEY: 0,
            STATUS_KEY: "writing",
        }
        group = create_group(path, KIND, attrs, overwrite)
        group.create_array(
            "grads",
            shape=(0, layout.p),
            chunks=(rows_per_chunk, cols_per_chunk),
            dtype=disk_numpy_dtype(dtype),
            fill_value=0,
            compressors=_codecs(compressor),
        )
        fields = dict(META_FIELDS, **(PER_EXAMPLE_FIELDS if per_example else {}))
        for name, dt in fields.items():
            group.create_array(f"meta/{name}", shape=(0,), chunks=(4096,), dtype=dt, fill_value=0, compressors=None)
        return cls(group, str(path), "r+")

    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r") -> GradientStore:
        """Open an existing store; ``mode="r"`` (default) is read-only, ``"r+"`` appends."""
        return cls(open_checked(path, KIND, mode), str(path), mode)

    # ------------------------------------------------------------------ properties
    @property
    def n_rows(self) -> int:
        """Committed rows (the only rows readers see)."""
        return self._rows

    @property
    def p(self) -> int:
        return self._layout.p

    @property
    def shape(self) -> tuple[int, int]:
        return (self._rows, self._layout.p)

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def layout(self) -> ParamLayout:
        return self._layout

    @property
    def config(self) -> dict[str, Any]:
        return dict(self._config)

    @property
    def per_example(self) -> bool:
        return self._per_example

    @property
    def status(self) -> str:
        """``"writing"`` until the run that writes it finishes, then ``"complete"``."""
        return self._status

    @property
    def chunks(self) -> tuple[int, int]:
        return tuple(self._grads.chunks)  # type: ignore[return-value]

    @property
    def meta_fields(self) -> dict[str, str]:
        return dict(self._meta_fields)

    def refresh(self) -> None:
        """Re-read the committed row count (for a store another process is writing)."""
        attrs = zarr.open_group(store=self.path, mode="r").attrs.asdict()
        self._rows = int(attrs.get(ROWS_KEY, 0))
        self._status = str(attrs.get(STATUS_KEY, "writing"))

    # ------------------------------------------------------------------ writing
    def _check_writable(self) -> None:
        if self.mode == "r":
            raise ValueError(f"{self.path!r} is open read-only; open it with mode='r+' to write")

    def _ensure_capacity(self, n: int) -> None:
        # Each array is checked on its own: a process killed between two resizes
        # leaves arrays of different capacities (zarr drops out-of-bounds writes).
        cap = self._grads.shape[0]
        rpc = self._grads.chunks[0]
        new = -(-max(n, 2 * cap, rpc) // rpc) * rpc if n > cap else cap
        if new != cap:
            self._grads.resize((new, self.p))
        for arr in self._meta.values():
            if arr.shape[0] < new:
                arr.resize((new,))

    def write_rows(self, start: int, rows: np.ndarray, meta: dict[str, np.ndarray]) -> None:
        """Write ``rows`` (float32, shape (b, p)) at ``start``; not visible until :meth:`commit`."""
        self._check_writable()
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != self.p:
            raise ValueError(f"rows must have shape (b, {self.p}), got {rows.shape}")
        b = rows.shape[0]
        missing = set(self._meta_fields) - set(meta)
        if missing:
            raise ValueError(f"row metadata is missing {sorted(missing)}")
        if start < self._rows:
            raise ValueError(f"cannot overwrite committed rows (start {start} < {self._rows} committed)")
        self._ensure_capacity(start + b)
        self._grads[start : start + b] = to_disk_dtype(rows, self._dtype)
        for name, dt in self._meta_fields.items():
            values = np.asarray(meta[name], dtype=dt).reshape(-1)
            if values.shape[0] != b:
                raise ValueError(f"row metadata {name!r} has {values.shape[0]} values for {b} rows")
            self._meta[name][start : start + b] = values

    def commit(self, n_rows: int) -> None:
        """Make rows ``[0, n_rows)`` visible; their bytes must already be written."""
        self._check_writable()
        if n_rows > self._grads.shape[0]:
            raise ValueError(f"cannot commit {n_rows} rows: only {self._grads.shape[0]} written")
        self._group.attrs.update({ROWS_KEY: int(n_rows)})
        self._rows = int(n_rows)

    def truncate(self, n_rows: int) -> None:
        """Forget committed rows beyond ``n_rows`` (resume from an earlier checkpoint)."""
        if n_rows > self._rows:
            raise ValueError(f"cannot truncate to {n_rows} rows: only {self._rows} are committed")
        self.commit(n_rows)

    def append(self, rows: np.ndarray, meta: dict[str, np.ndarray]) -> None:
        """Write rows after the committed ones and commit them (synchronous)."""
        self.write_rows(self._rows, rows, meta)
        self.commit(self._rows + np.asarray(rows).shape[0])

    def set_status(self, status: str) -> None:
        self._check_writable()
        self._group.attrs.update({STATUS_KEY: status})
        self._status = status

    def update_config(self, **items: Any) -> None:
        """Merge items into the stored run config (e.g. the final epsilon)."""
        self._check_writable()
        self._config.update(items)
        self._group.attrs.update({"gradspec.config": self._config})

    # ------------------------------------------------------------------ reading
    def _row_index(self, rows: RowSelection) -> slice | np.ndarray:
        n = self._rows
        if rows is None:
            return slice(0, n)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(n)
            if step < 1:
                raise ValueError("row slices must have a positive step")
            return slice(start, stop) if step == 1 else np.arange(start, stop, step)
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"row indices must lie in [0, {n}) (the committed rows)")
        return idx

    def n_selected(self, rows: RowSelection) -> int:
        idx = self._row_index(rows)
        return idx.stop - idx.start if isinstance(idx, slice) else int(idx.size)

    def _read(self, idx: slice | np.ndarray, c0: int, c1: int) -> np.ndarray:
        if self._direct is not None:
            if isinstance(idx, slice):
                raw = self._direct.read(idx.start, idx.stop, c0, c1)
            else:
                raw = self._direct.read_rows(idx, c0, c1)
        elif isinstance(idx, slice):
            raw = self._grads[idx, c0:c1]
        else:
            raw = self._grads.get_orthogonal_selection((idx, slice(c0, c1)))
        return from_disk_dtype(np.asarray(raw), self._dtype)

    def read(self, rows: RowSelection = None, cols: slice | None = None) -> np.ndarray:
        """Committed rows (selection) and a column slice as float32."""
        idx = self._row_index(rows)
        c0, c1, step = (cols or slice(None)).indices(self.p)
        if step != 1:
            raise ValueError("column slices must be contiguous")
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
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(offset, block)``: column blocks (n_rows_selected, c) over the selected rows.

        ``offset`` counts columns within the selection (the concatenated
        ``col_ranges``). Blocks end on chunk boundaries; ``prefetch`` blocks are
        read ahead on a background thread.
        """
        idx = self._row_index(rows)
        blocks = self._col_blocks(col_ranges, block_cols)
        offsets = np.cumsum([0] + [b - a for a, b in blocks])[:-1]
        tasks = [(lambda a=a, b=b: self._read(idx, a, b)) for a, b in blocks]
        for off, block in zip(offsets, prefetch_iter(tasks, prefetch), strict=True):
            yield int(off), block

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
        return {name: np.asarray(arr[idx] if isinstance(idx, slice) else arr.get_orthogonal_selection(idx))
                for name, arr in self._meta.items()}

    def to_dask(self, rows: RowSelection = None, col_ranges: ColRanges = None):
        """The committed (selected) rows as a float32 dask array, chunked like the store."""
        import dask.array as da

        arr = da.from_zarr(self._grads)
        idx = self._row_index(rows)
        arr = arr[idx] if isinstance(idx, slice) else arr[idx]
        if col_ranges is not None:
            arr = da.concatenate([arr[:, a:b] for a, b in col_ranges], axis=1)
        dtype = self._dtype
        return arr.map_blocks(from_disk_dtype, dtype, dtype=np.float32)

    # ------------------------------------------------------------------ summary
    def nbytes_on_disk(self) -> int | None:
        return size_on_disk(self.path)

    def summary(self) -> dict[str, Any]:
        """What `gradspec info` shows."""
        meta = self.row_meta()
        m: dict[str, Any] = {}
        if self._rows:
            m = {
                "steps": [int(meta["step"].min()), int(meta["step"].max())],
                "epochs": [int(meta["epoch"].min()), int(meta["epoch"].max())],
                "loss_first_last": [float(meta["loss"][0]), float(meta["loss"][-1])],
                "grad_norm_mean": float(meta["norm_mean"].mean()),
                "grad_norm_max": float(meta["norm_max"].max()),
                "frac_clipped_mean": float(meta["frac_clipped"].mean()),
            }
        params = self._layout.params
        return {
            "kind": KIND,
            "path": self.path,
            "status": self._status,
            "shape": list(self.shape),
            "dtype": self._dtype,
            "chunks": list(self.chunks),
            "per_example": self._per_example,
            "size_on_disk": self.nbytes_on_disk(),
            "layout": {
                "parameters": len(params),
                "p": self.p,
                "first": [s.to_dict() for s in params[:3]],
                "last": params[-1].to_dict(),
            },
            "config": self._config,
            "rows": m,
        }

    def __repr__(self) -> str:
        return f"GradientStore({self.path!r}, rows={self._rows}, p={self.p}, dtype={self._dtype})"
