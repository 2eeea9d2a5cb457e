"""The spectrum store: what `gradspec pca` writes (Zarr v3).

Layout of a spectrum directory::

    OUT/zarr.json      attrs: gradspec.kind = "spectrum", status (running|complete), method and
                       its parameters, source store with its row/parameter selection, shape,
                       accuracy report, per-iteration history, timings
    OUT/sigma          (k,)   singular values, descending (float64)
    OUT/U              (r, k) left singular vectors (float64)
    OUT/V              (p, k) right singular vectors, chunked along p, written as they stream
    OUT/residuals      (k,)   √(residual_h² + residual_ht²) per vector
    OUT/residual_h     (k,)   ‖H·v_i − σ_i·u_i‖/σ_i
    OUT/residual_ht    (k,)   ‖Hᵀ·u_i − σ_i·v_i‖/σ_i
    OUT/explained_variance_ratio, OUT/cumulative_explained_variance   (k,)
    OUT/source_rows    (r,)   the absolute row indices of the source gradient store (when it is one)
    OUT/row_sq_norms   (r,)   ‖h_i‖² of those rows as pca read them, in U's row order (float64; stores
                       since issue 36: an exact spectrum's in-sample G_k need no pass over H)
    OUT/hv             (r, k) H·V of the stored V, in U's row order (float64): only where it was
                       measured because H·V = U·Σ does not hold exactly (`gradspec replay --check`)
    OUT/state/…        the resumable state of an iterative run (removed when complete)

V is read back in row (p) blocks with :meth:`SpectrumStore.iter_v_blocks` for
projections and G_k computations.

k. ``gradspec.k`` is the number of directions stored, which can be fewer than
were asked for (``gradspec.k_requested``): `gradspec pca` keeps only the
directions its precision resolves (σ above ``gradspec.rank_rtol``·σ_1, see
``gradspec.linalg``), so every stored column of V is a unit vector.

The source record (``gradspec.source``) says what the spectrum was computed
from; it and the row-selection helpers (``resolve_rows``, ...) live in
``gradspec.store._source``, exported by ``gradspec.store``.

Integrity. Every chunk is written, even an all-zero one (zarr skips those
unless ``write_empty_chunks``), and the attribute ``gradspec.all_chunks`` says
so: in a complete store a missing, short or long chunk of any array is damage,
and every accessor raises :class:`~gradspec.store.StoreDamagedError` instead of
reading it as zeros. :meth:`SpectrumStore.finish` refuses to mark a store
complete while a chunk is missing, :meth:`SpectrumStore.summary` reports status
``damaged`` (`gradspec info` exits 1), and :meth:`SpectrumStore.verify` reads
every chunk (`gradspec info --verify`). In an unfinished store only
``source_rows`` and the saved state are checked (V, U and σ are still being
written). Stores written before this have no ``gradspec.all_chunks``: a missing
chunk there may be an all-zero one, and is warned about.

Lifecycle. ``running`` while `gradspec pca` writes it, holding the store's
one-writer lock (``_spectrum_owner``: who writes it, and whether that writer is
gone), ``complete`` when finished, ``failed``/``interrupted`` when the run
stopped with an error and left a resumable state (a run with nothing to resume
removes its partial store). An unfinished store that no live process owns is
replaced by a plain rerun, unless it holds a saved state that ``--resume`` would
continue (`gradspec pca` refuses to discard one without ``overwrite``); a complete
one never is without ``overwrite``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from gradspec._layout import ParamLayout
from gradspec.store._checked_view import CheckedView
from gradspec.store._checksum import checksum_summary
from gradspec.store._integrity import ALL_CHUNKS_KEY, ArrayChecker, StoreDamagedError
from gradspec.store._manifest import MANIFEST_KEY, Manifest
from gradspec.store._spectrum_owner import OWNER_KEY, gone_writer
from gradspec.store._spectrum_schema import (
    ALL_CHUNKS,
    COMPLETE,
    DAMAGED,
    KIND,
    NAN_ALLOWED,
    OPTIONAL_ARRAYS,
    RESULT_ARRAYS,
    RUNNING,
    STATUS_KEY,
    UNFINISHED,
    VECTOR_ARRAYS,
    check_attr_types,
)
from gradspec.store._spectrum_write import SpectrumWrites
from gradspec.store._zarr import encoding_problem, missing_attribute, open_checked, size_on_disk

logger = logging.getLogger(__name__)

#: The attributes every spectrum store has from its creation on (a store without them is not one).
REQUIRED_ATTRS = ("gradspec.shape", "gradspec.k", "gradspec.k_requested", "gradspec.method",
                  "gradspec.params", "gradspec.source")

class SpectrumStore(SpectrumWrites):
    """Top-k singular triplets of a gradient matrix with their accuracy report."""

    def __init__(self, group: zarr.Group, path: str, mode: str) -> None:
        self._group, self.path, self.mode = group, str(path), mode
        attrs = self.attrs
        self._checks = ArrayChecker(
            self.path, strict=bool(attrs.get(ALL_CHUNKS_KEY, False)),
            fix="restore the file from a copy, or compute the spectrum again (`gradspec pca ... --overwrite`)",
            manifest=Manifest(attrs[MANIFEST_KEY]) if isinstance(attrs.get(MANIFEST_KEY), dict) else None,
        )

    # ------------------------------------------------------------------ create / open
    def replaceable(self) -> str | None:
        """Why a plain rerun may replace this store (None: it may not).

        A ``failed`` or ``interrupted`` run, or a ``running`` one whose writer is gone
        from this host (``_spectrum_owner.gone_writer``). Never a complete store.
        """
        status = self.status
        if status in UNFINISHED:
            state = self.attrs.get("gradspec.state") or {}
            saved = f"; iteration {state.get('iteration')} was saved, --resume would continue it"
            return f"{status}: {self.attrs.get('gradspec.error', '')}" + (saved if state else "")
        if status == RUNNING and gone_writer(self.path, self.attrs.get(OWNER_KEY)) is not None:
            return "its pca process is gone"
        return None

    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r") -> SpectrumStore:
        """Open an existing spectrum store (``mode="r+"`` to resume writing it).

        Raises:
            StoreDamagedError: a complete store lacks an array, or one's shape disagrees with
                its k and shape (chunks are checked when read, see the module note).
        """
        group = open_checked(path, KIND, mode)
        attrs = group.attrs.asdict()
        for key in REQUIRED_ATTRS:
            if key not in attrs:
                raise missing_attribute(path, KIND, KeyError(key))
        check_attr_types(str(path), attrs)
        store = cls(group, str(path), mode)
        if store.status == COMPLETE:
            store._check_arrays()
        return store

    # ------------------------------------------------------------------ integrity
    def _arr(self, name: str) -> zarr.Array:
        """The array ``name``, set to write every chunk when the store is writable."""
        try:
            arr = self._group[name]
        except KeyError:
            raise StoreDamagedError(
                f"{self.path} is damaged: its array {name!r} is missing; {self._checks.fix}"
            ) from None
        return arr.with_config(ALL_CHUNKS) if self.mode != "r" else arr

    def _check_arrays(self) -> None:
        r, p = self.shape
        k = self.k
        want = {"V": (p, k), "U": (r, k), **{n: (k,) for n in ("sigma", *VECTOR_ARRAYS)}}
        for name in ("source_rows", "row_sq_norms"):
            if name in self._group:
                want[name] = (r,)
        if "hv" in self._group:
            want["hv"] = (r, k)
        for name, shape in want.items():
            arr = self._arr(name)
            # what gradspec writes: V float32 or float64, source_rows int64, the rest float64
            dtype = {"source_rows": "int64", "V": arr.dtype if str(arr.dtype) in ("float32", "float64")
                     else "float32"}.get(name, "float64")
            bad = encoding_problem(arr, dtype)
            if bad:
                raise StoreDamagedError(f"{self.path} is damaged: the zarr.json of {name!r} is not as written: "
                                        f"{bad}; {self._checks.fix}")
            got = tuple(int(n) for n in arr.shape)
            if got != shape:
                raise StoreDamagedError(
                    f"{self.path} is damaged: {name} has shape {got}, but the store holds k = {k} "
                    f"directions of a {r} x {p} matrix, so {shape}; {self._checks.fix}"
                )

    def _written(self) -> list[str]:
        """The arrays whose every chunk is written by now (the module note's Integrity)."""
        names = [n for n in OPTIONAL_ARRAYS if n in self._group]
        if self.status == COMPLETE:
            return [*RESULT_ARRAYS, *names]
        state = self.attrs.get("gradspec.state") or {}
        return [*names, *(f"state/{key}" for key in state.get("arrays", []))]

    def _read(self, name: str, sel: Any = None) -> np.ndarray:
        """``name[sel]``; chunks of a written array are checked first (see the module note)."""
        arr = self._arr(name)
        if name in self._written():
            return self._checks.read(name, arr, sel)
        return np.asarray(arr[slice(None) if sel is None else sel])

    def find_damaged_chunks(self) -> list[dict[str, Any]]:
        """The chunks of written arrays that are missing or the wrong size (a stat or a listing each).

        Returns:
            ``[{"array", "chunk", "rows": [first, last], "problem"}]``.
        """
        out = []
        for name in self._written():
            try:
                arr = self._arr(name)
            except StoreDamagedError:
                out.append({"array": name, "chunk": "", "rows": [0, -1], "problem": "missing (the whole array)"})
                continue
            out += self._checks.problems(name, arr)
        return out

    def verify(self, *, progress: bool = False) -> dict[str, Any]:
        """Read every chunk of every written array and report damage (`gradspec info --verify`).

        Returns:
            ``{"path", "ok", "chunks", "bytes", "damaged": [{array, chunk, rows, problem}],
            "non_finite": {array: {"count", "rows"}}, "absent_zero_chunks", "unchecked"}``;
            ``ok`` is False when a chunk is missing, truncated, the wrong size or undecodable,
            or a value is NaN or infinite (NaN residuals mean "not measured" and are allowed).
            ``unchecked`` names the arrays an unfinished run is still writing.
        """
        names = self._written()
        report = self._checks.verify({n: self._arr(n) for n in names}, progress=progress,
                                     finite_not_required=NAN_ALLOWED)
        unchecked = [n for n in RESULT_ARRAYS if n not in names]
        return {"path": self.path, **report, "unchecked": unchecked}

    # ------------------------------------------------------------------ properties
    @property
    def attrs(self) -> dict[str, Any]:
        """The group's attributes, raw; readers use the accessors below, not their keys."""
        return self._group.attrs.asdict()

    @property
    def status(self) -> str:
        """Whether the run that writes the store finished (``complete``) or not."""
        return str(self.attrs.get(STATUS_KEY, RUNNING))

    def require_complete(self) -> None:
        """Raise unless the run that writes this store finished (status ``complete``).

        The one completeness check of a spectrum store for readers (decay, plot, retrain).

        Raises:
            ValueError: the store is running, failed or interrupted.
        """
        if self.status != COMPLETE:
            raise ValueError(
                f"{self.path!r} is not complete (status {self.status!r}); finish `gradspec pca` first"
            )

    @property
    def frob2(self) -> float | None:
        """‖H‖_F² of the matrix the spectrum was computed from (None: not recorded, or unfinished)."""
        value = self.attrs.get("gradspec.frob2")
        return None if value is None else float(value)

    @property
    def accuracy(self) -> dict[str, Any] | None:
        """The accuracy report of a finished run (residuals, convergence; None before it finishes)."""
        return self.attrs.get("gradspec.accuracy")

    @property
    def shape(self) -> tuple[int, int]:
        """``(r, p)`` of the gradient matrix H the spectrum was computed from."""
        r, p = self.attrs["gradspec.shape"]
        return int(r), int(p)

    @property
    def k(self) -> int:
        """The number of singular triplets stored."""
        return int(self.attrs["gradspec.k"])

    @property
    def k_requested(self) -> int:
        """The k that `gradspec pca` was asked for (``k`` may be smaller, see the module note)."""
        return int(self.attrs.get("gradspec.k_requested", self.k))

    @property
    def method(self) -> str:
        """The PCA method that computed it (``gram``, ``orthogonal``, ``krylov``, ``lanczos``)."""
        return str(self.attrs["gradspec.method"])

    @property
    def params(self) -> dict[str, Any]:
        """The method's settings as run (iterations, precision, kernel, ...), a copy."""
        return dict(self.attrs.get("gradspec.params", {}))

    @property
    def source(self) -> dict[str, Any]:
        """What H was: the source store, its rows and columns selected, its layout, a copy."""
        return dict(self.attrs.get("gradspec.source", {}))

    @property
    def source_rows(self) -> np.ndarray | None:
        """Absolute indices of the source store's rows the spectrum was computed from.

        From the ``source_rows`` array, or the resolved selection of older stores
        (None when it cannot be known: a source that was not a gradient store).
        """
        if "source_rows" in self._group:
            return np.asarray(self._read("source_rows"), dtype=np.int64)
        src = self.source
        if src.get("source") not in (None, "gradient-store"):
            return None
        desc = src.get("rows")
        committed = src.get("committed_rows")
        if desc is None:
            return None if committed is None else np.arange(int(committed), dtype=np.int64)
        if "indices" in desc:
            return np.asarray(desc["indices"], dtype=np.int64)
        if ("start" in desc or "stop" in desc) and committed is not None:
            sel = slice(desc.get("start"), desc.get("stop"), desc.get("step"))
            return np.arange(*sel.indices(int(committed)), dtype=np.int64)
        return None

    def param_layout(self) -> ParamLayout:
        """The layout of V's rows: the source's selected parameters, offsets from 0.

        Compare it with a gradient store's or a model's layout through
        :meth:`ParamLayout.require_same` before applying V to their rows.

        Raises:
            ValueError: the source recorded no layout (not a gradient store, or an
                older gradspec), or its column selection cuts through a parameter.
        """
        src = self.source
        if not src.get("layout"):
            raise ValueError(
                f"{self.path!r} does not record the parameter layout of its source (it was computed "
                "from an array, or by an older gradspec); rerun `gradspec pca` on the gradient store"
            )
        full = ParamLayout.from_list(src["layout"])
        ranges = [(int(a), int(b)) for a, b in (src.get("col_ranges") or [(0, full.p)])]
        names: list[tuple[str, tuple[int, ...]]] = []
        for a, b in ranges:
            for spec in full.params:
                lo, hi = max(a, spec.offset), min(b, spec.stop)
                if lo >= hi:
                    continue
                if lo != spec.offset or hi != spec.stop:
                    raise ValueError(
                        f"{self.path!r} covers columns {lo - spec.offset}:{hi - spec.offset} of "
                        f"parameter {spec.name!r} only; its V rows match no whole-parameter layout"
                    )
                names.append((spec.name, spec.shape))
        return ParamLayout.from_shapes(names)

    @property
    def sigma(self) -> np.ndarray:
        """The singular values σ, descending, shape ``(k,)``."""
        return self._read("sigma")

    @property
    def U(self) -> np.ndarray:
        """The left singular vectors, ``(r, k)``: each direction's weight on each row of H."""
        return self._read("U")

    @property
    def has_hv(self) -> bool:
        """Whether a finished store holds a measured H·V (:attr:`hv`), without reading it."""
        return self.status == COMPLETE and "hv" in self._group

    @property
    def hv(self) -> np.ndarray | None:
        """H·V (r × k, float64, U's row order) where it was measured (`gradspec replay --check`:
        its V are Ritz vectors, so H·V is not U·Σ); None elsewhere."""
        return np.asarray(self._read("hv"), dtype=np.float64) if self.has_hv else None

    @property
    def row_sq_norms(self) -> np.ndarray | None:
        """‖h_i‖² of the r rows the spectrum was computed from, in U's row order, as pca's first
        pass computed them (the Gram's diagonal for the exact method); None for a store written
        before gradspec recorded them, or an unfinished one."""
        if self.status != COMPLETE or "row_sq_norms" not in self._group:
            return None
        return np.asarray(self._read("row_sq_norms"), dtype=np.float64)

    @property
    def V(self) -> CheckedView | zarr.Array:
        """V as a lazy array (p×k: ``shape``, ``chunks``, ``dtype``); slice it or use :meth:`iter_v_blocks`.

        Every chunk of V is checked to be stored, at its size, when it is asked for
        (a stat each); each slice, like :meth:`read_v` and :meth:`iter_v_blocks`, is a
        checked read (a chunk that fails its checksum raises, naming it). V of an
        unfinished run is the plain zarr array.
        """
        v = self._arr("V")
        if "V" not in self._written():
            return v
        self._checks.require("V", v)
        return CheckedView(self._checks, "V", v)

    def array(self, name: str) -> np.ndarray:
        """The stored array ``name`` (``sigma``, ``U``, ``residuals``, ...), read and checked."""
        return self._read(name)

    def read_v(self, rows: slice | None = None) -> np.ndarray:
        """V's rows ``rows`` (all p by default) as a NumPy array ``(p, k)``, checked as read."""
        return self._read("V", rows)

    def iter_v_blocks(self, block_rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(offset, V[offset:offset+b])`` row blocks of V (b = chunk rows by default)."""
        v = self._arr("V")
        b = int(block_rows or v.chunks[0])
        for i in range(0, v.shape[0], b):
            yield i, self._read("V", slice(i, i + b))

    # ------------------------------------------------------------------ writing
    # ------------------------------------------------------------------ summary
    def summary(self) -> dict[str, Any]:
        """What `gradspec info` shows.

        The chunks of written arrays are checked (a stat or a listing each, nothing is
        read): a store with a missing or wrong-sized one has status ``"damaged"`` (its
        recorded status is ``recorded_status``), and they are listed in ``damaged_chunks``.
        In a store that predates writing every chunk a missing one may be all zero: it is
        listed, and the status is kept.
        """
        a = self.attrs
        damaged = self.find_damaged_chunks()
        status = self.status
        if any(self._checks.strict or d["problem"] != "missing" for d in damaged):
            status = DAMAGED
        out: dict[str, Any] = {
            "kind": KIND,
            "path": self.path,
            "status": status,
            "recorded_status": self.status,
            "shape": list(self.shape),
            "k": self.k,
            "k_requested": self.k_requested,
            "method": self.method,
            "params": self.params,
            "source": self.source,
            "size_on_disk": size_on_disk(self.path),
            "damaged_chunks": damaged,
            "all_chunks_written": self._checks.strict,
            "checksums": checksum_summary({n: self._arr(n) for n in self._written() if n in self._group}),
        }
        owner = gone_writer(self.path, a.get(OWNER_KEY)) if self.status == RUNNING else None
        if owner is not None:
            out["writer"] = (f"gone: the pca that wrote it (pid {owner.get('pid')} on {owner.get('host')}) "
                             "is not running; `gradspec pca ... --resume` continues it")
        if self.status == COMPLETE:
            try:
                sigma = self.sigma
                cev = self.array("cumulative_explained_variance")
            except StoreDamagedError as exc:
                out["read_error"] = str(exc)
            else:
                out.update(
                    {
                        "sigma_top": [float(s) for s in sigma[:5]],
                        "sigma_last": float(sigma[-1]),
                        "explained_variance": float(cev[-1]),
                    }
                )
            out.update(
                {
                    "accuracy": self.accuracy,
                    "passes": a.get("gradspec.passes"),
                    "timings": a.get("gradspec.timings"),
                    "chunk_manifest": isinstance(a.get(MANIFEST_KEY), dict),
                }
            )
        elif "gradspec.state" in a:
            out["iterations_done"] = a["gradspec.state"].get("iteration")
        return out

    def __repr__(self) -> str:
        r, p = self.shape
        return f"SpectrumStore({self.path!r}, r={r}, p={p}, k={self.k}, method={self.method}, {self.status})"
