"""From stores to a decay analysis: the one place in ``gradspec.spectrum`` that meets the stores.

It opens nothing itself beyond ``gradspec.store`` (which owns zarr): it reads σ,
V and the provenance of a spectrum store, finds the rows the spectrum was
computed from in its source gradient store (same rows, same parameter
selection), and hands column-block iterators to the pure numerics of
:func:`analyze_spectrum`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from gradspec.spectrum._report import DecayAnalysis, DecayConfig, analyze_spectrum

logger = logging.getLogger(__name__)


def rows_from_source(desc: Any, committed: int) -> slice | np.ndarray | None:
    """The row selection a spectrum recorded (``describe_rows`` format) as a slice or indices.

    ``None`` (all rows) becomes ``slice(0, committed)``: the rows committed when the
    spectrum was computed. Returns None when only a count of indices was recorded.
    """
    if desc is None:
        return slice(0, committed)
    if "indices" in desc:
        return np.asarray(desc["indices"], dtype=np.int64)
    if "start" in desc or "stop" in desc:
        return slice(desc.get("start"), desc.get("stop"), desc.get("step"))
    return None


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


def _describe(rows: slice | np.ndarray | None) -> Any:
    if rows is None:
        return None
    if isinstance(rows, slice):
        return {"start": rows.start, "stop": rows.stop, "step": rows.step}
    return {"n_indices": int(np.asarray(rows).size)}


def _same_path(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return str(a) == str(b)


def decay_analysis(
    *,
    spectrum: Any,
    gradients: Any | None = None,
    heldout_rows: slice | str | None = None,
    use_gradients: bool = True,
    config: DecayConfig | None = None,
    progress: bool = False,
) -> DecayAnalysis:
    """Analyse a spectrum store, measuring G_k on its source rows and on held-out rows.

    Args:
        spectrum: a spectrum store path or an open ``SpectrumStore`` (status complete).
        gradients: a gradient store path or ``GradientStore``; default the spectrum's
            source store. When it *is* the source store, the spectrum's own rows are
            analysed as ``collected`` and ``heldout_rows`` of it as ``heldout``; for
            another store, ``heldout_rows`` of it (default all) are ``heldout``.
        heldout_rows: rows of the gradient store to treat as held out (``"A:B"`` or a slice).
        use_gradients: False analyses σ only (no pass over any gradient store).
        config: analysis settings.
        progress: log progress.

    Raises:
        ValueError: an unfinished spectrum, gradient rows whose width differs from V,
            or a held-out range that selects no rows.
    """
    from gradspec.store import GradientStore
    from gradspec.store._spectrum import SpectrumStore

    spec = spectrum if isinstance(spectrum, SpectrumStore) else SpectrumStore.open(spectrum)
    if spec.status != "complete":
        raise ValueError(
            f"{spec.path!r} is not complete (status {spec.status!r}); finish `gradspec pca` first"
        )
    attrs = spec.attrs
    src = spec.source
    frob2 = attrs.get("gradspec.frob2")
    V = spec.V
    p = int(V.shape[0])
    sources: dict[str, Any] = {
        "spectrum": {
            "path": spec.path,
            "method": spec.method,
            "k": spec.k,
            "shape": list(spec.shape),
            "source": src,
            "accuracy": attrs.get("gradspec.accuracy"),
        },
    }
    kw: dict[str, Any] = {}
    notes: list[str] = []
    if src.get("center"):
        notes.append("the spectrum was computed on column-centred rows; G_k uses the raw rows")
    if isinstance(heldout_rows, str):
        heldout_rows = parse_row_range(heldout_rows)
    if use_gradients:
        grad_path = gradients.path if hasattr(gradients, "path") else gradients
        if grad_path is None:
            grad_path = src.get("path")
            if grad_path is None or not Path(grad_path).exists():
                logger.warning(
                    "the spectrum's source store %r is not available; analysing σ only", grad_path
                )
                notes.append(f"source gradient store {grad_path!r} not found: G_k not measured")
                grad_path = None
        if grad_path is not None:
            store = (
                gradients
                if hasattr(gradients, "iter_col_blocks")
                else GradientStore.open(grad_path)
            )
            ranges = src.get("col_ranges") or [(0, store.p)]
            ranges = [(int(a), int(b)) for a, b in ranges]
            width = sum(b - a for a, b in ranges)
            if width != p:
                raise ValueError(
                    f"{store.path!r} gives {width} columns with the spectrum's parameter selection, "
                    f"but V has {p} rows; pass the gradient store the spectrum was computed from"
                )
            is_source = src.get("path") is not None and _same_path(store.path, src["path"])
            row_sets: dict[str, Any] = {}
            if is_source:
                rows = rows_from_source(
                    src.get("rows"), int(src.get("committed_rows", store.n_rows))
                )
                if rows is None:
                    notes.append(
                        "the spectrum's row indices were not recorded: collected rows skipped"
                    )
                else:
                    row_sets["collected"] = rows
                if heldout_rows is not None:
                    row_sets["heldout"] = heldout_rows
            else:
                row_sets["heldout"] = (
                    heldout_rows if heldout_rows is not None else slice(0, store.n_rows)
                )
            for name, rows in row_sets.items():
                n_sel = store.n_selected(rows)
                if n_sel == 0:
                    raise ValueError(
                        f"the {name} row selection {_describe(rows)} of {store.path!r} is empty "
                        f"({store.n_rows} committed rows)"
                    )
                sources[name] = {
                    "path": store.path,
                    "rows": _describe(rows),
                    "n_rows": n_sel,
                    "col_ranges": ranges,
                }
                kw[name] = store.iter_col_blocks(rows=rows, col_ranges=ranges)
                kw[f"{name}_steps"] = store.row_meta(rows)["step"]
    analysis = analyze_spectrum(
        sigma=spec.sigma,
        config=config,
        basis=V if kw else None,
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
