"""Which per-example engine a run uses (``--backend auto|ghost|vmap|hooks``), and why.

Ghost clipping (`GhostClipping`) forms the step's clipped sum without per-example rows; ``auto``
takes it wherever it applies and is checked against a batch-of-one loop first, so a misfit
falls back to vmap instead of training on wrong norms.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gradspec._enums import CollectMode, PerExampleBackend
from gradspec.tasks import Task
from gradspec.train._config import TrainConfig
from gradspec.train._hooks import StepHooks


def choose_engine(config: TrainConfig, task: Task, hooks: StepHooks, model: nn.Module, names: list[str],
                  device: torch.device) -> tuple[Any, str, str]:
    """(GhostClipping or None, the engine's name, why ``auto`` chose it); ``auto`` takes
    ghost where it applies (batch mode, hooks that need no rows, layers it handles, its
    batch-of-one check passed) and vmap otherwise."""
    from gradspec.train._ghost import GhostClipping

    backend = config.backend
    if (config.sketch is not None and config.mode == CollectMode.PER_EXAMPLE
            and backend in (PerExampleBackend.GHOST, PerExampleBackend.AUTO)):  # vmap, hooks: rows formed
        probe = None
        if len(task.train) >= 2:
            probe = {k: v.to(device) for k, v in task.train.batch(torch.arange(2)).items()}
        try:
            engine = GhostClipping(model, task.forward, task.loss, names,
                                   microbatch=config.microbatch, probe_batch=probe)
        except ValueError as err:  # vmap cannot sketch: the way out is to leave the layer out
            raise ValueError(str(err).replace("; use backend='vmap'", "") + "; --sketch needs ghost clipping "
                             "for every selected parameter: leave it out of --params") from None
        return (engine, PerExampleBackend.GHOST.value,
                "--sketch: the sketched rows come from ghost clipping's layer inputs and output gradients")
    if backend == PerExampleBackend.AUTO:
        vmap = PerExampleBackend.VMAP.value
        if config.mode != CollectMode.BATCH:
            return None, vmap, "auto: --mode per-example stores the rows ghost clipping never forms"
        if hooks.needs_rows:
            return None, vmap, f"auto: {hooks.name} changes each per-example gradient before clipping"
        probe = None
        if len(task.train) >= 2:  # checked against a batch-of-one loop now, so a misfit falls back
            probe = {k: v.to(device) for k, v in task.train.batch(torch.arange(2)).items()}
        try:
            engine = GhostClipping(model, task.forward, task.loss, names,
                                   microbatch=config.microbatch, probe_batch=probe)
        except ValueError as err:
            return None, vmap, f"auto: {err}"
        return engine, PerExampleBackend.GHOST.value, "auto: every selected layer has a ghost-clipping rule"
    if backend == PerExampleBackend.GHOST:
        return GhostClipping(model, task.forward, task.loss, names,
                             microbatch=config.microbatch), backend.value, ""
    return None, backend.value, ""
