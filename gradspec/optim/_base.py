"""What the private optimizers share: the step's gradient scale and a seeded generator.

The DP-SGD step of ``gradspec.train`` divides the (noised) clipped sum by the
expected batch size ``q n`` (Poisson sampling) or the fixed batch size B (shuffling)
when private (the run's ``StepContext.denominator``), and by the drawn batch size when
sigma = 0. Hooks that need the average clipped gradient itself (noisy AdaGrad's
preconditioner) use the same denominator, :meth:`OptimHooks.denominator`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gradspec.train import StepContext, StepHooks

__all__ = ["OptimHooks"]


class OptimHooks(StepHooks):
    """Base of the bundled optimizers' hooks.

    Attributes:
        own_direction: the hooks compute the whole update direction (noisy AdaGrad,
            DP-Adam), so the outer optimizer must be plain SGD without momentum,
            whose learning rate is the step size: ``theta <- theta - lr * d``.
        extra_privacy: the hooks spend privacy of their own (recorded in
            ``record_privacy``); sigma cannot then be calibrated for the gradient alone.
    """

    own_direction = False
    extra_privacy = False

    def setup(self, ctx: StepContext) -> None:
        config = ctx.config
        if self.own_direction and (config.optimizer != "sgd" or config.momentum != 0):
            raise ValueError(
                f"{self.name} computes its own update direction: train with optimizer='sgd' and "
                f"momentum=0 (the step is theta - lr * direction), not {config.optimizer!r} "
                f"with momentum {config.momentum}"
            )
        self._sigma = float(ctx.noise_multiplier)
        self._expected = float(ctx.denominator)
        self._clip = float(config.max_grad_norm)
        self._p = ctx.layout.p
        self._device = ctx.device
        self._count = 0

    def on_step_start(self, step: int, ctx: StepContext) -> None:
        self._count = 0

    def precondition(self, grads: Tensor) -> Tensor:
        """Count the step's examples (the non-private denominator); the rows pass unchanged."""
        self._count += int(grads.shape[0])
        return grads

    def denominator(self) -> float:
        """What the step divides the clipped sum by (see the module docstring)."""
        return self._expected if self._sigma > 0 else float(max(self._count, 1))

    @staticmethod
    def _generator(device: torch.device, seed: int) -> torch.Generator:
        return torch.Generator(device).manual_seed(int(seed))
