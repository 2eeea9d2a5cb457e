"""What a spectrum was computed from: the source record and row selections.

The source record (``gradspec.source`` of a spectrum store) says what the
spectrum was computed from: the gradient store's path (as given and resolved),
its full parameter layout and the column ranges selected, the resolved row
selection, digests of the selected rows' metadata and of the run config (which
identify the store's rows after the fact: a store rewritten at the same path has
other digests), and the run's n, ε and δ. :func:`resolve_rows` is the one
reading of a row selection (strict: rows outside the committed ones are an
error, never clipped).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from gradspec._json import store_jsonable as jsonable
from gradspec.store._zarr import is_url

_jsonable = jsonable  # the former private name


# ---------------------------------------------------------------------- row selections
def resolve_rows(
    rows: Any, n: int, *, what: str = "the row selection", distinct: bool = False,
    counted_in: str = "H",
) -> np.ndarray:
    """A row selection (None, a slice, or indices) as absolute int64 indices into ``n`` rows.

    Strict where Python slicing clips: a bound outside ``[-n, n]`` or an index
    outside ``[0, n)`` is an error, so a selection never silently means fewer
    rows than it says. Negative bounds count from the end, as in Python. A boolean
    mask is refused (numpy would read it as the indices 0 and 1), and so are
    non-integer indices.

    Args:
        rows: None (all), a slice, or row indices.
        n: the number of committed rows.
        what: how the selection is named in errors (``--rows``).
        distinct: refuse a repeated index (a row that would count twice).
        counted_in: what a repeated row would be counted twice in (for the message).

    Raises:
        ValueError: out-of-range bounds or indices, a non-positive step, a boolean mask,
            non-integer or (with ``distinct``) repeated indices, or an empty selection.
    """
    if rows is not None and not isinstance(rows, slice):
        arr = np.asarray(rows)
        if arr.dtype == np.bool_:
            raise ValueError(
                f"{what} got a boolean mask; pass row indices (numpy.flatnonzero(mask)) or a slice"
            )
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{what} indices must be integers, got dtype {arr.dtype}")
        if distinct:
            uniq, counts = np.unique(arr, return_counts=True)
            if uniq.size != arr.size:
                raise ValueError(
                    f"{what} repeats row index {int(uniq[counts > 1][0])} "
                    f"({arr.size - uniq.size} repeats): a row would count twice in {counted_in}; "
                    "pass each row once"
                )
    if rows is None:
        idx = np.arange(n, dtype=np.int64)
    elif isinstance(rows, slice):
        step = 1 if rows.step is None else int(rows.step)
        if step < 1:
            raise ValueError(f"{what} {_slice_text(rows)} needs a positive step")
        for bound in (rows.start, rows.stop):
            if bound is not None and not -n <= int(bound) <= n:
                raise ValueError(
                    f"{what} {_slice_text(rows)} lies outside the {n} committed rows "
                    f"(valid bounds are 0..{n})"
                )
        idx = np.arange(*rows.indices(n), dtype=np.int64)
    else:
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = idx[(idx < 0) | (idx >= n)]
            raise ValueError(
                f"{what} has row index {int(bad[0])} outside the {n} committed rows [0, {n})"
            )
    if idx.size == 0:
        text = _slice_text(rows) if isinstance(rows, slice) else "[]"
        raise ValueError(f"{what} {text} selects no rows of the {n} committed rows")
    return idx


def _slice_text(s: slice) -> str:
    text = f"{'' if s.start is None else s.start}:{'' if s.stop is None else s.stop}"
    return text + (f":{s.step}" if s.step not in (None, 1) else "")


def as_slice(idx: np.ndarray) -> slice | np.ndarray:
    """Indices that are an increasing run (step 1) as a slice (faster reads); others as they are."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size and np.all(np.diff(idx) == 1):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


def describe_row_indices(idx: np.ndarray) -> dict[str, Any]:
    """``{"start", "stop", "step"}`` for an arithmetic run of rows, else a count and the ends."""
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size == 0:
        return {"n_indices": 0}
    d = np.diff(idx)
    if idx.size == 1 or (d[0] > 0 and np.all(d == d[0])):
        step = int(d[0]) if idx.size > 1 else 1
        return {"start": int(idx[0]), "stop": int(idx[-1]) + 1, "step": step}
    return {"n_indices": int(idx.size), "first": int(idx[0]), "last": int(idx[-1])}


def rows_text(idx: np.ndarray) -> str:
    """Rows as a reader writes them: ``40:60``, ``0:100:2``, or ``12 rows in 3..97``."""
    d = describe_row_indices(idx)
    if "start" in d:
        return f"{d['start']}:{d['stop']}" + (f":{d['step']}" if d["step"] != 1 else "")
    return f"{d['n_indices']} rows in {d.get('first')}..{d.get('last')}"


def rows_digest(store: Any, idx: np.ndarray) -> str:
    """SHA-256 of the selected rows' metadata (step, loss, norms, ...) in order.

    Committed rows never change, so the digest identifies them: a store rewritten
    at the same path (another run) gives another digest. Cheap: metadata only.
    """
    meta = store.row_meta(as_slice(np.asarray(idx, dtype=np.int64)))
    h = hashlib.sha256()
    for name in sorted(meta):
        h.update(name.encode())
        h.update(np.ascontiguousarray(meta[name]).tobytes())
    return h.hexdigest()


#: Items a run's config gains as it goes (a recorder's next step, what a stopped run spent):
#: not what the run is, so left out of its digest, like ``final_*``.
_PROGRESS_KEYS = frozenset({"next_step", "epsilon_note"})


def config_digest(config: dict[str, Any]) -> str | None:
    """SHA-256 of a gradient store's run config without the ``final_*`` items added at the end
    (nor ``spent_*`` and the other progress items, ``_PROGRESS_KEYS``).

    None for an empty config (stores written through the library without one).
    """
    stable = {k: v for k, v in (config or {}).items()
              if not str(k).startswith(("final_", "spent_")) and k not in _PROGRESS_KEYS}
    if not stable:
        return None
    return hashlib.sha256(json.dumps(_jsonable(stable), sort_keys=True).encode()).hexdigest()


def resolved_path(path: str | os.PathLike) -> str:
    """The absolute, symlink-free path of a local store (URLs as given)."""
    return str(path) if is_url(path) else str(Path(path).resolve())
