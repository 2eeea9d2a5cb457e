"""The gradient store: a chunked Zarr v3 matrix of gradient rows.

Layout of a store directory::

    STORE/zarr.json        group attributes: kind, format, parameter layout, run config,
                           committed row count, status
    STORE/grads/           (capacity, p) rows = gradient samples, columns = flattened
                           selected parameters; chunks (rows_per_chunk, cols_per_chunk)
    STORE/meta/<field>/    one 1-D array per row-metadata field (step, epoch, loss, ...)
    STORE/dtype_stats/     (16-bit stores) per row: what the conversion from float32 lost

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
overwritten on resume. Every chunk is stored, even an all-zero one, so a
missing chunk of a committed row is damage that readers report instead of
reading zeros (``_integrity``). When the writing run finishes the arrays are
shrunk to the committed rows, so that plain zarr sees exactly them; see
docs/store-format.md.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import zarr

from gradspec._layout import ParamLayout
from gradspec.store import _precision
from gradspec.store._fastread import ChunkFileReader
from gradspec.store._integrity import (
    ALL_CHUNKS_KEY,
    CheckedArray,
    ChunkPresence,
    StoreDamagedError,
    chunk_span,
    col_chunks,
    committed_chunks,
    damage_error,
    row_chunks,
    verify_arrays,
)
from gradspec.store._prefetch import prefetch_iter
from gradspec.store._source import as_slice, resolve_rows
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
DTYPE_REPORT_KEY = "gradspec.dtype_report"
#: What ``gradspec.status`` may say: being written, or finished by its run.
STATUSES = ("writing", "complete")
DTYPES = ("float32", "float16", "bfloat16")
STATS_ARRAY = "dtype_stats"
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
    training thread. A committed row never reads as zeros: a missing or damaged
    chunk raises :class:`~gradspec.store.StoreDamagedError` (:meth:`verify`
    reads everything).
    """

    def __init__(self, group: zarr.Group, path: str, mode: str) -> None:
        self.path = str(path)
        self.mode = mode
        self._warned: set[str] = set()
        self._load(group)

    def _load(self, group: zarr.Group) -> None:
        """Read and check the attributes and arrays of ``group``."""
        self._group = group
        attrs = group.attrs.asdict()
        damaged = f"the store is damaged; restore {self.path!r} from a copy or collect it again"
        try:
            self._layout = ParamLayout.from_list(attrs["gradspec.layout"])
            if not self._layout.params:
                raise ValueError("it lists no parameters")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{self.path!r} has no valid parameter layout ({exc}): {damaged}") from None
        self._dtype = str(attrs.get("gradspec.dtype"))
        if self._dtype not in DTYPES:
            raise ValueError(f"{self.path!r} has gradient dtype {self._dtype!r}, not one of {', '.join(DTYPES)}: {damaged}")
        self._config = dict(attrs.get("gradspec.config", {}))
        self._per_example = bool(attrs.get("gradspec.per_example", False))
        self._rows = attrs.get(ROWS_KEY, 0)
        if not isinstance(self._rows, int) or isinstance(self._rows, bool) or self._rows < 0:
            raise ValueError(f"{self.path!r} has committed row count {self._rows!r}, not an integer >= 0: {damaged}")
        self._status = str(attrs.get(STATUS_KEY, "writing"))
        self._strict = bool(attrs.get(ALL_CHUNKS_KEY, False))
        writing = self.mode != "r"

        def array(name: str) -> zarr.Array:
            try:
                arr = group[name]
            except KeyError:
                raise ValueError(f"{self.path!r} has no array {name!r}: {damaged}") from None
            # zarr skips writing all-zero chunks by default; a gradient store writes every chunk,
            # so that a missing one is known to be lost (not zero).
            return arr.with_config({"write_empty_chunks": True}) if writing else arr

        self._grads = array("grads")
        if len(self._grads.shape) != 2 or self._grads.shape[1] != self._layout.p:
            raise ValueError(
                f"{self.path!r}: grads has shape {tuple(self._grads.shape)} but its parameter layout "
                f"has p = {self._layout.p} columns: {damaged}"
            )
        if np.dtype(self._grads.dtype) != np.dtype(disk_numpy_dtype(self._dtype)):
            raise ValueError(
                f"{self.path!r}: grads is stored as {self._grads.dtype} but the store says {self._dtype}: {damaged}"
            )
        self._meta_fields = dict(META_FIELDS, **(PER_EXAMPLE_FIELDS if self._per_example else {}))
        self._meta = {name: array(f"meta/{name}") for name in self._meta_fields}
        self._stats = array(STATS_ARRAY) if STATS_ARRAY in group else None
        for name, arr in self._arrays().items():
            if arr.shape[0] < self._rows:
                raise StoreDamagedError(
                    f"{self.path}: {self._rows} rows are committed but {name} holds only {arr.shape[0]}; "
                    f"{damaged}, or keep the rows it holds with zarr.open_group({self.path!r}, "
                    f"mode='r+').attrs['{ROWS_KEY}'] = {arr.shape[0]}"
                )
        self._presence = {name: ChunkPresence(arr) for name, arr in self._arrays().items()}
        self._direct = ChunkFileReader.for_array(self._grads, on_damage=self._chunk_damaged)
        self._report: tuple[int, np.ndarray, float] | None = None  # dtype report of rows [0, report rows)

    def _arrays(self) -> dict[str, zarr.Array]:
        """Every array with a row per gradient row, by name."""
        out = {"grads": self._grads, **{f"meta/{k}": v for k, v in self._meta.items()}}
        if self._stats is not None:
            out[STATS_ARRAY] = self._stats
        return out

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
        if dtype not in DTYPES:
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
            ALL_CHUNKS_KEY: True,
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
        if dtype != "float32":
            group.create_array(
                STATS_ARRAY, shape=(0, len(_precision.STATS_COLUMNS)), chunks=(4096, len(_precision.STATS_COLUMNS)),
                dtype="float64", fill_value=0, compressors=None,
                attributes={"columns": list(_precision.STATS_COLUMNS)},
            )
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

    @property
    def dtype_report(self) -> dict[str, Any] | None:
        """What storing the committed rows in a 16-bit dtype lost (None for float32 stores)."""
        if self._stats is None:
            return None
        return _precision.summarize(self._report_upto(self._rows), self.p, self._dtype)

    def refresh(self) -> None:
        """Re-read the committed row count and the arrays (for a store another process is writing)."""
        self._load(open_checked(self.path, KIND, self.mode))

    # ------------------------------------------------------------------ damage
    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def _missing(self, name: str, missing: list[tuple[int, ...]]) -> None:
        """Raise for missing chunks of committed rows (warn for a store that predates full chunks)."""
        if not missing:
            return
        rc = int(self._arrays()[name].chunks[0])
        first = missing[0]
        if not self._strict:
            if name == "grads":
                self._warn_once(
                    "absent",
                    f"{self.path}: chunk {name}/{self._presence[name].key(first)} of committed rows is absent and "
                    "reads as zeros; this store predates gradspec writing every chunk, so it may be an all-zero "
                    "chunk or a lost file: `gradspec info --verify` lists them",
                )
            return
        raise damage_error(self.path, name, self._presence[name].key(first),
                           chunk_span(first[0], rc, self._rows), self._rows, "missing", len(missing) - 1)

    def _chunk_damaged(self, i: int, j: int, problem: str) -> None:
        """The fast reader's report of a missing or wrong-sized chunk file."""
        if problem == "missing":
            self._missing("grads", [(i, j)])
            return
        raise damage_error(self.path, "grads", self._presence["grads"].key((i, j)),
                           chunk_span(i, self.chunks[0], self._rows), self._rows, problem)

    def _require(self, idx: slice | np.ndarray, ranges: Sequence[tuple[int, int]]) -> None:
        """Check that every grads chunk a read of rows ``idx`` × ``ranges`` touches is stored."""
        rc, cc = self.chunks
        cols = dict.fromkeys(j for a, b in ranges for j in col_chunks(a, b, cc))
        coords = [(i, j) for i in row_chunks(idx, rc) for j in cols]
        self._missing("grads", self._presence["grads"].missing(coords))

    def find_missing_chunks(self) -> list[dict[str, Any]]:
        """The chunks of committed rows that are not stored (a listing or a stat each; nothing is read).

        Returns:
            ``[{"array", "chunk", "rows": [first, last]}]``; in a store that predates gradspec
            writing every chunk, missing metadata chunks are left out (they may be all zero).
        """
        out = []
        for name, arr in self._arrays().items():
            if not self._strict and name != "grads":
                continue
            pres = self._presence[name]
            pres.forget()
            rc = int(arr.chunks[0])
            for c in pres.missing(committed_chunks(arr, self._rows)):
                a, b = chunk_span(c[0], rc, self._rows)
                out.append({"array": name, "chunk": pres.key(c), "rows": [a, b - 1]})
        return out

    def verify(self, *, progress: bool = False) -> dict[str, Any]:
        """Read every chunk of every committed row (gradients and metadata) and report damage.

        Returns:
            ``{"path", "ok", "chunks", "bytes", "damaged": [{array, chunk, rows, problem}],
            "non_finite": {array: {"count", "rows"}}, "absent_zero_chunks"}``; ``ok`` is False
            when a chunk is missing, truncated, the wrong size or undecodable, or a value is
            NaN or infinite.
        """
        report = verify_arrays(self._arrays(), self._rows, strict=self._strict,
                               dtypes={"grads": self._dtype}, progress=progress)
        return {"path": self.path, **report}

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
        for arr in self._arrays().values():
            if arr.shape[0] < new:
                arr.resize((new, *arr.shape[1:]))

    def write_rows(self, start: int, rows: np.ndarray, meta: dict[str, np.ndarray]) -> None:
        """Write ``rows`` (float32, shape (b, p)) at ``start``; not visible until :meth:`commit`.

        Raises:
            ValueError: bad shapes or metadata, committed rows, or finite values that the
                store's dtype cannot hold (float16 above 65504 would be stored as ±inf).
        """
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
        values = {}
        for name, dt in self._meta_fields.items():
            values[name] = np.asarray(meta[name], dtype=dt).reshape(-1)
            if values[name].shape[0] != b:
                raise ValueError(f"row metadata {name!r} has {values[name].shape[0]} values for {b} rows")
        disk = to_disk_dtype(rows, self._dtype)
        stats = None
        if self._stats is not None:
            stats, overflowed = _precision.conversion_stats(np.asarray(rows, np.float32), disk, self._dtype)
            if overflowed:
                raise ValueError(
                    f"{overflowed} finite gradient entries exceed {self._dtype}'s largest value (65504) and "
                    "would be stored as infinity; collect with --dtype bfloat16 or float32"
                )
        self._ensure_capacity(start + b)
        self._grads[start : start + b] = disk
        for name, v in values.items():
            self._meta[name][start : start + b] = v
        if stats is not None:
            self._stats[start : start + b] = stats

    def _report_upto(self, n: int) -> tuple[int, np.ndarray, float]:
        """The accumulated dtype stats of rows [0, n), reading only rows not yet summed."""
        acc = self._report
        if acc is None or acc[0] > n:
            acc = None
        covered = acc[0] if acc is not None else 0
        if n > covered or acc is None:
            acc = _precision.accumulate(acc, np.asarray(self._stats[covered:n]))
        self._report = acc
        return acc

    def commit(self, n_rows: int) -> None:
        """Make rows ``[0, n_rows)`` visible; their bytes must already be written.

        In a store that writes every chunk, on local disk, the chunks of the newly
        committed rows are checked to exist first (a stat each).
        """
        self._check_writable()
        n = int(n_rows)
        cap = min(arr.shape[0] for arr in self._arrays().values())
        if not 0 <= n <= cap:
            raise ValueError(f"cannot commit {n} rows: only {cap} written")
        if self._strict and n > self._rows and self._presence["grads"].local:
            for name, arr in self._arrays().items():
                self._missing(name, self._presence[name].missing(committed_chunks(arr, n, self._rows)))
        update: dict[str, Any] = {ROWS_KEY: n}
        report = None
        if self._stats is not None:
            report = _precision.summarize(self._report_upto(n), self.p, self._dtype)
            update[DTYPE_REPORT_KEY] = report
        self._group.attrs.update(update)
        self._rows = n
        why = _precision.material(report) if report else None
        if why:
            self._warn_once("dtype", f"{self.path}: {why}")

    def truncate(self, n_rows: int) -> None:
        """Forget committed rows beyond ``n_rows`` (resume from an earlier checkpoint)."""
        if n_rows > self._rows:
            raise ValueError(f"cannot truncate to {n_rows} rows: only {self._rows} are committed")
        self.commit(n_rows)

    def append(self, rows: np.ndarray, meta: dict[str, np.ndarray]) -> None:
        """Write rows after the committed ones and commit them (synchronous)."""
        self.write_rows(self._rows, rows, meta)
        self.commit(self._rows + np.asarray(rows).shape[0])

    def finalize(self) -> None:
        """Shrink every array to the committed rows, so that plain zarr reads exactly them.

        Crash-safe: zarr deletes the chunks wholly beyond the new shape (all uncommitted)
        before it rewrites the array's metadata, and never a chunk holding a committed row; a
        kill part-way leaves arrays of different capacities, which writing handles. Writing
        more rows later grows the arrays again.
        """
        self._check_writable()
        for arr in self._arrays().values():
            if arr.shape[0] > self._rows:
                arr.resize((self._rows, *arr.shape[1:]))

    def set_status(self, status: str) -> None:
        """Record the store's status: ``"writing"`` or ``"complete"``.

        ``"complete"`` first shrinks the arrays to the committed rows (:meth:`finalize`) and
        checks that every chunk of a committed row is stored.

        Raises:
            ValueError: an unknown status.
            StoreDamagedError: a chunk of a committed row is missing (the store is not marked complete).
        """
        self._check_writable()
        if status not in STATUSES:
            raise ValueError(f"unknown store status {status!r}; choose one of {', '.join(STATUSES)}")
        if status == "complete":
            self.finalize()
            lost = self.find_missing_chunks()
            if lost and self._strict:
                first = lost[0]
                raise damage_error(self.path, first["array"], first["chunk"],
                                   (first["rows"][0], first["rows"][1] + 1), self._rows, "missing", len(lost) - 1)
        self._group.attrs.update({STATUS_KEY: status})
        self._status = status

    def update_config(self, **items: Any) -> None:
        """Merge items into the stored run config (e.g. the final epsilon)."""
        self._check_writable()
        self._config.update(items)
        self._group.attrs.update({"gradspec.config": self._config})

    # ------------------------------------------------------------------ reading
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
        idx = self._row_index(rows)
        return idx.stop - idx.start if isinstance(idx, slice) else int(idx.size)

    def _forget_listings(self) -> None:
        """Start of a read: chunks are listed again (remote stores) before they are trusted."""
        for pres in self._presence.values():
            pres.forget()

    def _read(self, idx: slice | np.ndarray, c0: int, c1: int) -> np.ndarray:
        if self._direct is not None:  # a missing or wrong-sized chunk file raises in the reader
            if isinstance(idx, slice):
                raw = self._direct.read(idx.start, idx.stop, c0, c1)
            else:
                raw = self._direct.read_rows(idx, c0, c1)
            return from_disk_dtype(raw, self._dtype)
        self._require(idx, [(c0, c1)])
        try:
            if isinstance(idx, slice):
                raw = self._grads[idx, c0:c1]
            else:
                raw = self._grads.get_orthogonal_selection((idx, slice(c0, c1)))
        except (RuntimeError, ValueError, OSError) as exc:
            raise StoreDamagedError(
                f"{self.path}: reading committed rows of columns {c0}..{c1 - 1} failed ({type(exc).__name__}: "
                f"{exc}); a chunk is damaged: `gradspec info --verify {self.path}` finds it"
            ) from exc
        want = idx.stop - idx.start if isinstance(idx, slice) else idx.size
        if raw.shape[0] != want:
            raise StoreDamagedError(f"{self.path}: grads holds fewer rows than the {self._rows} committed")
        return from_disk_dtype(np.asarray(raw), self._dtype)

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
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(offset, block)``: column blocks (n_rows_selected, c) over the selected rows.

        ``offset`` counts columns within the selection (the concatenated
        ``col_ranges``). Blocks end on chunk boundaries; ``prefetch`` blocks are
        read ahead on a background thread.
        """
        idx = self._row_index(rows)
        blocks = self._col_blocks(col_ranges, block_cols)
        offsets = np.cumsum([0] + [b - a for a, b in blocks])[:-1]
        self._forget_listings()
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
        return {name: np.asarray(arr[idx] if isinstance(idx, slice) else arr.get_orthogonal_selection(idx))
                for name, arr in self._meta.items()}

    def to_dask(self, rows: RowSelection = None, col_ranges: ColRanges = None):
        """The committed (selected) rows as a float32 dask array, chunked like the store.

        Every chunk the selection touches is checked to be stored before the graph is built.
        """
        import dask.array as da

        idx = self._row_index(rows)
        self._forget_listings()
        self._require(idx, [(0, self.p)] if col_ranges is None else [(int(a), int(b)) for a, b in col_ranges])
        source = CheckedArray(self._grads, self.path, self._rows, self._strict)
        arr = da.from_array(source, chunks=self._grads.chunks, name=f"gradspec-grads-{uuid.uuid4().hex}",
                            asarray=False, fancy=False)
        arr = arr[idx]
        if col_ranges is not None:
            arr = da.concatenate([arr[:, a:b] for a, b in col_ranges], axis=1)
        dtype = self._dtype
        return arr.map_blocks(from_disk_dtype, dtype, dtype=np.float32)

    # ------------------------------------------------------------------ summary
    def nbytes_on_disk(self) -> int | None:
        return size_on_disk(self.path)

    def summary(self) -> dict[str, Any]:
        """What `gradspec info` shows.

        Chunks of committed rows are listed (not read): a store missing one has status
        ``"damaged"`` (its recorded status is ``recorded_status``), whatever it recorded.
        """
        missing = self.find_missing_chunks()
        status = self._status
        if missing and self._strict:
            status = "damaged"
        m: dict[str, Any] = {}
        meta_error = None
        if self._rows:
            try:
                meta = self.row_meta()
            except StoreDamagedError as exc:
                meta, meta_error = None, str(exc)
            if meta is not None:
                m = {
                    "steps": [int(meta["step"].min()), int(meta["step"].max())],
                    "epochs": [int(meta["epoch"].min()), int(meta["epoch"].max())],
                    "loss_first_last": [float(meta["loss"][0]), float(meta["loss"][-1])],
                    **_norm_summary(meta),
                }
        params = self._layout.params
        out = {
            "kind": KIND,
            "path": self.path,
            "status": status,
            "recorded_status": self._status,
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
            "missing_chunks": missing,
            "all_chunks_written": self._strict,
            "dtype_report": self.dtype_report,
        }
        if meta_error:
            out["meta_error"] = meta_error
        return out

    def __repr__(self) -> str:
        return f"GradientStore({self.path!r}, rows={self._rows}, p={self.p}, dtype={self._dtype})"


def _norm_summary(meta: dict[str, np.ndarray]) -> dict[str, Any]:
    """Norm statistics over the rows whose source knew them (NaN marks an unknown norm).

    Recorders fed by loops that never see per-example norms (a Hugging Face callback, a
    plain ``record_step`` without ``norms=``) store NaN; a plain mean would turn one such
    row into a NaN statistic. ``None`` when no row has a known norm.
    """
    known = np.isfinite(meta["norm_mean"])
    if not known.any():
        return {"grad_norm_mean": None, "grad_norm_max": None, "frac_clipped_mean": None,
                "rows_with_norms": 0}
    return {
        "grad_norm_mean": float(meta["norm_mean"][known].mean()),
        "grad_norm_max": float(np.nanmax(meta["norm_max"][known])),
        "frac_clipped_mean": float(np.nanmean(meta["frac_clipped"][known])),
        "rows_with_norms": int(known.sum()),
    }
