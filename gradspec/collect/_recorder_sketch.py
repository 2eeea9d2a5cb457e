"""``GradientRecorder(sketch=M)``: the plan of a recorder's sketched per-step rows (issue 37).

The plan is made before the loop runs, with columns split by ``sqrt(numel)``
(:func:`recorder_sketch`, which refuses an M that cannot work before anything is written). With
``sketch_weights="energy"`` (the default) that plan is provisional: the writer's store waits
(:func:`open_sketched_store`) for the first recorded row, whose per-parameter energies split the
columns as ``collect --sketch`` splits them from its warm-up batch (:func:`settle_plan`). A
resumed recorder keeps the plan its store was written with (:func:`store_plan`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from gradspec.collect._recorder_setup import open_store, refuse_existing
from gradspec.store import GradientStore

logger = logging.getLogger(__name__)

#: How ``GradientRecorder(sketch=)`` splits its plan's columns (``sketch_weights``), as ``collect --sketch-weights``.
SKETCH_WEIGHTS = ("energy", "sqrt-size")


def recorder_sketch(recorder: Any, sketch: int | None, *, seed: int, blocks: int, weights: str,
                    store: GradientStore | None) -> Any:
    """The plan of ``GradientRecorder(sketch=M)`` (None without ``sketch``): each per-step row
    (p values) is stored as its M-column sketch, computed on the writer (rank 0, from the row
    every rank holds after DDP's all-reduce, by :func:`dense_sketch`); every rank makes the
    plan, so that all refuse alike.

    The plan returned splits the columns by ``sqrt(numel)``. With ``weights="energy"`` it is
    provisional: the recorder replaces it by :func:`energy_plan` of its first row (and keeps it
    if the recorder ends before recording one); it refuses an M too small for every parameter
    here, before the loop runs. A resumed recorder keeps its store's plan (:func:`store_plan`).

    Raises:
        ValueError: per-example rows, a caller's ``store``, an M at or above p, an M too small,
            an unknown ``weights``.
    """
    if sketch is None:
        return None
    layout, writer = recorder.layout, recorder.ranks.is_writer
    if recorder.per_example:
        raise ValueError("GradientRecorder(sketch=M) sketches per-step rows (record_step); sketched per-example "
                         "rows come from gradspec collect --per-example --sketch M (ghost clipping)")
    if store is not None:
        raise ValueError("sketch= with store=: the store's own plan (gradspec.sketch) decides its rows")
    if weights not in SKETCH_WEIGHTS:
        raise ValueError(f"sketch_weights={weights!r}: one of {', '.join(map(repr, SKETCH_WEIGHTS))}")
    from gradspec.sketch import check_width, dense_kinds, make_plan, width_note

    check_width(int(sketch), layout.p, option="sketch=")
    plan = make_plan(layout, dense_kinds(layout, recorder.model), int(sketch), seed=int(seed), blocks=int(blocks))
    note = width_note(plan)
    if note and writer and weights == "sqrt-size":
        logger.info("sketch: %s", note)
    return plan


def dense_sketch(recorder: Any, plan: Any) -> Any:
    """The writer's `gradspec.sketch.DenseSketch` of ``plan`` (float32, on the recorded parameters' device)."""
    from gradspec.sketch import DenseSketch

    device = recorder.params[0].device if recorder.params else "cpu"
    return DenseSketch(plan, device=device, dtype=torch.float32)


def store_plan(recorder: Any, attribute: Mapping[str, Any]) -> tuple[Any, Any]:
    """(plan, `DenseSketch` or None) of a resumed store: the plan its rows were written with."""
    from gradspec.sketch import SketchPlan

    plan = SketchPlan.from_dict(attribute)
    return plan, dense_sketch(recorder, plan) if recorder.ranks.is_writer else None


def energy_plan(recorder: Any, provisional: Any, row: Tensor) -> tuple[Any, Any]:
    """(plan, `DenseSketch` or None) with columns split by the energies of ``row``, the first
    per-step row (`gradspec.sketch.row_energies`, hedged by `gradspec.sketch.energy_weights`):
    the split ``collect --sketch`` makes from its warm-up batch. ``provisional`` (the
    ``sqrt(numel)`` plan) is kept, with a warning, where the row's energies cannot split the
    columns (an all-zero row, or an M too small for the energy split)."""
    from gradspec.sketch import dense_kinds, energy_weights, make_plan, row_energies, width_note

    layout = recorder.layout
    try:
        weights = energy_weights(layout, row_energies(layout, row))
        plan = make_plan(layout, dense_kinds(layout, recorder.model), provisional.requested_M, seed=provisional.seed,
                         blocks=provisional.n_blocks, weights=weights)
    except ValueError as e:
        if recorder.ranks.is_writer:
            logger.warning("sketch: columns split by sqrt(size), not by the first row's energies: %s", e)
        plan = provisional
    note = width_note(plan)
    if note and recorder.ranks.is_writer:
        logger.info("sketch: %s", note)
    return plan, dense_sketch(recorder, plan) if recorder.ranks.is_writer else None


def open_sketched_store(recorder: Any, args: dict[str, Any]) -> GradientStore | None:
    """The writer's store of a ``sketch=M`` recorder (``args``: `open_store`'s), with the writer's
    `DenseSketch` set on the recorder: a resumed store with the plan it was written with; a new
    one with the ``sqrt(numel)`` plan, or, for an energy split, None: the arguments wait on the
    recorder (``_pending``) for :func:`settle_plan` at the first row (an existing store is
    refused now, as it would be)."""
    if recorder._plan_from_row:
        refuse_existing(recorder.out, args["overwrite"])
        recorder._pending = args
        return None
    store = open_store(recorder.out, layout=recorder.plan.column_layout(), plan=recorder.plan, keep_plan=True, **args)
    if args["resume"]:
        recorder.plan, recorder._sketch = store_plan(recorder, store.sketch)
    else:
        recorder._sketch = dense_sketch(recorder, recorder.plan)
    return store


def settle_plan(recorder: Any, row: Tensor | None) -> None:
    """Make the energy-split plan from the first row (None: no row was recorded; the
    ``sqrt(numel)`` split stays), then create the store it waited for (on the writer; config given
    before it is already in its run config)."""
    recorder._plan_from_row = False
    if row is not None:  # (without one the recorder is closing: nothing is left to sketch)
        recorder.plan, recorder._sketch = energy_plan(recorder, recorder.plan, row)
    if recorder._pending is None:  # a rank that does not write
        return
    args, recorder._pending = recorder._pending, None
    recorder.store = open_store(recorder.out, layout=recorder.plan.column_layout(), plan=recorder.plan, **args)
    recorder._writer = recorder._new_writer()
