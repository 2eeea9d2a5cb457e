"""A sketched store's plan as pca reads it back: its blocks among the selected columns.

A sketched store holds Y = H·Sᵀ (r×M) instead of H (r×p): each row is an M-dimensional
random projection of a gradient (issue 22). Its attribute ``gradspec.sketch`` (the
collector writes it from the plan, ``_dense.plan_attribute``; see docs/store-format.md)
says how: ``kind``, ``version`` (``_plan.VERSIONS``), ``seed``, ``M`` (stored columns),
``p`` (the unsketched parameter count), ``blocks`` — for each of J ≥ 2 independent sketch
blocks, its half-open column ranges — and ``exact``, the columns stored as they are (may be
empty). The collector guarantees

    Y·Yᵀ = Y_e·Y_eᵀ + Σ_j Y_j·Y_jᵀ,   E[Y_e·Y_eᵀ + J·Y_j·Y_jᵀ] = H·Hᵀ for every j,

blocks independent. The exact method's Gram pass (``gradspec.linalg``'s ``SketchGram``)
therefore accumulates one r×r float64 Gram per block (and one for the exact columns) instead
of one in all — the same r²·M flops, since the blocks' Grams sum to the Gram — and
``_error.error_report`` turns their spread into the stated error of σ and U.
:func:`sketch_selection` checks the attribute and maps the blocks onto the columns pca
selects (:class:`SketchSelection`); :func:`check_sketch_memory` refuses per-block Grams
over half the memory budget: (J + 2)·r²·8 bytes for the Grams (J blocks, the exact
columns, the sum), (J + 6)·r²·8 with their analysis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gradspec._units import size_text
from gradspec.sketch._plan import VERSION, VERSIONS


def _ranges(value: Any, what: str, m: int, key: str) -> list[tuple[int, int]]:
    if not isinstance(value, list):
        raise ValueError(f"{key}: {what} is not a list of [start, stop] ranges")
    out = []
    for item in value:
        if (not isinstance(item, list | tuple) or len(item) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
            raise ValueError(f"{key}: {what} holds {item!r}, not a [start, stop] pair")
        a, b = int(item[0]), int(item[1])
        if not 0 <= a < b <= m:
            raise ValueError(f"{key}: {what} range [{a}, {b}) is outside the {m} stored columns")
        out.append((a, b))
    return out


@dataclass(frozen=True)
class SketchSelection:
    """Where each sketch block's columns lie among the *selected* columns of H.

    ``segments``: sorted, disjoint (start, stop, block) in selected-column offsets;
    block J is the exact columns.
    """

    kind: str
    seed: Any
    M: int
    p: int
    J: int
    segments: tuple[tuple[int, int, int], ...]
    exact_cols: int
    blocks_selected: int = 0
    #: Every sketched column is selected: the J blocks are whole (pca refuses anything else).
    whole: bool = True
    #: The plan version (``gradspec.sketch``'s rules; decides the error statement).
    version: int = VERSION

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "seed": self.seed, "M": self.M, "p": self.p, "J": self.J,
                "exact_columns": self.exact_cols, "version": self.version}


def sketch_selection(attr: dict[str, Any], selected: list[tuple[int, int]], stored_cols: int) -> SketchSelection | None:
    """Check a ``gradspec.sketch`` attribute and map its blocks onto the selected column ranges.

    The error can be stated only when every sketched column is selected (fewer blocks, or a
    block cut short, no longer estimate H·Hᵀ at its scale: ``whole`` is False, and ``pca``
    refuses the selection); the exact columns may be selected in part. None: only exactly
    stored columns are selected.

    Raises:
        ValueError: a malformed attribute.
    """
    from gradspec.store import SKETCH_KEY  # the store names its attribute (zarr: when first used)

    if attr.get("version") not in VERSIONS:
        raise ValueError(f"{SKETCH_KEY} has version {attr.get('version')!r}; this gradspec reads "
                         f"versions {', '.join(map(str, VERSIONS))}: upgrade gradspec")
    m = attr.get("M")
    if not isinstance(m, int) or m != stored_cols:
        raise ValueError(f"{SKETCH_KEY}: M = {m!r}, but the store holds {stored_cols} columns: the "
                         "store is damaged")
    blocks = attr.get("blocks")
    if not isinstance(blocks, list) or len(blocks) < 2:
        raise ValueError(f"{SKETCH_KEY}: blocks must list J >= 2 independent sketch blocks; the spread "
                         "of one block cannot state an error")
    per_block = [_ranges(b, f"block {j}", m, SKETCH_KEY) for j, b in enumerate(blocks)]
    exact = _ranges(attr.get("exact", []), "exact", m, SKETCH_KEY)
    labelled = sorted((a, b, j) for j, rs in enumerate([*per_block, exact]) for a, b in rs)
    covered = 0
    for a, b, _ in labelled:
        if a != covered:
            problem = "overlap" if a < covered else f"leave columns {covered}..{a - 1} out"
            raise ValueError(f"{SKETCH_KEY}: the blocks and exact ranges {problem}: the store is damaged")
        covered = b
    if covered != m:
        raise ValueError(f"{SKETCH_KEY}: the blocks and exact ranges leave columns {covered}..{m - 1} "
                         "out: the store is damaged")
    J = len(per_block)
    segments: list[tuple[int, int, int]] = []
    taken = np.zeros(J + 1, dtype=np.int64)
    off = 0
    for sa, sb in selected:
        for a, b, j in labelled:
            lo, hi = max(a, sa), min(b, sb)
            if lo < hi:
                segments.append((off + lo - sa, off + hi - sa, j))
                taken[j] += hi - lo
        off += sb - sa
    sizes = [sum(b - a for a, b in rs) for rs in per_block]
    whole = all(taken[j] == sizes[j] for j in range(J))
    if not whole and not taken[:J].any():
        return None  # only exactly stored columns: a plain sub-matrix of H
    segments.sort()
    p = attr.get("p")
    exact_total = sum(b - a for a, b in exact)
    p_sel = int(p) - (exact_total - int(taken[J])) if isinstance(p, int) else -1
    return SketchSelection(kind=str(attr.get("kind")), seed=attr.get("seed"), M=m, p=p_sel, J=J,
                           segments=tuple(segments) if whole else (), exact_cols=int(taken[J]),
                           blocks_selected=int(sum(taken[j] == sizes[j] for j in range(J))), whole=whole,
                           version=int(attr["version"]))


def sketch_memory(r: int, J: int) -> int:
    """Bytes of the per-block Grams and what their analysis holds at once: (J + 6)·r²·8."""
    return (J + 6) * r * r * 8


def check_sketch_memory(plan: SketchSelection, r: int, budget: int) -> None:
    """Refuse, in one line, per-block Grams over half the memory budget."""
    need = sketch_memory(r, plan.J)
    if need > budget // 2:
        raise ValueError(
            f"the sketch error needs one {r}×{r} float64 Gram per sketch block ({plan.J} blocks, "
            f"{size_text(need)} with its analysis), over half the memory budget of "
            f"{size_text(budget)}; raise --memory or select fewer rows"
        )
