"""Each example's own pre-clip norm and clip factor, kept beside its per-example row (issue 22).

A mixin of :class:`gradspec.store.GradientStore` (its core, ``_gradients``, opens the arrays
this reads). A per-example store written since ``gradspec.example_norms`` holds, for row i,

* ``meta/pre_clip_norm`` — ``||g_i||``, the L2 norm of example i's gradient before clipping,
  over every parameter the clipping saw (float64, as the source computed it for the clip);
* ``meta/clip_factor`` — ``c_i``, the factor the row was scaled by: ``min(1, C / ||g_i||)``
  (gradspec's clipping, `gradspec.privacy.clip_factors`), Opacus's ``min(1, C / (||g_i|| +
  1e-6))`` for rows recorded from Opacus, 1 for unclipped rows;
* ``param_norms`` — (rows, parameters) float64, ``||g_i^(j)||`` of each recorded parameter j
  before clipping, columns in ``gradspec.layout`` order;

so the stored row is ``c_i g_i`` rounded to the store's dtype (``bound_rows_`` may shrink a row
whose rounding lands above C by a few units of that dtype's roundoff more), and the norm
distribution per parameter and per step can be studied without the rows. Stores written
before keep none of them and still open and read; :meth:`GradientNorms.row_norms` and its
siblings refuse them in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gradspec.store._gradients_schema import (
    EXAMPLE_NORM_FIELDS,
    EXAMPLE_NORMS_KEY,
    PARAM_NORMS_ARRAY,
    RowSelection,
)
from gradspec.store._integrity import StoreDamagedError, row_chunks

#: What each array must hold: (lowest value, highest value, the range in words).
_RANGES = {
    "meta/pre_clip_norm": (0.0, np.inf, ">= 0"),
    "meta/clip_factor": (np.nextafter(0.0, 1.0), 1.0, "in (0, 1]"),
    PARAM_NORMS_ARRAY: (0.0, np.inf, ">= 0"),
}


def param_norms_chunk_rows(n_params: int) -> int:
    """Rows per chunk of ``param_norms``: 4,096, fewer where a chunk would exceed 8 MiB."""
    return int(max(1, min(4096, (8 * 2**20) // (8 * max(1, n_params)))))


def out_of_range(name: str, values: np.ndarray) -> np.ndarray:
    """Per row (first axis): the entries of ``values`` that are NaN, infinite or outside the
    range array ``name`` may hold."""
    lo, hi, _ = _RANGES[name]
    bad = ~(np.isfinite(values) & (values >= lo) & (values <= hi))
    return bad.reshape(values.shape[0], -1).sum(axis=1)


def check_norm_values(meta: dict[str, np.ndarray]) -> None:
    """Refuse, before anything is written, norms or clip factors no clipping could give.

    Raises:
        ValueError: a NaN or infinite value, a negative norm, a clip factor outside (0, 1].
    """
    for key in ("pre_clip_norm", "clip_factor", PARAM_NORMS_ARRAY):
        name = key if key == PARAM_NORMS_ARRAY else f"meta/{key}"
        bad = out_of_range(name, np.asarray(meta[key], dtype=np.float64))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{key} of row {i} of this block is {np.asarray(meta[key])[i]!r}, not "
                             f"a finite value {_RANGES[name][2]}; nothing of the block was written")


class GradientNorms:
    """The per-example norms of a :class:`~gradspec.store.GradientStore` (module docstring)."""

    def _load_norms(self, attrs: dict[str, Any], array: Callable[[str], Any], damaged: str) -> None:
        """Open and check the norm arrays a store says it has (``_load`` calls this)."""
        flag = attrs.get(EXAMPLE_NORMS_KEY, False)
        if not isinstance(flag, bool):
            raise ValueError(f"{self.path!r} has {EXAMPLE_NORMS_KEY} = {flag!r}, not true or false: {damaged}")
        if flag and not self._per_example:
            raise ValueError(f"{self.path!r} says it keeps per-example norms ({EXAMPLE_NORMS_KEY}) but holds "
                             f"one row per step: {damaged}")
        self._example_norms = flag
        self._param_norms = None
        if not flag:
            return
        self._param_norms = array(PARAM_NORMS_ARRAY)
        n_params = len(self._sketch["params"]) if self._sketch is not None else len(self._layout.params)
        for name, want in (*((f"meta/{k}", 1) for k in EXAMPLE_NORM_FIELDS), (PARAM_NORMS_ARRAY, 2)):
            arr = self._param_norms if name == PARAM_NORMS_ARRAY else self._meta[name[5:]]
            shape = tuple(arr.shape)
            if np.dtype(arr.dtype) != np.float64:
                raise ValueError(f"{self.path!r}: {name} is stored as {arr.dtype}, not float64: {damaged}")
            if len(shape) != want or (want == 2 and shape[1] != n_params):
                expect = "(rows,)" if want == 1 else f"(rows, {n_params}) (one column per parameter of the layout)"
                raise ValueError(f"{self.path!r}: {name} has shape {shape}, not {expect}: {damaged}")

    @property
    def has_example_norms(self) -> bool:
        """The store keeps each row's pre-clip norm, clip factor and per-parameter norms."""
        return self._example_norms

    def _norm_array(self, name: str, rows: RowSelection) -> np.ndarray:
        if not self._example_norms:
            why = ("it holds one row per step (its meta/norm_mean, norm_max and frac_clipped describe "
                   "each step's examples)" if not self._per_example else
                   "it was written before gradspec kept them (its meta/norm_mean, norm_max and "
                   "frac_clipped describe each row's step)")
            raise ValueError(f"{self.path!r} keeps no per-example pre-clip norms or clip factors: {why}")
        arr = self._param_norms if name == PARAM_NORMS_ARRAY else self._meta[name[5:]]
        idx = self._row_index(rows)
        pres = self._presence[name]
        pres.forget()
        self._missing(name, pres.missing([(i, *([0] * (arr.ndim - 1)))
                                          for i in row_chunks(idx, int(arr.chunks[0]))]))
        values = np.asarray(self._read_array(name, idx), dtype=np.float64)
        bad = out_of_range(name, values)
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            row = at + idx.start if isinstance(idx, slice) else int(idx[at])
            raise StoreDamagedError(
                f"{self.path} is damaged: {name} of committed row {row} is not a finite value "
                f"{_RANGES[name][2]} ({int((bad > 0).sum())} such rows in the selection); the gradient rows "
                f"still read, `gradspec info --verify {self.path}` lists the bad values"
            )
        return values

    def row_norms(self, rows: RowSelection = None) -> np.ndarray:
        """Each selected row's pre-clip L2 norm ``||g_i||``, (n,) float64.

        Raises:
            ValueError: a per-step store, or one written before gradspec kept per-example norms.
            StoreDamagedError: a chunk is missing, or a value is not a finite norm.
        """
        return self._norm_array("meta/pre_clip_norm", rows)

    def clip_factors(self, rows: RowSelection = None) -> np.ndarray:
        """Each selected row's clip factor ``c_i`` (the stored row is ``c_i g_i``), (n,) float64 in (0, 1].

        Raises:
            ValueError, StoreDamagedError: as :meth:`row_norms`.
        """
        return self._norm_array("meta/clip_factor", rows)

    def param_norms(self, rows: RowSelection = None) -> np.ndarray:
        """Each selected row's pre-clip norm per parameter, (n, parameters) float64, columns in
        ``layout.names`` order (a sketched store: the order of its plan's ``params``).

        Raises:
            ValueError, StoreDamagedError: as :meth:`row_norms`.
        """
        return self._norm_array(PARAM_NORMS_ARRAY, rows)

    def _example_norm_summary(self) -> dict[str, Any] | None:
        """``gradspec info``'s line: the pre-clip norms' median and max and the share clipped.

        Raises:
            StoreDamagedError: a missing chunk or a value no clipping gives, in any of the three.
        """
        if not self._example_norms or not self._rows:
            return None
        norms, factors = self.row_norms(), self.clip_factors()
        self.param_norms()  # read as well (r x parameters, small): damage there is damage too
        return {
            "rows": int(norms.size),
            "pre_clip_norm_median": float(np.median(norms)),
            "pre_clip_norm_max": float(norms.max()),
            "frac_clipped": float((factors < 1).mean()),
            "clip_factor_min": float(factors.min()),
        }

    def _verify_norm_ranges(self, report: dict[str, Any], start: int = 0) -> None:
        """Add the norm values outside their range (negative norms, factors above 1) to a
        :meth:`verify` report, as ``out_of_range`` (NaN and inf are already ``non_finite``);
        ``start``: of the rows from there on only (a verify from ``start``)."""
        if not self._example_norms or self._rows <= start:
            return
        unreadable = {d["array"] for d in report["damaged"]}
        found: dict[str, dict[str, Any]] = {}
        for name in _RANGES:
            if name in unreadable:
                continue
            arr = self._param_norms if name == PARAM_NORMS_ARRAY else self._meta[name[5:]]
            values = np.asarray(arr[start : self._rows], dtype=np.float64)
            bad = out_of_range(name, np.where(np.isfinite(values), values, 0.0))
            if bad.any():
                found[name] = {"count": int(bad.sum()), "rows": (np.flatnonzero(bad)[:20] + start).tolist()}
        if found:
            report["out_of_range"] = found
            report["ok"] = False
