"""The sketch of a ``--sketch M`` run's rows (issues 22 and 37): its plan, and who computes it.

Per-example rows are sketched by ghost clipping from its captured layer inputs and output
gradients (the kinds its rules compute; `GhostClipping.set_sketch`). A per-step row, the step's
mean clipped gradient (Li et al. 2022 §4.2; under torchrun the writer's, after the ranks'
all-reduce), is one dense vector the step already holds: it is sketched whole, whatever the
per-example engine, by `gradspec.sketch.DenseSketch` (O(p M) once a step), with the kinds
`gradspec.sketch.dense_kinds` gives its parameters (the ghost rules' kinds), so both row kinds
of one model and seed share one map.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from gradspec._enums import CollectMode
from gradspec._layout import ParamLayout
from gradspec.train._config import TrainConfig

logger = logging.getLogger(__name__)


def sketch_plan(config: TrainConfig, layout: ParamLayout, model: nn.Module, ghost: Any, device: torch.device, *,
                log: bool = True) -> tuple[Any, Any]:
    """(plan, `DenseSketch` or None) of a ``--sketch`` run; (None, None) without a sketch.

    Args:
        config: the run's settings (``sketch``, ``sketch_seed``, ``sketch_blocks``, ``mode``).
        layout: the unsketched row's parameters.
        model: the module they belong to (an embedding is known by its type).
        ghost: the run's `GhostClipping` (per-example rows: it computes their sketch).
        device: where a per-step row's sketch runs.
        log: say, in one INFO line, why the plan stores fewer columns than were asked for.

    Raises:
        ValueError: M at or above p (`gradspec.sketch.check_width`), or too small for every
            sketched parameter a column a block (`gradspec.sketch.make_plan`).
    """
    if config.sketch is None:
        return None, None
    from gradspec.sketch import check_width, dense_kinds, make_plan, width_note

    check_width(config.sketch, layout.p)
    per_example = config.mode == CollectMode.PER_EXAMPLE
    kinds = ghost.sketch_kinds() if per_example else dense_kinds(layout, model)
    plan = make_plan(layout, kinds, config.sketch, seed=config.sketch_seed, blocks=config.sketch_blocks)
    note = width_note(plan)
    if note and log:
        logger.info("sketch: %s", note)
    return use_plan(plan, config, ghost, device)


def use_plan(plan: Any, config: TrainConfig, ghost: Any, device: torch.device) -> tuple[Any, Any]:
    """(plan, `DenseSketch` or None): ``plan`` set up to sketch the run's rows (per-example:
    by ``ghost``; per-step: a `DenseSketch` on ``device``)."""
    from gradspec.sketch import DenseSketch

    if config.mode == CollectMode.PER_EXAMPLE:
        ghost.set_sketch(plan)
        return plan, None
    return plan, DenseSketch(plan, device=device, dtype=torch.float32)


def plan_of_store(attribute: dict[str, Any] | None, config: TrainConfig) -> Any:
    """The plan a resumed run keeps: its store's (``gradspec.sketch``), when the store was
    written with the run's sketch settings (M, seed, blocks), even by rules this gradspec no
    longer makes (a version-1 plan); None otherwise (the resume then refuses other settings)."""
    if attribute is None or config.sketch is None:
        return None
    from gradspec.sketch import SketchPlan

    made = (attribute.get("requested_M"), attribute.get("seed"), len(attribute.get("blocks") or []))
    if made != (config.sketch, config.sketch_seed, config.sketch_blocks):
        return None
    return SketchPlan.from_dict(attribute)
