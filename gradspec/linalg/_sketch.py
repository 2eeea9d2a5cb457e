"""Sketched gradient stores: their sketch layout, and the Gram pass that keeps each block's Gram.

A sketched store holds Y = H·Sᵀ (r×M) instead of H (r×p): each row is an M-dimensional
random projection of a gradient (issue 22). Its attribute ``gradspec.sketch`` (the
collector writes it, see docs/store-format.md) says how: ``kind``, ``version`` (1),
``seed``, ``M`` (stored columns), ``p`` (the unsketched parameter count), ``blocks`` —
for each of J ≥ 2 independent sketch blocks, its half-open column ranges — and
``exact``, the columns stored as they are (may be empty). The collector guarantees

    Y·Yᵀ = Y_e·Y_eᵀ + Σ_j Y_j·Y_jᵀ,   E[Y_e·Y_eᵀ + J·Y_j·Y_jᵀ] = H·Hᵀ for every j,

blocks independent. The exact method's Gram pass (``SketchGram``) therefore
accumulates one r×r float64 Gram per block (and one for the exact columns) instead
of one in all — the same r²·M flops, since the blocks' Grams sum to the Gram — and
``_sketch_error`` turns their spread into the stated error of σ and U. Memory:
(J + 2)·r²·8 bytes for the Grams (J blocks, the exact columns, the sum), checked
against the budget by :func:`check_sketch_memory`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import numpy as np

from gradspec._units import size_text
from gradspec.linalg._passes import _Gram
from gradspec.store import SKETCH_KEY

SKETCH_VERSION = 2
#: The plan versions read (gradspec.sketch.VERSIONS): 1 (issue 22) gets ``_sketch_error``'s
#: perturbation statement, 2 (issue 37) the block bootstrap of ``_sketch_jackknife``.
SKETCH_VERSIONS = (1, 2)


def read_sketch(store: Any) -> dict[str, Any] | None:
    """The ``gradspec.sketch`` attribute of a gradient store (None: not sketched); the
    store checks its type."""
    return getattr(store, "sketch", None)


def _ranges(value: Any, what: str, m: int) -> list[tuple[int, int]]:
    if not isinstance(value, list):
        raise ValueError(f"{SKETCH_KEY}: {what} is not a list of [start, stop] ranges")
    out = []
    for item in value:
        if (not isinstance(item, list | tuple) or len(item) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
            raise ValueError(f"{SKETCH_KEY}: {what} holds {item!r}, not a [start, stop] pair")
        a, b = int(item[0]), int(item[1])
        if not 0 <= a < b <= m:
            raise ValueError(f"{SKETCH_KEY}: {what} range [{a}, {b}) is outside the {m} stored columns")
        out.append((a, b))
    return out


@dataclass(frozen=True)
class SketchPlan:
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
    version: int = SKETCH_VERSION

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "seed": self.seed, "M": self.M, "p": self.p, "J": self.J,
                "exact_columns": self.exact_cols, "version": self.version}


def sketch_plan(attr: dict[str, Any], selected: list[tuple[int, int]], stored_cols: int) -> SketchPlan | None:
    """Check a ``gradspec.sketch`` attribute and map its blocks onto the selected column ranges.

    The error can be stated only when every sketched column is selected (fewer blocks, or a
    block cut short, no longer estimate H·Hᵀ at its scale: ``whole`` is False, and ``pca``
    refuses the selection); the exact columns may be selected in part. None: only exactly
    stored columns are selected.

    Raises:
        ValueError: a malformed attribute.
    """
    if attr.get("version") not in SKETCH_VERSIONS:
        raise ValueError(f"{SKETCH_KEY} has version {attr.get('version')!r}; this gradspec reads "
                         f"versions {', '.join(map(str, SKETCH_VERSIONS))}: upgrade gradspec")
    m = attr.get("M")
    if not isinstance(m, int) or m != stored_cols:
        raise ValueError(f"{SKETCH_KEY}: M = {m!r}, but the store holds {stored_cols} columns: the "
                         "store is damaged")
    blocks = attr.get("blocks")
    if not isinstance(blocks, list) or len(blocks) < 2:
        raise ValueError(f"{SKETCH_KEY}: blocks must list J >= 2 independent sketch blocks; the spread "
                         "of one block cannot state an error")
    per_block = [_ranges(b, f"block {j}", m) for j, b in enumerate(blocks)]
    exact = _ranges(attr.get("exact", []), "exact", m)
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
    return SketchPlan(kind=str(attr.get("kind")), seed=attr.get("seed"), M=m, p=p_sel, J=J,
                      segments=tuple(segments) if whole else (), exact_cols=int(taken[J]),
                      blocks_selected=int(sum(taken[j] == sizes[j] for j in range(J))), whole=whole,
                      version=int(attr["version"]))


def plan_for(source: Any) -> SketchPlan | None:
    """The sketch plan of an operator's block source (None: not a sketched gradient store)."""
    store = getattr(source, "_store", None)
    if store is None:
        return None
    attr = read_sketch(store)
    if attr is None:
        return None
    return sketch_plan(attr, list(source._ranges), int(store.p))


