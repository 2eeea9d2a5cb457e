"""What the hooks of a DP-SGD step may read: a public, frozen view of the run.

The trainer builds one :class:`StepContext` when a run starts (or resumes) and hands it
to :meth:`StepHooks.setup <gradspec.train.StepHooks.setup>` and to every
:meth:`~gradspec.train.StepHooks.on_step_start`. The hooks change the step only through
their return values (and the accountant they are handed in ``record_privacy``); the
context is for reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from gradspec.store import ParamLayout
    from gradspec.tasks import Task
    from gradspec.train._per_example import PerExampleGradients

__all__ = ["StepContext"]


@dataclass(frozen=True)
class StepContext:
    """The run, as the hooks of its DP-SGD step see it.

    The step divides the noised clipped sum by ``denominator`` when private (noise multiplier > 0):
    the expected batch size q n under Poisson sampling, the fixed batch size B under
    shuffling (Abadi et al. 2016). A non-private step divides by the drawn batch size.

    Attributes:
        config: the run's settings (a :class:`~gradspec.train.TrainConfig`).
        noise_multiplier: z; the noise std on the clipped sum is z * C. 0 = non-private.
        sample_rate: q, the sampler's rate (B / n).
        n: the number of training examples.
        denominator: what a private step divides the noised clipped sum by (q n or B),
            computed once, here.
        layout: the flattened selected parameters (``layout.p`` of them).
        device: where the model, the gradients and the noise live.
        names: the selected (trained) parameters' names, in layout order.
        params: the selected parameters themselves (the model's live tensors), in layout order.
        model: the model.
        task: the task (its ``public`` split serves the public-data optimizers).
        per_example: the per-example gradient engine
            (:class:`~gradspec.train.PerExampleGradients`), for gradients of public examples
            at the current parameters.
        sampler: the run's batch sampler (``q``, ``epoch``, and for shuffling
            ``steps_per_epoch``); read it, never draw from it.
    """

    config: Any
    noise_multiplier: float
    sample_rate: float
    n: int
    denominator: float
    layout: ParamLayout
    device: torch.device
    names: tuple[str, ...] = ()
    params: tuple[Tensor, ...] = ()
    model: nn.Module | None = None
    task: Task | None = None
    per_example: PerExampleGradients | None = None
    sampler: Any = None
