"""The Gram pass of a sketched gradient store: linalg's part of the sketch (issue 22).

What a sketched store is, how its blocks map onto the selected columns, the memory their
Grams take and the stated error of σ and U from them live in ``gradspec.sketch``
(``SketchSelection``, ``sketch_selection``, ``check_sketch_memory``, ``error_report``). Here
is only what needs the streamed operator: :func:`plan_for` (an operator's block source ->
its selection), :class:`SketchGram` (the Gram pass that keeps one r×r float64 Gram per
sketch block, and one for the exact columns) and :func:`sketch_report` (the pass's Grams
and its precision's rounding -> ``gradspec.sketch.error_report``).
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from gradspec.linalg._passes import _Gram
from gradspec.linalg._verify import UNIT_ROUNDOFF
from gradspec.sketch import SketchSelection, error_report, sketch_selection


def plan_for(source: Any) -> SketchSelection | None:
    """The sketch selection of an operator's block source (None: not a sketched gradient store)."""
    store = getattr(source, "_store", None)
    if store is None:
        return None
    attr = getattr(store, "sketch", None)  # the store's ``gradspec.sketch`` attribute (it checks the type)
    if attr is None:
        return None
    return sketch_selection(attr, list(source._ranges), int(store.p))


def sketch_report(consumer: SketchGram, op: Any, k: int) -> dict[str, Any]:
    """The ``sketch`` section of the accuracy report (``gradspec.sketch.error_report``) from
    the pass's per-block Grams, with the relative rounding of the operator's Gram products."""
    precision = str(getattr(op, "precision", "float64"))
    unit = UNIT_ROUNDOFF.get(precision, UNIT_ROUNDOFF["float32"])
    rounding = unit * float(np.sqrt(getattr(op, "panel_cols", 8192)))
    grams, exact = consumer.blocks()
    return error_report(consumer.plan, grams, exact, k=k, rounding=rounding)


class SketchGram(_Gram):
    """The Gram pass of a sketched store: one Gram per sketch block (and the exact columns).

    A panel that straddles block boundaries is cut at them; each piece updates its
    block's Gram with the operator's Gram kernel. :meth:`result` is their sum (the Gram
    of the selected columns), :meth:`blocks` the per-block Grams.
    """

    name = "gram"

    def __init__(self, op: Any, plan: SketchSelection) -> None:
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
