"""Which rows decay may read beside a spectrum, and what it must say about them: whether a
gradient store is the spectrum's own (``relation``), of another kind of row or another task
than the spectrum's (a note), or holds sketches, of which no G_k is measured."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("gradspec.spectrum._driver")  # the decay's log, as before the split


def kinds_differ(src: dict[str, Any], store: Any) -> str | None:
    """How the kind of the spectrum's source rows differs from ``store``'s (None: same, or unknown)."""
    from gradspec.store import RowKind, kind_mismatch

    if not src.get("row_kind"):
        return None
    return kind_mismatch(RowKind(**src["row_kind"]), store.row_kind, names=("the spectrum's", "--gradients'"))


def note_sketched_rows(store: Any, heldout_rows: Any, notes: list[str]) -> None:
    """A store of sketched rows gives no G_k: its rows are M-dimensional sketches, and how much of
    a sketch lies outside the sketch's top-k subspace is not how much of the gradient lies outside
    the gradients' (a run measured both: k^-0.54 against k^-0.40, Theorem 3.3's verdict flipped).
    σ only, said in the notes (the caller then reads no store); held-out rows are refused."""
    plan = store.sketch
    if heldout_rows is not None:
        raise ValueError(
            f"--heldout-rows of {store.path!r}: its rows are sketches (M = {plan.get('M')} columns of "
            f"p = {plan.get('p')} parameters), and G_k of a sketch is not G_k of the gradients; pass "
            "an unsketched store of the same parameters with --gradients, or `gradspec replay` the run"
        )
    note = (f"{store.path!r} holds sketched rows (M = {plan.get('M')} of p = {plan.get('p')} parameters): "
            "G_k, the explained variance on rows and the bounds are not measured (they would be of the "
            "sketch, not of the gradients); σ only. For G_k: `gradspec replay`, or an unsketched "
            "collection with --gradients")
    logger.warning("%s", note)
    notes.append(note)


def tasks_differ(src: dict[str, Any], store: Any) -> str | None:
    """A note when ``store``'s rows come from another task (or task options) than the spectrum's
    own: the layout alone let another model's data pass as held-out rows."""
    run = src.get("run") or {}
    if "task" not in run:  # spectra written before the task was recorded: the source store's config
        path = src.get("abspath") or src.get("path")
        try:
            from gradspec.store import GradientStore

            run = GradientStore.open(path).config if path and Path(path).exists() else {}
        except (OSError, ValueError):
            run = {}
    theirs = store.config or {}
    mine = (run.get("task"), run.get("task_options") or {})
    other = (theirs.get("task"), theirs.get("task_options") or {})
    if mine[0] is None or other[0] is None or mine == other:
        return None
    return (f"{store.path!r} holds rows of task {other[0]!r} {other[1]}, the spectrum's rows are of task "
            f"{mine[0]!r} {mine[1]}: its G_k are another data set's gradients in this subspace, not "
            "held-out rows of the spectrum's")


def store_relation(spec: Any, store: Any) -> str:
    """``"source"`` (the spectrum's own store, or a copy of the same run) or ``"other"``.

    Raises when the store is at the source's path but no longer holds its rows.
    """
    from gradspec.store import config_digest, resolved_path, rows_digest, rows_text

    src = spec.source
    here = resolved_path(store.path)
    there = src.get("abspath") or (resolved_path(src["path"]) if src.get("path") else None)
    rows = spec.source_rows
    digest = src.get("rows_digest")
    same_path = there is not None and here == there
    same_run = (
        not same_path
        and src.get("config_digest") is not None
        and config_digest(store.config) == src["config_digest"]
    )
    if not (same_path or same_run):
        return "other"
    if rows is not None and rows.size and int(rows.max()) >= store.n_rows:
        if same_run:
            return "other"
        raise ValueError(
            f"the gradient store {store.path!r} has {store.n_rows} committed rows, but the spectrum "
            f"was computed from its rows {rows_text(rows)}: it was truncated or rewritten since "
            "`gradspec pca`; rerun pca"
        )
    if rows is not None and digest is not None and rows_digest(store, rows) != digest:
        if same_run:
            return "other"
        raise ValueError(
            f"the rows {rows_text(rows)} of {store.path!r} are not the rows the spectrum was "
            "computed from (their metadata differs): the store was rewritten since `gradspec pca`; "
            "rerun pca, or pass the original store with --gradients"
        )
    if same_run and (rows is None or digest is None):
        return "other"
    return "source"


def _row_keys(meta: dict[str, np.ndarray]) -> list[bytes]:
    """One key a row: its metadata (step, loss, norms, ...) as bytes, fields in name order."""
    cols = [np.ascontiguousarray(meta[name]).reshape(len(meta[name]), -1).view(np.uint8) for name in sorted(meta)]
    return [row.tobytes() for row in np.concatenate(cols, axis=1)] if cols else []