def sketch_memory(r: int, J: int) -> int:
    """Bytes of the per-block Grams and what their analysis holds at once: (J + 6)·r²·8."""
    return (J + 6) * r * r * 8


def check_sketch_memory(plan: SketchPlan, r: int, budget: int) -> None:
    """Refuse, in one line, per-block Grams over half the memory budget."""
    need = sketch_memory(r, plan.J)
    if need > budget // 2:
        raise ValueError(
            f"the sketch error needs one {r}×{r} float64 Gram per sketch block ({plan.J} blocks, "
            f"{size_text(need)} with its analysis), over half the memory budget of "
            f"{size_text(budget)}; raise --memory or select fewer rows"
        )


class SketchGram(_Gram):
    """The Gram pass of a sketched store: one Gram per sketch block (and the exact columns).

    A panel that straddles block boundaries is cut at them; each piece updates its
    block's Gram with the operator's Gram kernel. :meth:`result` is their sum (the Gram
    of the selected columns), :meth:`blocks` the per-block Grams.
    """

    name = "gram"

    def __init__(self, op: Any, plan: SketchPlan) -> None:
        self.plan = plan
        kernel = op.gram_kernel()
        r = op.shape[0]
        self.kernels = [kernel(r, op.device) for _ in range(plan.J)]
        self.exact = kernel(r, op.device) if plan.exact_cols else None
        self.starts = [s[0] for s in plan.segments]
        self._done: tuple[list[np.ndarray], np.ndarray | None] | None = None

    def update(self, off: int, p: Any, raw: Any) -> None:
        w = p.shape[1]
        i = max(bisect.bisect_right(self.starts, off) - 1, 0)
        segs = self.plan.segments
        while i < len(segs) and segs[i][0] < off + w:
            a, b, j = segs[i]
            lo, hi = max(a, off), min(b, off + w)
            if lo < hi:
                piece = p if (lo, hi) == (off, off + w) else p[:, lo - off : hi - off].contiguous()
                (self.exact if j == self.plan.J else self.kernels[j]).update(piece)
            i += 1

    def _all(self) -> list[Any]:
        return [*self.kernels, *([self.exact] if self.exact is not None else [])]

    def diagonal(self) -> np.ndarray:
        return np.sum([k.diagonal() for k in self._all()], axis=0)

    def blocks(self) -> tuple[list[np.ndarray], np.ndarray | None]:
        """(the J block Grams Y_j·Y_jᵀ, the exact columns' Gram or None), after the pass."""
        if self._done is None:
            self._done = ([k.result() for k in self.kernels],
                          None if self.exact is None else self.exact.result())
        return self._done

    def result(self) -> np.ndarray:
        grams, exact = self.blocks()
        total = np.sum(grams, axis=0)
        return total if exact is None else total + exact
