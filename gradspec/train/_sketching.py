"""The sketch of a ``--sketch M`` run's rows (issues 22 and 37): its plan, and who computes it.

Per-example rows are sketched by ghost clipping from its captured layer inputs and output
gradients (the kinds its rules compute; `GhostClipping.set_sketch`), by the version-2 rules
(``FACTORED_VERSION``: no per-example gradient is formed to mask); with ``--backend vmap`` or
``hooks`` the per-example gradients are formed, and sketched as per-step rows are. A per-step row, the step's
mean clipped gradient (Li et al. 2022 §4.2; under torchrun the writer's, after the ranks'
all-reduce), is one dense vector the step already holds: it is sketched whole, whatever the
per-example engine, by `gradspec.sketch.DenseSketch` (O(p M) once a step), with the kinds
`gradspec.sketch.dense_kinds` gives its parameters (the ghost rules' kinds) and the newest
rules (version 4): the row is formed, so each Kronecker kind's G has its columns mixed and its
values sign-masked first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gradspec._enums import CollectMode
from gradspec._layout import ParamLayout
from gradspec.train._config import TrainConfig

logger = logging.getLogger(__name__)


def sketch_plan(config: TrainConfig, layout: ParamLayout, model: nn.Module, ghost: Any, device: torch.device, *,
                log: bool = True, energies: Callable[[], dict[str, float]] | None = None) -> tuple[Any, Any]:
    """(plan, `DenseSketch` or None) of a ``--sketch`` run; (None, None) without a sketch.

    Args:
        config: the run's settings (``sketch``, ``sketch_seed``, ``sketch_blocks``,
            ``sketch_weights``, ``mode``).
        layout: the unsketched row's parameters.
        model: the module they belong to (an embedding is known by its type).
        ghost: the run's `GhostClipping` (per-example rows: it computes their sketch).
        device: where a per-step row's sketch runs.
        log: say, in one INFO line, why the plan stores fewer columns than were asked for.
        energies: ``sketch_weights="energy"``: measures each parameter's gradient energy
            (`warmup_energies`); called only when a plan is made.

    Raises:
        ValueError: M at or above p (`gradspec.sketch.check_width`), or too small for every
            sketched parameter a column a block (`gradspec.sketch.make_plan`).
    """
    if config.sketch is None:
        return None, None
    from gradspec.sketch import (
        FACTORED_VERSION,
        VERSION,
        check_width,
        dense_kinds,
        energy_weights,
        make_plan,
        width_note,
    )

    check_width(config.sketch, layout.p)
    by_ghost = config.mode == CollectMode.PER_EXAMPLE and ghost is not None
    kinds = ghost.sketch_kinds() if by_ghost else dense_kinds(layout, model)
    weights = None
    if config.sketch_weights == "energy":
        if energies is None:
            raise ValueError("sketch_weights='energy' needs the warm-up batch's energies")
        weights = energy_weights(layout, energies())
    plan = make_plan(layout, kinds, config.sketch, seed=config.sketch_seed, blocks=config.sketch_blocks,
                     weights=weights, version=FACTORED_VERSION if by_ghost else VERSION)
    note = width_note(plan)
    if note and log:
        logger.info("sketch: %s", note)
    return use_plan(plan, config, ghost, device)


def warmup_energies(config: TrainConfig, layout: ParamLayout, warm: Any) -> dict[str, float]:
    """Each parameter's gradient energy in the run's warm-up batch (a
    `gradspec.train._norm_shares.WarmupBatch`): the plan's column weights.

    Per-example rows: the mean squared clipped norm per parameter; per-step rows: the squared
    norm per parameter of the batch's mean clipped gradient (what a stored row holds).
    """
    if config.mode != CollectMode.PER_EXAMPLE:
        from gradspec.sketch import row_energies

        return row_energies(layout, warm.total.double() / max(warm.examples, 1))
    e = warm.energies.mean(0).to("cpu", torch.float64)
    return {s.name: float(v) for s, v in zip(layout.params, e, strict=True)}


def use_plan(plan: Any, config: TrainConfig, ghost: Any, device: torch.device) -> tuple[Any, Any]:
    """(plan, `DenseSketch` or None): ``plan`` set up to sketch the run's rows (per-example
    rows by ``ghost``; formed rows, per step or per example with vmap or hooks, by a
    `DenseSketch` on ``device``)."""
    from gradspec.sketch import DenseSketch

    if config.mode == CollectMode.PER_EXAMPLE and ghost is not None:
        ghost.set_sketch(plan)
        return plan, None
    return plan, DenseSketch(plan, device=device, dtype=torch.float32)


def plan_of_store(attribute: dict[str, Any] | None, config: TrainConfig) -> Any:
    """The plan a resumed run keeps: its store's (``gradspec.sketch``), when the store was
    written with the run's sketch settings (M, seed, blocks), even by rules this gradspec no
    longer makes (a version-1 plan); None otherwise (the resume then refuses other settings)."""
    if attribute is None or config.sketch is None:
        return None
    from gradspec.sketch import SketchPlan, plan_settings

    if plan_settings(attribute) != (config.sketch, config.sketch_seed, config.sketch_blocks):
        return None
    return SketchPlan.from_dict(attribute)
