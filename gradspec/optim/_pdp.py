"""Projected DP-SGD (Zhou et al. 2021, Algorithm 1) and its random-projection baseline.

PDP-SGD projects the *noisy* gradient onto the top-k eigenspace of the public
gradients' second moment ``M_t = (1/m) sum_{z in S_h} grad l(w_t, z) grad l(w_t, z)^T``::

    g_t <- V_k(t) V_k(t)^T (g_t + b_t),   w_{t+1} <- w_t - eta g_t

The projection is post-processing of the private gradient and of public data, so the
privacy is DP-SGD's. The noise norm shrinks from ``sigma C sqrt(p) / B`` to
``sigma C sqrt(k) / B`` in expectation. RPDP-SGD (§5) uses a random orthonormal
projector of rank k instead. Options from §5: the epoch at which projection starts
(``start_epoch``; plain DP-SGD before it), the recompute period s and public size m.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from gradspec._enums import Sampling
from gradspec.optim._base import OptimHooks
from gradspec.optim._projectors import Projector, RandomProjector
from gradspec.optim._public import PublicProjector
from gradspec.privacy import steps_for_epochs, steps_per_epoch
from gradspec.train import StepContext

__all__ = ["PDPSGD", "pdp_sgd", "rpdp_sgd"]


class PDPSGD(OptimHooks):
    """Projected DP-SGD: the privatised gradient is projected onto the subspace.

    Args:
        projector: usually a :class:`PublicProjector` (PDP-SGD) or a
            :class:`RandomProjector` (RPDP-SGD).
        start_epoch: epochs of plain DP-SGD before projecting (0 = from the first step).
    """

    name = "pdp-sgd"

    def __init__(self, projector: Projector, *, start_epoch: float = 0.0) -> None:
        if start_epoch < 0:
            raise ValueError(f"start_epoch must be >= 0, got {start_epoch}")
        self.projector = projector
        self.start_epoch = float(start_epoch)
        self.active = False
        if isinstance(projector, RandomProjector):
            self.name = "rpdp-sgd"

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        sampler = ctx.sampler
        per_epoch = getattr(sampler, "steps_per_epoch", None) or steps_per_epoch(
            ctx.sample_rate, sampling=Sampling.POISSON
        )
        self.start_step = steps_for_epochs(self.start_epoch, per_epoch)
        self.projector.setup(ctx)

    def on_step_start(self, step: int, ctx: StepContext) -> None:
        super().on_step_start(step, ctx)
        self.active = step >= self.start_step
        if self.active:
            self.projector.update(step, ctx)

    def after_noise(self, grad: Tensor) -> Tensor:
        """Project the privatised gradient onto the public subspace once it is active
        (post-processing: no privacy cost)."""
        return self.projector.project(grad) if self.active else grad

    def describe(self) -> dict[str, Any]:
        """What a run records: the start epoch and the projector (its public examples or seed)."""
        return {"start_epoch": self.start_epoch, "projector": self.projector.describe()}

    def state_dict(self) -> dict[str, Any]:
        return {"projector": self.projector.state_dict(), "start_epoch": self.start_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("start_epoch") != self.start_epoch:
            raise ValueError(f"the checkpoint started projecting at epoch {state.get('start_epoch')}, "
                             f"this run at {self.start_epoch}")
        self.projector.load_state_dict(state["projector"])


def pdp_sgd(rank: int, *, public_size: int = 100, period: int = 1, seed: int = 0,
            start_epoch: float = 0.0) -> PDPSGD:
    """PDP-SGD with the public top-k eigenspace recomputed every ``period`` steps."""
    return PDPSGD(PublicProjector(rank, public_size=public_size, period=period, seed=seed),
                  start_epoch=start_epoch)


def rpdp_sgd(rank: int, *, seed: int = 0, start_epoch: float = 0.0) -> PDPSGD:
    """RPDP-SGD: PDP-SGD with a random orthonormal projector of rank k (Zhou et al. §5)."""
    return PDPSGD(RandomProjector(rank, seed=seed), start_epoch=start_epoch)