#: Candidate rows whose content is compared (spread over them): a match of metadata alone is
#: not enough where a library-written store recorded little (no loss, no norms: NaN).
CONFIRM = 16


def _read_at(store: Any, rows: np.ndarray, cols: list[tuple[int, int]]) -> np.ndarray:
    return np.concatenate([store.read(rows=rows, cols=slice(a, b)) for a, b in cols], axis=1)


def _same_content(spec: Any, store: Any, cols: list[tuple[int, int]], pairs: np.ndarray,
                  source: Any | None) -> bool:
    """Whether every sampled pair (row of ``store``, position in the spectrum's rows) holds the
    same gradient: equal values where the source store is there, else the same ‖h‖² as pca's
    recorded one (to its float32-product rounding); True where neither can be checked."""
    pick = pairs[np.unique(np.linspace(0, len(pairs) - 1, min(CONFIRM, len(pairs))).astype(np.int64))]
    mine = _read_at(store, pick[:, 0], cols)
    if source is not None:
        src_cols = [(int(a), int(b)) for a, b in spec.source.get("col_ranges") or [(0, source.p)]]
        return bool(np.array_equal(mine, _read_at(source, spec.source_rows[pick[:, 1]], src_cols)))
    norms = spec.row_sq_norms
    if norms is None:
        return True
    got = np.einsum("ij,ij->i", mine.astype(np.float64), mine.astype(np.float64))
    return bool(np.allclose(got, norms[pick[:, 1]], rtol=1e-4, atol=0.0))


def shared_rows(spec: Any, store: Any, cols: list[tuple[int, int]]) -> np.ndarray:
    """The rows of ``store`` (not the spectrum's source: ``store_relation`` said "other") that are
    rows the spectrum was computed from, as sorted indices (empty when none is found). ``cols``:
    the columns of ``store`` that hold the spectrum's parameters.

    Another run of the same seed (a longer one, say) holds its first rows bit for bit: counted as
    held out, they would read as the spectrum's in-sample G_k. Candidates are found by the rows'
    metadata (step, loss, norms): the spectrum's recorded digest at the same indices, or, where
    the source store is still there, row by row wherever they lie in ``store``. Then their
    content is compared on up to :data:`CONFIRM` of them (``_same_content``), so that two runs
    whose rows recorded the same little (a library store without losses) are not taken for one.
    """
    from gradspec.store import GradientStore, rows_digest

    own, digest, src = spec.source_rows, spec.source.get("rows_digest"), spec.source
    none = np.zeros(0, dtype=np.int64)
    n = int(store.n_rows)
    if own is None or not own.size or not n:
        return none
    path = src.get("abspath") or src.get("path")
    try:
        source = GradientStore.open(path) if path and Path(path).exists() else None
        if source is not None and (int(own.max()) >= source.n_rows or (
                digest is not None and rows_digest(source, own) != digest)):
            source = None  # rewritten since pca: not the spectrum's rows
    except (OSError, ValueError, KeyError):  # gone, or not a store any more
        source = None
    try:
        if digest is not None and int(own.max()) < n and rows_digest(store, own) == digest:
            pairs = np.stack([own, np.arange(own.size)], axis=1)
        elif source is not None:
            mine, theirs = source.row_meta(own), store.row_meta(slice(0, n))
            if set(mine) != set(theirs):  # rows of another kind: no row can be the same
                return none
            where = {key: j for j, key in enumerate(_row_keys(mine))}
            pairs = np.asarray([(i, where[key]) for i, key in enumerate(_row_keys(theirs)) if key in where],
                               dtype=np.int64).reshape(-1, 2)
        else:
            return none
        if not len(pairs) or not _same_content(spec, store, cols, pairs, source):
            return none
    except (OSError, ValueError, KeyError):
        return none
    return np.sort(pairs[:, 0])


def without_shared(held: np.ndarray, shared: np.ndarray, path: str, *, explicit: bool,
                   notes: list[str]) -> np.ndarray:
    """The held-out rows ``held`` of the store at ``path`` without ``shared`` (its rows that are
    the spectrum's own, from ``shared_rows``): refused when the user chose them by
    ``--heldout-rows``, left out with a note when they were every row of the store."""
    from gradspec.store import rows_text

    both = np.intersect1d(held, shared)
    if not both.size:
        return held
    what = (f"{both.size} of the rows of {path!r} ({rows_text(both)}) are rows the spectrum was computed "
            "from (the same step, loss and norms: e.g. a longer run of the same seed)")
    if explicit:
        raise ValueError(f"--heldout-rows: {what}; held-out rows must lie outside them")
    rest = np.setdiff1d(held, both)
    if not rest.size:
        raise ValueError(f"{what}, and it has no other rows: none of its rows is held out")
    note = f"{what}: they are left out of the held-out rows, {rest.size} rows remain"
    logger.warning("%s", note)
    notes.append(note)
    return rest
