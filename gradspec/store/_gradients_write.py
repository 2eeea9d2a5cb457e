"""Writing a gradient store: rows into chunks, the commit that makes them visible, status.

A mixin of :class:`gradspec.store.GradientStore` (its core, ``_gradients``, holds the
arrays this writes); see that module for the crash-safety contract.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import gradspec.store._precision as _precision
from gradspec.store._gradients_norms import check_norm_values
from gradspec.store._gradients_schema import (
    DTYPE_REPORT_KEY,
    PARAM_NORMS_ARRAY,
    ROWS_KEY,
    STATS_ARRAY,
    STATUS_KEY,
    STATUSES,
)
from gradspec.store._integrity import (
    committed_chunks,
    damage_error,
)
from gradspec.store._rowsums import ROW_SUMS_ARRAY, row_crcs, segment_crcs
from gradspec.store._zarr import (
    disk_numpy_dtype,
    to_disk_dtype,
    update_attrs,
)


class GradientWrites:
    """The writing half of a :class:`~gradspec.store.GradientStore`."""

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

        A 16-bit store also takes rows already in its on-disk form (``disk_numpy_dtype``) with
        ``meta["dtype_stats"]``, what rounding them lost (``_precision.disk_rows``).

        ``meta`` holds a (b,) array per field of :attr:`meta_fields`; a store that keeps
        per-example norms (:attr:`has_example_norms`) also takes ``meta["param_norms"]``, (b,
        parameters), and refuses norms and clip factors no clipping gives (NaN, negative, a
        factor outside (0, 1]). Keys the store does not keep are ignored.

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
        if self._param_norms is not None and PARAM_NORMS_ARRAY not in meta:
            missing.add(PARAM_NORMS_ARRAY)
        if missing:
            raise ValueError(f"row metadata is missing {sorted(missing)}")
        if start < self._rows:
            raise ValueError(f"cannot overwrite committed rows (start {start} < {self._rows} committed)")
        values = {}
        for name, dt in self._meta_fields.items():
            values[name] = np.asarray(meta[name], dtype=dt).reshape(-1)
            if values[name].shape[0] != b:
                raise ValueError(f"row metadata {name!r} has {values[name].shape[0]} values for {b} rows")
        param_norms = None
        if self._param_norms is not None:
            param_norms = np.asarray(meta[PARAM_NORMS_ARRAY], dtype=np.float64)
            want = (b, int(self._param_norms.shape[1]))
            if param_norms.shape != want:
                raise ValueError(f"row metadata {PARAM_NORMS_ARRAY!r} has shape {param_norms.shape}, not {want} "
                                 "(one pre-clip norm per row and parameter)")
            check_norm_values({**values, PARAM_NORMS_ARRAY: param_norms})
        stats = None
        if rows.dtype == np.dtype(disk_numpy_dtype(self._dtype)) and STATS_ARRAY in meta and self._stats is not None:
            # rows already in their on-disk 16-bit form, with what that rounding lost
            # (``_precision.disk_rows``, made by a recorder that rounds per-example rows itself)
            disk = np.ascontiguousarray(rows)
            stats = np.asarray(meta[STATS_ARRAY], dtype=np.float64)
            if stats.shape != (b, len(_precision.STATS_COLUMNS)):
                raise ValueError(f"row metadata {STATS_ARRAY!r} has shape {stats.shape}, not "
                                 f"{(b, len(_precision.STATS_COLUMNS))}")
        elif not np.issubdtype(rows.dtype, np.floating):
            raise TypeError(f"rows must be floating point (or a 16-bit store's on-disk rows with their "
                            f"{STATS_ARRAY!r}), got {rows.dtype}")
        elif self._stats is not None:
            disk, stats = _precision.disk_rows(rows, self._dtype)
        else:
            disk = to_disk_dtype(rows, self._dtype)
        self._ensure_capacity(start + b)
        self._grads[start : start + b] = disk
        small = dict(values)
        if param_norms is not None:
            small[PARAM_NORMS_ARRAY] = param_norms
        if stats is not None:
            small[STATS_ARRAY] = stats
        if self._row_sums is not None:
            # each row's CRC per column chunk of grads, then of its row in each array beside it, in
            # the order the store lists them: the bytes zarr stores (little-endian, stored dtypes)
            beside = {(name if name in (PARAM_NORMS_ARRAY, STATS_ARRAY) else f"meta/{name}"): v
                      for name, v in small.items()}
            small[ROW_SUMS_ARRAY] = np.concatenate(
                [segment_crcs(disk, int(self._grads.chunks[1])),
                 *(row_crcs(beside[name])[:, None] for name in self._row_sums.small)], axis=1)
        self._hold_small(start, small)

    # The per-row arrays beside grads (meta/*, param_norms, dtype stats, row checksums) have chunks of
    # thousands of rows: written with every row chunk, each is a read-modify-write of a
    # partly filled chunk (~1.8 ms of zarr per array, ten or more arrays, whatever p is).
    # Their rows are held here until the commit that makes them visible (or until
    # SMALL_ROWS_HELD rows are held), then written in one piece per array: uncommitted
    # rows are discarded on resume anyway, so nothing a crash could keep is lost.
    # Measured in an Opacus loop at p = 115,210 (64-row chunks, a commit every 32 steps):
    # meta writes were 29 ms of a 68 ms write per step.
    SMALL_ROWS_HELD = 1 << 16

    def _hold_small(self, start: int, values: dict[str, np.ndarray]) -> None:
        held = self._small_held
        if held:
            last_start, last = held[-1]
            if start != last_start + next(iter(last.values())).shape[0]:
                self._write_small()  # not contiguous with what is held: write that first
                held = self._small_held
        held.append((start, values))
        if sum(next(iter(v.values())).shape[0] for _, v in held) >= self.SMALL_ROWS_HELD:
            self._write_small()

    def _write_small(self) -> None:
        """Write the held per-row arrays, one contiguous piece per array."""
        held = self._small_held
        if not held:
            return
        self._small_held = []
        start = held[0][0]
        end = start + sum(next(iter(v.values())).shape[0] for _, v in held)
        arrays = self._arrays()
        for name in held[0][1]:
            joined = np.concatenate([v[name] for _, v in held])
            key = name if name in (PARAM_NORMS_ARRAY, STATS_ARRAY, ROW_SUMS_ARRAY) else f"meta/{name}"
            arrays[key][start:end] = joined

    def _report_upto(self, n: int) -> tuple[int, np.ndarray, float]:
        """The accumulated dtype stats of rows [0, n), reading only rows not yet summed."""
        acc = self._report
        if acc is None or acc[0] > n:
            acc = None
        covered = acc[0] if acc is not None else 0
        if n > covered or acc is None:
            acc = _precision.accumulate(acc, self._read_array(STATS_ARRAY, slice(covered, n)))
        self._report = acc
        return acc

    def commit(self, n_rows: int) -> None:
        """Make rows ``[0, n_rows)`` visible; their bytes must already be written.

        In a store that writes every chunk, on local disk, the chunks of the newly
        committed rows are checked to exist first (a stat each).
        """
        self._check_writable()
        self._write_small()
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
        update_attrs(self._group, update)
        if self._row_sums is not None and n < self._rows:
            self._row_sums.drop(n)  # rows written again in their place are other rows
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
        self._small_held = []  # rows past the committed ones: dropped with them
        for arr in self._arrays().values():
            if arr.shape[0] > self._rows:
                arr.resize((self._rows, *arr.shape[1:]))

    def set_status(self, status: str) -> None:
        """Record the store's status: ``"writing"``, ``"complete"`` or ``"failed"``.

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
                                   (first["rows"][0], first["rows"][1] + 1), self._rows, first["problem"], len(lost) - 1)
        update_attrs(self._group, {STATUS_KEY: status})
        self._status = status

    def update_config(self, **items: Any) -> None:
        """Merge items into the stored run config (e.g. the final epsilon)."""
        self._check_writable()
        self._config.update(items)
        update_attrs(self._group, {"gradspec.config": self._config})

