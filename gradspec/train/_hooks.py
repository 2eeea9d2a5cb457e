"""Where a DP training step can be changed: the hooks of the private optimizers.

The DP-SGD step of ``gradspec.train`` calls these in order::

    g_i  <- precondition(g_i)                  per-example, before clipping  (AdaDPS)
    s    <- before_noise(sum_i clip(g_i))      the clipped sum               (fixed-subspace retraining)
    b    <- noise(std)                         the DP noise vector           (noise in a subspace only)
    g    <- after_noise((s + b) / B)           the privatised gradient       (PDP-SGD projection)
    d    <- direction(g)                       the update direction          (noisy AdaGrad)
    theta <- optimizer step on d

The identity hooks below are DP-SGD. Hooks that use more privacy (a noisy
preconditioner, say) record it through ``record_privacy``. Hooks with state
implement ``state_dict``/``load_state_dict`` so runs resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from gradspec.train._context import StepContext


class StepHooks:
    """DP-SGD: every hook is the identity.

    Attributes:
        subsampling_amplification: whether the trainer may account each Poisson-sampled
            gradient release as the Poisson-subsampled Gaussian mechanism. Amplification by
            subsampling needs the batch membership hidden, so set it ``False`` when the hooks
            release anything computed from past private batches (noisy AdaGrad's
            preconditioner): the trainer then records each gradient release as a plain
            Gaussian mechanism (``record_gaussian(noise_multiplier, 1)``), which holds for every fixed
            sampling pattern (see ``gradspec.optim._adagrad``). Shuffled sampling is
            accounted without amplification either way.
    """

    name = "dp-sgd"
    subsampling_amplification: bool = True
    #: ``precondition`` changes the per-example rows (AdaDPS). The ghost backend forms no
    #: rows: it calls ``precondition`` with zero-width rows ``(B, 0)`` (so hooks can count
    #: the examples) and refuses hooks that set this.
    needs_rows: bool = False

    def setup(self, ctx: StepContext) -> None:
        """Called once, before training, with what the hooks may read of the run
        (settings, noise multiplier, q, n, the step's denominator, layout, device, parameters, model,
        task, per-example engine, sampler)."""

    def on_step_start(self, step: int, ctx: StepContext) -> None:
        """Called before each step (e.g. to recompute a public subspace every s steps)."""

    def precondition(self, grads: Tensor) -> Tensor:
        """Change the per-example gradients ``(B, p)`` before they are clipped (AdaDPS).

        Under the ghost backend ``grads`` has zero columns, ``(B, 0)``.
        """
        return grads

    def before_noise(self, total: Tensor) -> Tensor:
        """Change the clipped sum ``(p,)`` before the noise is added (fixed-subspace retraining).

        Whatever it returns must keep the sum's sensitivity at C (a projection does), or the
        accounting no longer holds.
        """
        return total

    def noise(self, p: int, std: float, generator: torch.Generator, device: torch.device) -> Tensor:
        """The DP noise vector ``(p,)`` of standard deviation ``std`` (noise multiplier × C).

        By default isotropic Gaussian noise in all p dimensions, drawn by
        :func:`gradspec.privacy.gaussian_noise` (the one noise function) from ``generator``.
        """
        from gradspec.privacy import gaussian_noise

        return gaussian_noise((p,), std, generator=generator, device=device)

    def after_noise(self, grad: Tensor) -> Tensor:
        """Change the privatised gradient ``(s + b) / denominator`` (PDP-SGD's projection).

        Post-processing of the released gradient: it costs no privacy.
        """
        return grad

    def direction(self, grad: Tensor) -> Tensor:
        """The update direction the optimizer steps along, from the privatised gradient
        (noisy AdaGrad's preconditioner)."""
        return grad

    def record_privacy(self, accountant: Any, step: int) -> None:
        """Record privacy spent by the hooks themselves (not the gradient noise)."""

    def state_dict(self) -> dict[str, Any]:
        """The hooks' state, saved in each checkpoint so that a run resumes (DP-SGD has none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; state that does not fit is a ``ValueError``."""
        if state:
            raise ValueError(f"{self.name} has no state, but the checkpoint holds {sorted(state)}")
