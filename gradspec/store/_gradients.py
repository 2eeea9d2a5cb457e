"""The gradient store: a chunked Zarr v3 matrix of gradient rows.

Layout of a store directory::

    STORE/zarr.json        group attributes: kind, format, parameter layout, run config,
                           committed row count, status
    STORE/grads/           (capacity, p) rows = gradient samples, columns = flattened
                           selected parameters; chunks (rows_per_chunk, cols_per_chunk)
    STORE/meta/<field>/    one 1-D array per row-metadata field (step, epoch, loss, ...; per-example
                           stores: example_index, and each example's pre_clip_norm, clip_factor)
    STORE/param_norms/     (per-example stores) each example's pre-clip norm per parameter
    STORE/dtype_stats/     (16-bit stores) per row: what the conversion from float32 lost
    STORE/row_crc32c/      per row: the CRC-32C of its bytes in each column chunk, which binds
                           every chunk to this store's rows (``_rowsums``)

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
from typing import Any

import numpy as np
import zarr

import gradspec.store._checksum as _checksum
import gradspec.store._precision as _precision
from gradspec._layout import ParamLayout
from gradspec.store._fastread import ChunkFileReader
from gradspec.store._gradients_checks import GradientChecks
from gradspec.store._gradients_norms import GradientNorms, param_norms_chunk_rows
from gradspec.store._gradients_read import GradientReads
from gradspec.store._gradients_schema import (
    CHUNK_BYTES,
    DEFAULT_ROWS_PER_CHUNK,
    DTYPES,
    EXAMPLE_NORM_FIELDS,
    EXAMPLE_NORMS_KEY,
    KIND,
    META_FIELDS,
    PARAM_NORMS_ARRAY,
    PER_EXAMPLE_FIELDS,
    ROWS_KEY,
    SKETCH_KEY,
    STATS_ARRAY,
    STATUS_KEY,
    _codecs,
)
from gradspec.store._gradients_write import GradientWrites
from gradspec.store._integrity import ALL_CHUNKS_KEY, ChunkPresence, StoreDamagedError
from gradspec.store._rowkind import RowKind, row_kind
from gradspec.store._rowsums import ROW_SUMS_ARRAY, ROW_SUMS_KEY, RowSums
from gradspec.store._zarr import (
    create_group,
    disk_numpy_dtype,
    encoding_problem,
    missing_attribute,
    open_checked,
    size_on_disk,
)

logger = logging.getLogger(__name__)

#: The largest chunk a store may declare (gradspec writes 8 MiB ones; a read allocates a chunk).
MAX_CHUNK_BYTES = 2**30

class GradientStore(GradientReads, GradientWrites, GradientChecks, GradientNorms):
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
        if "gradspec.layout" not in attrs:  # every gradient store has one: another kind relabelled?
            raise missing_attribute(self.path, KIND, KeyError("gradspec.layout"))
        try:
            self._layout = ParamLayout.from_list(attrs["gradspec.layout"])
            if not self._layout.params:
                raise ValueError("it lists no parameters")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{self.path!r} has no valid parameter layout ({exc}): {damaged}") from None
        self._dtype = str(attrs.get("gradspec.dtype"))
        if self._dtype not in DTYPES:
            raise ValueError(f"{self.path!r} has gradient dtype {self._dtype!r}, not one of {', '.join(DTYPES)}: {damaged}")
        self._config = attrs.get("gradspec.config", {})
        if not isinstance(self._config, dict):
            raise ValueError(f"{self.path!r} has gradspec.config of type {type(self._config).__name__}, "
                             f"not an object: {damaged}")
        self._per_example = attrs.get("gradspec.per_example", False)
        if not isinstance(self._per_example, bool):
            raise ValueError(f"{self.path!r} has gradspec.per_example = {self._per_example!r}, not true "
                             f"or false: {damaged}")
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
            except (ValueError, TypeError, RecursionError, zarr.errors.MetadataValidationError) as exc:
                raise ValueError(f"{self.path!r}: the zarr.json of {name!r} cannot be read "
                                 f"({type(exc).__name__}): {damaged}") from None
            meta = {**META_FIELDS, **PER_EXAMPLE_FIELDS, **EXAMPLE_NORM_FIELDS}.get(name.removeprefix("meta/"))
            bad = encoding_problem(arr, meta if name.startswith("meta/") else None)
            if bad:
                raise ValueError(f"{self.path!r}: the zarr.json of {name!r} is not as written: {bad}: {damaged}")
            chunk_bytes = int(np.prod(arr.chunks, dtype=np.float64)) * np.dtype(arr.dtype).itemsize
            if chunk_bytes > MAX_CHUNK_BYTES:  # refused before a read allocates it
                raise ValueError(f"{self.path!r}: {name} declares chunks of {tuple(arr.chunks)} "
                                 f"({chunk_bytes / 2**30:.3g} GiB each, the most gradspec reads is "
                                 f"{MAX_CHUNK_BYTES / 2**30:g} GiB): {damaged}")
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
        self._sketch = attrs.get(SKETCH_KEY)
        if self._sketch is not None and not (
                isinstance(self._sketch, dict) and self._sketch.get("M") == self._layout.p
                and isinstance(self._sketch.get("params"), list)):
            raise ValueError(f"{self.path!r} has a {SKETCH_KEY} attribute that does not describe its "
                             f"{self._layout.p} columns: {damaged}")
        norms = attrs.get(EXAMPLE_NORMS_KEY) is True
        self._meta_fields = dict(META_FIELDS, **(PER_EXAMPLE_FIELDS if self._per_example else {}),
                                 **(EXAMPLE_NORM_FIELDS if norms and self._per_example else {}))
        self._meta = {name: array(f"meta/{name}") for name in self._meta_fields}
        self._load_norms(attrs, array, damaged)
        self._stats = array(STATS_ARRAY) if STATS_ARRAY in group else None
        sums = attrs.get(ROW_SUMS_KEY)
        self._row_sums_array = array(ROW_SUMS_ARRAY) if sums is not None else None
        self._row_sums = None
        if self._row_sums_array is not None:
            # True: a store written before the arrays beside grads were bound (segments only)
            small = [] if sums is True else sums.get("arrays") if isinstance(sums, dict) else None
            present = self._arrays()
            if not isinstance(small, list) or any(name not in present or name in ("grads", ROW_SUMS_ARRAY) for name in small):
                raise ValueError(f"{self.path!r}: {ROW_SUMS_KEY} = {sums!r} does not name arrays of this "
                                 f"store: {damaged}")
            ncols = -(-self._layout.p // int(self._grads.chunks[1])) + len(small)
            if len(self._row_sums_array.shape) != 2 or self._row_sums_array.shape[1] != ncols:
                raise ValueError(f"{self.path!r}: {ROW_SUMS_ARRAY} has shape {tuple(self._row_sums_array.shape)}, "
                                 f"not one column per column chunk of grads and one per array it binds "
                                 f"({ncols}): {damaged}")
            self._row_sums = RowSums(lambda a, b: self._read_array(ROW_SUMS_ARRAY, slice(a, b)),
                                     self._grads.chunks, self._layout.p, np.dtype(self._grads.dtype).itemsize,
                                     {name: present[name] for name in small})
        self._small_held: list[tuple[int, dict[str, np.ndarray]]] = []  # rows' meta until commit (_gradients_write)
        for name, arr in self._arrays().items():
            if arr.shape[0] < self._rows:
                raise StoreDamagedError(
                    f"{self.path}: {self._rows} rows are committed but {name} holds only {arr.shape[0]}; "
                    f"{damaged}, or keep the rows it holds with gradspec.store.update_attrs("
                    f"zarr.open_group({self.path!r}, mode='r+'), {{'{ROWS_KEY}': {arr.shape[0]}}})"
                )
        self._presence = {name: ChunkPresence(arr) for name, arr in self._arrays().items()}
        self._direct = ChunkFileReader.for_array(self._grads, on_damage=self._chunk_damaged,
                                                 bound=None if self._row_sums is None else self._chunk_bound)
        self._report: tuple[int, np.ndarray, float] | None = None  # dtype report of rows [0, report rows)

    def _arrays(self) -> dict[str, zarr.Array]:
        """Every array with a row per gradient row, by name."""
        out = {"grads": self._grads, **{f"meta/{k}": v for k, v in self._meta.items()}}
        if self._param_norms is not None:
            out[PARAM_NORMS_ARRAY] = self._param_norms
        if self._stats is not None:
            out[STATS_ARRAY] = self._stats
        if self._row_sums_array is not None:
            out[ROW_SUMS_ARRAY] = self._row_sums_array
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
        sketch: dict[str, Any] | None = None,
    ) -> GradientStore:
        """Create an empty store for rows of ``layout.p`` columns.

        Args:
            path: a local directory (or a URL zarr accepts).
            layout: the parameter layout of a row.
            config: the run config, saved in the store's attributes.
            dtype: on-disk dtype, ``float32`` | ``float16`` | ``bfloat16``.
            per_example: rows are per-example gradients (adds ``example_index``, and each
                example's ``pre_clip_norm``, ``clip_factor`` and ``param_norms``).
            rows_per_chunk: rows per chunk (the writer's flush unit).
            cols_per_chunk: columns per chunk; default fills 8 MiB chunks.
            compressor: ``None`` | ``"zstd"`` | ``"blosc"``.
            overwrite: replace an existing store at ``path``.
            sketch: the plan of sketched rows, per-example or per-step (``SketchPlan.to_dict()``,
                saved as ``gradspec.sketch``); ``layout`` is then its stored columns and
                ``param_norms`` (per-example rows) gets one column per parameter of the plan.
        """
        if sketch is not None and sketch.get("M") != layout.p:
            raise ValueError(f"a sketched store holds rows of the plan's M = {sketch.get('M')} columns "
                             f"(got p = {layout.p})")
        if dtype not in DTYPES:
            raise ValueError(f"unknown gradient dtype {dtype!r}; choose float32, float16 or bfloat16")
        if rows_per_chunk < 1:
            raise ValueError("rows_per_chunk must be >= 1")
        itemsize = 4 if dtype == "float32" else 2
        if cols_per_chunk is None:
            cols_per_chunk = max(1024, CHUNK_BYTES // (rows_per_chunk * itemsize))
        cols_per_chunk = int(min(cols_per_chunk, layout.p))
        fields = dict(META_FIELDS, **(PER_EXAMPLE_FIELDS if per_example else {}),
                      **(EXAMPLE_NORM_FIELDS if per_example else {}))
        # each row's CRC per column chunk of grads, then of its row in each array beside it (_rowsums)
        small = sorted([f"meta/{name}" for name in fields] + ([PARAM_NORMS_ARRAY] if per_example else [])
                       + ([STATS_ARRAY] if dtype != "float32" else []))
        attrs = {
            "gradspec.layout": layout.to_list(),
            "gradspec.dtype": dtype,
            "gradspec.config": config or {},
            "gradspec.per_example": per_example,
            "gradspec.created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            ROWS_KEY: 0,
            STATUS_KEY: "writing",
            ALL_CHUNKS_KEY: True,
            ROW_SUMS_KEY: {"arrays": small},
            **({EXAMPLE_NORMS_KEY: True} if per_example else {}),
            **({SKETCH_KEY: sketch} if sketch is not None else {}),
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
        for name, dt in fields.items():
            group.create_array(f"meta/{name}", shape=(0,), chunks=(4096,), dtype=dt, fill_value=0, compressors=_checksum.checksum_codecs())
        if per_example:
            columns = [q["name"] for q in sketch["params"]] if sketch is not None else layout.names
            n = len(columns)
            group.create_array(PARAM_NORMS_ARRAY, shape=(0, n), chunks=(param_norms_chunk_rows(n), n),
                               dtype="float64", fill_value=0, compressors=_checksum.checksum_codecs(), attributes={"columns": columns})
        if dtype != "float32":
            group.create_array(
                STATS_ARRAY, shape=(0, len(_precision.STATS_COLUMNS)), chunks=(4096, len(_precision.STATS_COLUMNS)),
                dtype="float64", fill_value=0, compressors=_checksum.checksum_codecs(),
                attributes={"columns": list(_precision.STATS_COLUMNS)},
            )
        ncols = -(-layout.p // cols_per_chunk) + len(small)
        group.create_array(ROW_SUMS_ARRAY, shape=(0, ncols), chunks=(max(1, min(4096, 2**21 // ncols)), ncols),
                           dtype="uint32", fill_value=0, compressors=_checksum.checksum_codecs())
        return cls(group, str(path), "r+")

    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r") -> GradientStore:
        """Open an existing store; ``mode="r"`` (default) is read-only, ``"r+"`` appends."""
        group = open_checked(path, KIND, mode)
        try:
            return cls(group, str(path), mode)
        except KeyError as err:
            raise missing_attribute(path, KIND, err) from None

    # ------------------------------------------------------------------ properties
    @property
    def n_rows(self) -> int:
        """Committed rows (the only rows readers see)."""
        return self._rows

    @property
    def p(self) -> int:
        """Columns of a row: the selected parameters' entries (or a sketch's columns)."""
        return self._layout.p

    @property
    def shape(self) -> tuple[int, int]:
        """``(committed rows, p)``: the rows a reader may use, not the arrays' capacity."""
        return (self._rows, self._layout.p)

    @property
    def dtype(self) -> str:
        """The rows' stored dtype: ``float32``, ``float16`` or ``bfloat16``."""
        return self._dtype

    @property
    def layout(self) -> ParamLayout:
        """Which parameter each column range holds (name, shape, offset)."""
        return self._layout

    @property
    def config(self) -> dict[str, Any]:
        """The run config that wrote the rows (task, parameters, C, noise multiplier, q, lr,
        seed, library versions, final ε), a copy."""
        return dict(self._config)

    @property
    def row_kind(self) -> RowKind:
        """What the rows are: clipped (and C), normalisation, source (``_rowkind``)."""
        return row_kind(self._config, per_example=self._per_example)

    @property
    def per_example(self) -> bool:
        """Whether each row is one example's gradient (else one step's)."""
        return self._per_example

    @property
    def sketch(self) -> dict[str, Any] | None:
        """The sketch plan of a sketched store, per-example or per-step (``gradspec.sketch``,
        docs/store-format.md; ``gradspec.sketch.SketchPlan.from_dict`` reads it), None for a
        store of unsketched rows. Its columns are then not parameters: ``layout`` names them
        ``sketch.exact``, ``sketch.block0``, ...
        """
        return None if self._sketch is None else dict(self._sketch)

    @property
    def status(self) -> str:
        """``"writing"`` until the run that writes it finishes, then ``"complete"``."""
        return self._status

    @property
    def chunks(self) -> tuple[int, int]:
        """The gradient array's chunk shape ``(rows, columns)``."""
        return tuple(self._grads.chunks)  # type: ignore[return-value]

    @property
    def meta_fields(self) -> dict[str, str]:
        """The per-row metadata fields and their dtypes (step, epoch, loss, batch_size, ...)."""
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

    # ------------------------------------------------------------------ summary
    def nbytes_on_disk(self) -> int | None:
        """The store's size on disk in bytes (None where it cannot be measured: a URL)."""
        return size_on_disk(self.path)

    def summary(self) -> dict[str, Any]:
        """What `gradspec info` shows.

        Chunks of committed rows are listed (not read): a store missing one has status
        ``"damaged"`` (its recorded status is ``recorded_status``), whatever it recorded; so
        has one whose metadata (read in full) fails to read — a chunk failing its checksum
        (``meta_error`` says which) — or whose per-example norms or clip factors hold a value
        no clipping gives (``example_norms_error``). ``checksums`` says which arrays carry
        per-chunk checksums (``_checksum``; none in a store written before them).
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
            "row_kind": self.row_kind.to_dict(),
            "row_kind_text": self.row_kind.describe(),
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
            "dtype_report": None,
            "checksums": _checksum.checksum_summary(self._arrays()),
            "row_checksums": self._row_sums is not None,
            "example_norms": None,
            "sketch": None if self._sketch is None else {
                k: self._sketch.get(k) for k in ("kind", "version", "M", "requested_M", "p", "seed", "width_note")} | {
                "blocks": len(self._sketch.get("blocks", [])),
                "exact_columns": sum(b - a for a, b in self._sketch.get("exact", [])),
                # how the plan split its columns (gradspec.sketch.SketchPlan.weighting; version 1: by size)
                "weighting": self._sketch.get("weighting", "sqrt-size" if self._sketch.get("version", 1) >= 2
                                              else "size")},
        }
        try:
            out["dtype_report"] = self.dtype_report
        except StoreDamagedError as exc:
            meta_error = meta_error or str(exc)
        if meta_error:
            out["meta_error"] = meta_error
            out["status"] = "damaged"
        try:
            out["example_norms"] = self._example_norm_summary()
        except StoreDamagedError as exc:  # a value no clipping gives: damage, as a lost chunk is
            out["example_norms_error"] = str(exc)
            out["status"] = "damaged"
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
