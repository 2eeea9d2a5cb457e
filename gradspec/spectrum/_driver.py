"""From stores to a decay analysis: the one place in ``gradspec.spectrum`` that meets the stores.

It opens nothing itself beyond ``gradspec.store`` (which owns zarr): it reads σ,
V and the provenance of a spectrum store, finds the rows the spectrum was
computed from in its source gradient store, and hands column-block iterators
to the pure numerics of :func:`analyze_spectrum`.

What it checks before reading a gradient (each is a one-line ``ValueError``):

* the spectrum is complete, and ``k_max``, ``fit_range``, ``dim`` and ``n`` fit it;
* the gradient store holds the spectrum's parameters — by name, shape and order
  (:meth:`ParamLayout.require_same`); a store with more parameters is read at
  the columns of the selected ones;
* the source store still holds the spectrum's rows (the recorded row indices,
  and a digest of their metadata: a store rewritten at the same path is refused);
* held-out rows lie inside the store and — when the store is the spectrum's
  source, by resolved path or as a copy of the same run (same config, same rows)
  — outside the rows the spectrum was computed from.

How each set of rows is measured — an exact spectrum's own rows from U, σ and the recorded row
norms with no pass over H, every other set projected onto V in tiles of bounded rows — is
``_measure`` (issue 36). A replayed spectrum's (`gradspec replay`) source store holds its rows
sketched: they are never read, their G_k come from the spectrum or are not formed (``_measure``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from gradspec.spectrum._inputs import (
    kinds_differ,
    note_sketched_rows,
    shared_rows,
    store_relation,
    tasks_differ,
    without_shared,
)
from gradspec.spectrum._measure import MEMORY, measure_rows, tile_rows, why_no_replayed_rows
from gradspec.spectrum._report import REPORT_FORMAT, DecayAnalysis, DecayConfig, analyze_spectrum

logger = logging.getLogger(__name__)


def parse_row_range(text: str | None) -> slice | None:
    """``"A:B"`` or ``"A:B:STEP"`` → a slice (``None`` for an empty value)."""
    if text is None or text == "":
        return None
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"row range {text!r} is not START:STOP[:STEP] (e.g. 1000:1200)")
    try:
        vals = [int(s) if s.strip() else None for s in parts]
    except ValueError:
        raise ValueError(f"row range {text!r} is not START:STOP[:STEP] with integers") from None
    return slice(*vals)


class _Columns:
    """The first k columns of a (p × K) row-sliceable basis, still read lazily."""

    def __init__(self, basis: Any, k: int) -> None:
        self._b, self.shape = basis, (int(basis.shape[0]), int(k))

    def __getitem__(self, key: Any) -> Any:
        rows, cols = key
        start, stop, _ = cols.indices(self.shape[1])
        return self._b[rows, start:stop]


def _stored_k(spec: Any, notes: list[str]) -> int:
    """Directions usable from a spectrum: leading σ > 0 (older stores zeroed unresolved ones)."""
    sigma = spec.sigma
    k = int(np.argmin(sigma > 0)) if np.any(sigma <= 0) else int(sigma.size)
    if k < sigma.size:
        notes.append(
            f"the spectrum stores {sigma.size} directions but only the first {k} have sigma > 0 "
            "(an older `gradspec pca` kept unresolved directions as zeros): analysing those"
        )
    if k < 3:
        raise ValueError(
            f"{spec.path!r} holds only {k} nonzero singular values; a decay analysis needs 3"
        )
    return k


def _check_config(config: DecayConfig, *, k: int, p: int, run: dict[str, Any]) -> list[str]:
    """Refuse settings that do not fit the spectrum; return notes on what-if settings."""
    notes: list[str] = []
    if config.k_max is not None and not 1 <= config.k_max <= k:
        raise ValueError(
            f"--k-max {config.k_max} is outside the {k} directions the spectrum stores; "
            f"choose 1..{k}"
        )
    if config.fit_range is not None:
        lo, hi = config.fit_range
        if not 1 <= lo < hi <= k:
            raise ValueError(
                f"--fit-range {lo}:{hi} is outside the {k} singular values the spectrum stores; "
                f"choose A:B with 1 <= A < B <= {k}"
            )
    if config.dim is not None and config.dim < p:
        raise ValueError(
            f"--dim {config.dim} is below p = {p}, the parameters the spectrum spans; the bounds' "
            "d is the dimension of the trained parameters (default p)"
        )
    n_train = run.get("n_train")
    if config.n is not None and n_train is not None and int(config.n) != int(n_train):
        raise ValueError(
            f"--n {config.n} differs from the {n_train} training examples of the run the gradients "
            f"come from; pass --n {n_train}"
        )
    eps = run.get("final_epsilon")
    if config.epsilon is not None and eps is not None and abs(config.epsilon - eps) > 1e-6 * eps:
        notes.append(
            f"bounds are evaluated at epsilon = {config.epsilon:g}; the run's gradients were "
            f"collected at epsilon = {eps:.4g} (a what-if for the privacy term)"
        )
    return notes


def _read_columns(spec: Any, store: Any) -> list[tuple[int, int]]:
    """Columns of ``store`` holding the spectrum's parameters, in V's row order (or raise)."""
    from gradspec.store import ParamLayout

    what = f"the gradient store {store.path!r}"
    src = spec.source
    names = [d.get("name") for d in src.get("layout") or [] if isinstance(d, dict)]
    if getattr(store, "sketch", None) is not None and not all(str(n).startswith("sketch.") for n in names):
        own = (": a replayed spectrum's own rows are measured from the spectrum, without --gradients"
               if spec.method == "replay" else "")
        raise ValueError(
            f"{what} holds sketched rows (its columns are sketch blocks, not parameters) and the spectrum's V "
            f"is in parameter space: pass a store of unsketched rows of its parameters with --gradients{own}"
        )
    try:
        expected = spec.param_layout()
    except ValueError:
        if not src.get("layout"):
            raise
        # The selection cuts through a parameter: only the identical layout will do.
        ParamLayout.from_list(src["layout"]).require_same(store.layout, what=what)
        return [(int(a), int(b)) for a, b in src["col_ranges"]]
    cols = expected.require_same(store.layout, what=what, subset=True)
    if sum(b - a for a, b in cols) != spec.shape[1]:
        raise ValueError(f"{what} gives {sum(b - a for a, b in cols)} columns, V has {spec.shape[1]}")
    return cols


def _heldout_index(rows: Any, n: int) -> np.ndarray:
    """``--heldout-rows`` as indices; refuses a boolean mask and repeated rows (counted twice)."""
    from gradspec.store import resolve_rows

    return resolve_rows(rows, n, what="--heldout-rows", distinct=True,
                        counted_in="G_k and the explained variance")


def decay_analysis(
    *,
    spectrum: Any,
    gradients: Any | None = None,
    heldout_rows: slice | str | np.ndarray | None = None,
    use_gradients: bool = True,
    config: DecayConfig | None = None,
    read_rows: bool = False,
    memory: int | None = None,
    progress: bool = False,
) -> DecayAnalysis:
    """Analyse a spectrum store, measuring G_k on its source rows and on held-out rows.

    Args:
        spectrum: a spectrum store path or an open ``SpectrumStore`` (status complete).
        gradients: a gradient store path or ``GradientStore``; default the spectrum's
            source store. When it *is* the source store (same resolved path, or a copy
            of the same run), the spectrum's own rows are analysed as ``collected`` and
            ``heldout_rows`` of it — which must lie outside them — as ``heldout``; for
            another store, ``heldout_rows`` of it (default all) are ``heldout``. A replayed
            spectrum's own rows are never read (its source store holds them sketched): with
            K = r their G_k come from U, σ and the row norms the replay recorded, with K < r
            they are not formed (a warning says why).
        heldout_rows: rows of the gradient store held out (``"A:B"``, a slice or indices).
        use_gradients: False analyses σ only (no pass over any gradient store).
        config: analysis settings.
        read_rows: project the spectrum's own rows onto V (one pass over them and V) even
            where an exact spectrum's U, σ and row norms give their G_k with no pass over H
            (``_measure``): a cross-check; the numbers agree to the spectrum's precision.
        memory: bytes of gradient rows held at a time while rows are projected (default
            ``_measure.MEMORY``, 512 MiB); the rows are read once whatever it is.
        progress: a progress bar on stderr for each pass over rows and V.

    Raises:
        ValueError: an unfinished spectrum; settings that do not fit it (``k_max``,
            ``fit_range``, ``dim``, ``n``); a gradient store with other parameters; a
            source store rewritten since the spectrum; held-out rows outside the store
            or overlapping the spectrum's rows; gradients asked for that cannot be read.
    """
    from gradspec.store import (
        GradientStore,
        SpectrumStore,
        as_slice,
        describe_row_indices,
        rows_text,
    )

    spec = spectrum if isinstance(spectrum, SpectrumStore) else SpectrumStore.open(spectrum)
    spec.require_complete()
    cfg = config or DecayConfig()
    src = spec.source
    notes: list[str] = []
    k = _stored_k(spec, notes)
    p = int(spec.shape[1])
    notes += _check_config(cfg, k=k, p=p, run=src.get("run") or {})
    if isinstance(heldout_rows, str):
        heldout_rows = parse_row_range(heldout_rows)
    if not use_gradients and (gradients is not None or heldout_rows is not None):
        raise ValueError(
            "--spectrum-only reads no gradients; drop --gradients and --heldout-rows, or "
            "--spectrum-only"
        )
    frob2 = spec.frob2
    sources: dict[str, Any] = {
        "spectrum": {
            "path": spec.path,
            "method": spec.method,
            "k": k,
            "k_requested": spec.k_requested,
            "shape": list(spec.shape),
            "center": bool(src.get("center")),
            "source": src,
            "accuracy": spec.accuracy,
        },
    }
    if src.get("center"):
        notes.append(
            "the spectrum was computed on column-centred rows (its explained variance is relative "
            "to the centred H's energy); G_k and the explained variance on rows use the raw, "
            "uncentred rows"
        )
    kw: dict[str, Any] = {}
    replayed = spec.method == "replay"  # its source store holds its rows sketched: never read for G_k
    if use_gradients:
        store = None
        if gradients is not None:
            store = gradients if hasattr(gradients, "iter_col_blocks") else GradientStore.open(gradients)
        elif replayed:
            if heldout_rows is not None:
                raise ValueError(
                    f"--heldout-rows of a replayed spectrum need unsketched rows: its source "
                    f"{src.get('path')!r} holds them sketched (columns that are sketch blocks, not "
                    "parameters); pass an unsketched store of its parameters with --gradients"
                )
        else:
            # The resolved path first: a relative one means another store from another cwd.
            path = src.get("abspath") or src.get("path")
            if path is not None and Path(path).exists():
                store = GradientStore.open(path)
            elif heldout_rows is not None:
                raise ValueError(
                    f"--heldout-rows needs a gradient store, and the spectrum's source {path!r} is "
                    "not available; pass it with --gradients"
                )
            else:
                logger.warning(
                    "the spectrum's source store %r is not available; analysing σ only", path
                )
                notes.append(f"source gradient store {path!r} not found: G_k not measured")
        if replayed:
            _replayed_rows(spec, kw, sources, notes, ks=cfg.ranks(k), k=k, read_rows=read_rows,
                           alone=store is None)
        if store is not None and not replayed and getattr(store, "sketch", None) is not None:
            note_sketched_rows(store, heldout_rows, notes)
            store = None  # σ only
        if store is not None:
            cols = _read_columns(spec, store)
            relation = store_relation(spec, store)
            if relation == "other":
                differ = kinds_differ(src, store)
                if differ:
                    logger.warning("the spectrum's rows and %r's rows are not the same kind: %s", store.path, differ)
                    notes.append(f"the spectrum's rows and {store.path!r}'s rows are not the same kind: {differ}")
                other_task = tasks_differ(src, store)
                if other_task:
                    logger.warning("%s", other_task)
                    notes.append(other_task)
            if store.p > p:
                notes.append(
                    f"the spectrum covers {p} of the {store.p} columns of {store.path!r}: G_k, the "
                    "explained variance and the bounds are of those parameters' gradients only"
                )
            n = store.n_rows
            row_sets: dict[str, np.ndarray] = {}
            if relation == "source":
                own = spec.source_rows
                if own is None:
                    notes.append("the spectrum's row indices were not recorded: collected rows skipped")
                else:
                    row_sets["collected"] = own
                if heldout_rows is not None:
                    held = _heldout_index(heldout_rows, n)
                    if own is None:
                        raise ValueError(
                            "cannot check that --heldout-rows lie outside the spectrum's rows (not "
                            "recorded); rerun `gradspec pca`"
                        )
                    both = np.intersect1d(held, own)
                    if both.size:
                        raise ValueError(
                            f"--heldout-rows {rows_text(held)} overlap the rows {rows_text(own)} the "
                            f"spectrum was computed from ({both.size} rows in both, "
                            f"{rows_text(both)}); held-out rows of {store.path!r} must lie outside them"
                        )
                    row_sets["heldout"] = held
                if src.get("abspath") and src["abspath"] != _abspath(store.path):
                    notes.append(
                        f"{store.path!r} holds the same run as the spectrum's source "
                        f"{src.get('path')!r} (same config and rows): its rows {rows_text(own)} "
                        "are the spectrum's own"
                    )
            else:
                held = _heldout_index(heldout_rows, n)
                shared = shared_rows(spec, store, cols)
                if shared.size:
                    held = without_shared(held, shared, store.path, explicit=heldout_rows is not None,
                                           notes=notes)
                row_sets["heldout"] = held
                if bool(getattr(store, "per_example", False)) != bool(src.get("per_example", False)):
                    kinds = ("step-average", "per-example")
                    notes.append(
                        f"the held-out rows are {kinds[bool(store.per_example)]} gradients, the "
                        f"spectrum's rows {kinds[bool(src.get('per_example'))]} gradients: their "
                        "G_k are not comparable"
                    )
            basis = _Columns(spec.V, k)
            tiles = tile_rows(store, cols, MEMORY if memory is None else memory)
            for name, idx in row_sets.items():
                kw[name], how, note = measure_rows(
                    spec=spec, store=store, rows=idx, own=name == "collected", cols=cols, basis=basis,
                    ks=cfg.ranks(k), tiles=tiles, read_rows=read_rows, progress=progress,
                )
                notes += [note] if note else []
                sources[name] = {
                    "path": store.path,
                    "relation": relation,
                    "rows": describe_row_indices(idx),
                    "n_rows": int(idx.size),
                    "col_ranges": cols,
                    "measured": how,
                    "max_grad_norm": store.row_kind.max_grad_norm,  # G_0 of the bounds (None: not clipped)
                }
                kw[f"{name}_steps"] = store.row_meta(as_slice(idx))["step"]
    analysis = analyze_spectrum(
        sigma=spec.sigma[:k],
        config=cfg,
        basis=_Columns(spec.V, k) if kw else None,
        gradients=kw.get("collected"),
        gradient_steps=kw.get("collected_steps"),
        heldout=kw.get("heldout"),
        heldout_steps=kw.get("heldout_steps"),
        total_energy=float(frob2) if frob2 is not None else None,
        sources=sources,
        progress=progress,
    )
    analysis.notes.extend(notes)
    return analysis


def _replayed_rows(spec: Any, kw: dict[str, Any], sources: dict[str, Any], notes: list[str], *,
                   ks: np.ndarray, k: int, read_rows: bool, alone: bool) -> None:
    """A replayed spectrum's own rows: G_k from U, σ and the recorded norms (K = r), else a warning.

    Their steps come from the sketched source store's row metadata when it is there and still
    holds the spectrum's rows (its rows are not read).
    """
    from gradspec.store import GradientStore, as_slice, describe_row_indices

    why = why_no_replayed_rows(spec)
    if why is not None and not read_rows:
        what = "G_k not computed on the replayed spectrum's own rows" + (" (sigma fitted only)" if alone else "")
        logger.warning("%s: %s", what, why)
        notes.append(f"{what}: {why}")
        return
    own = spec.source_rows
    kw["collected"], how, _ = measure_rows(spec=spec, store=None, rows=own, own=True, cols=[],
                                           basis=_Columns(spec.V, k), ks=ks, tiles=0, read_rows=read_rows)
    src = spec.source
    path = src.get("abspath") or src.get("path")
    store = GradientStore.open(path) if path is not None and Path(path).exists() else None
    try:
        same = store is not None and store_relation(spec, store) == "source"
    except ValueError:  # rewritten since: its metadata is not the rows'
        same = False
    if same:
        kw["collected_steps"] = store.row_meta(as_slice(own))["step"]
    else:
        notes.append(f"the sketched store {path!r} the spectrum was replayed from is not there as it was: the "
                     "rows' steps are unknown (no per-step error)")
    sources["collected"] = {"path": spec.path, "relation": "replayed", "rows": describe_row_indices(own),
                            "n_rows": int(own.size), "col_ranges": src.get("col_ranges"), "measured": how,
                            "max_grad_norm": (src.get("row_kind") or {}).get("max_grad_norm")}


def sigma_analysis(spectrum: Any) -> DecayAnalysis:
    """The analysis of a complete spectrum store's σ alone, as `gradspec plot` draws a store.

    σ is cut at its first non-positive value (directions the precision did not resolve);
    the explained variance is relative to the recorded ‖H‖_F² when the store has it.

    Args:
        spectrum: a spectrum store path or an open ``SpectrumStore``.

    Raises:
        ValueError: the spectrum is not complete.
    """
    from gradspec.store import SpectrumStore

    spec = spectrum if isinstance(spectrum, SpectrumStore) else SpectrumStore.open(spectrum)
    spec.require_complete()
    sigma = spec.sigma
    sigma = sigma[: int(np.argmin(sigma > 0)) if np.any(sigma <= 0) else sigma.size]
    return analyze_spectrum(sigma=sigma, total_energy=spec.frob2)


def read_report(path: str | Path) -> dict[str, Any]:
    """The dict of a ``report.json`` that `gradspec decay` wrote.

    Raises:
        ValueError: the file is not JSON, or not a report of this format
            (``REPORT_FORMAT``); the message says what it is instead.
    """
    import json

    from gradspec._files import json_sha256, read_regular

    path = Path(path)
    what = (f"{str(path)!r} is not a report.json of `gradspec decay`; pass one, the directory "
            "`gradspec decay --out` wrote, or a spectrum store")
    try:
        report = json.loads(read_regular(path, max_bytes=REPORT_MAX_BYTES).decode())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{what} (it is not JSON)") from None
    except RecursionError:
        raise ValueError(f"{what} (it nests too deeply)") from None
    fmt = report.get("format") if isinstance(report, dict) else None
    if fmt != REPORT_FORMAT:
        found = f"format {fmt!r}" if fmt else "no format field"
        raise ValueError(f"{what} ({found}; this gradspec reads {REPORT_FORMAT!r})")
    digest = report.pop(REPORT_DIGEST, None)  # reports written before 2026-12-04 carry none
    if digest is not None and digest != json_sha256(report):
        raise ValueError(f"{str(path)!r} is damaged: its values do not match the digest written with them "
                         "(a changed byte); run `gradspec decay` again")
    return report


#: The key of a report.json's digest: SHA-256 of its other values as canonical JSON (found by
#: review: one flipped bit read sigma's decay as c = 3.083 for 1.083 on the page, exit 0).
REPORT_DIGEST = "digest"
REPORT_MAX_BYTES = 1 << 30


def write_report(report: dict[str, Any], path: str | Path) -> None:
    """Write ``report`` (``DecayAnalysis.to_dict()``) as ``path`` whole or not at all, with the
    digest :func:`read_report` checks."""
    import json

    from gradspec._files import json_sha256, write_text_atomic

    saved = json.loads(json.dumps(report, ensure_ascii=False, allow_nan=False))
    write_text_atomic(Path(path), json.dumps({**saved, REPORT_DIGEST: json_sha256(saved)}, indent=1,
                                             ensure_ascii=False, allow_nan=False))


def _abspath(path: Any) -> str:
    from gradspec.store import resolved_path

    return resolved_path(path)
