"""Retraining in a fixed subspace (Li et al. 2022, §4.2 and Fig. 2b).

"This projection applies only to the (non-privatized) average clipped gradients and
the isotropic DP noise is still applied to all dimensions." One step::

    s <- V V^T sum_i clip(g_i)            (before noise)
    g <- (s + b) / B,  b ~ N(0, sigma^2 C^2 I_p)

With ``noise="subspace"`` the noise is drawn in the subspace only,
``b = V z, z ~ N(0, sigma^2 C^2 I_k)`` — distributed as ``V V^T`` applied to
isotropic noise. The gradient releases cost what DP-SGD's do either way: the
projection is a contraction, so the clipped sum keeps sensitivity C.

**That epsilon is a DP guarantee only if V is independent of the private data.** V
from ``gradspec pca`` of a collect run on the same training data (Li et al. Fig. 2b,
the README's retraining step) is computed from noise-free clipped gradients of the
private examples: its privacy cost is not accounted, and cannot be, so such a run is a
diagnostic, not a private algorithm. :func:`gradspec.optim.retrain` checks the spectrum
store's recorded source (``spectrum_provenance``) and reports ``dp_guarantee: false``
with the reason unless the source gradients are of data disjoint from the run's
private training split (another pool of examples, or recorded disjoint ids — e.g. a
collect run on the public split).

**The complement control** (:class:`ComplementRetrain`, algorithm ``complement``): the
clipped sum with the subspace *projected out*, at the same place, before noise::

    s <- (I - V V^T) sum_i clip(g_i)      (before noise)
    g <- (s + b) / B,  b ~ N(0, sigma^2 C^2 I_p)

Song, Ahn & Yun (ICLR 2025, "Does SGD really happen in tiny subspaces?") found that SGD
restricted to the dominant (Hessian) subspace stalls while SGD with that subspace projected
out trains as well as SGD; here V is the top-k *gradient* subspace of Li et al., so the
complement run asks whether the directions the top-k subspace leaves out carry the learning
too. ``I - V V^T`` is an orthogonal projector, a contraction, so the clipped sum keeps
sensitivity C and the accounting (and the caveat above on where V came from) is the
subspace run's. Its noise is isotropic in all p dimensions (as Li et al.'s subspace runs,
``noise="full"`` above); confined to the complement it would lose only k of p coordinates.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import torch
from torch import Tensor

from gradspec._enums import parse_choice
from gradspec.optim._base import OptimHooks
from gradspec.optim._projectors import Projector
from gradspec.train import StepContext

__all__ = ["ComplementRetrain", "NoiseSpace", "SubspaceRetrain"]


class NoiseSpace(StrEnum):
    """Where the DP noise of subspace retraining lives."""

    FULL = "full"  # isotropic in all p dimensions (Li et al. 2022)
    SUBSPACE = "subspace"  # in the k-dimensional subspace only


class SubspaceRetrain(OptimHooks):
    """DP-SGD with the clipped gradient sum projected onto a subspace before noise.

    Args:
        projector: the subspace (usually a :class:`FixedProjector` from a spectrum store).
        noise: ``full`` (the paper) or ``subspace``.

    Example:
        >>> import torch
        >>> from gradspec.optim import FixedProjector, SubspaceRetrain
        >>> hooks = SubspaceRetrain(FixedProjector(torch.eye(5)[:, :2]))
    """

    name = "subspace"
    complement = False  # the release keeps the subspace (True: projects it out)

    def __init__(self, projector: Projector, *, noise: NoiseSpace | str = NoiseSpace.FULL) -> None:
        self.projector = projector
        self.noise_space = parse_choice(NoiseSpace, noise, "noise space")

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        self.projector.setup(ctx)

    def on_step_start(self, step: int, ctx: StepContext) -> None:
        super().on_step_start(step, ctx)
        self.projector.update(step, ctx)

    def before_noise(self, total: Tensor) -> Tensor:
        """Project the clipped sum onto the subspace, V(Vᵀs): sensitivity stays C."""
        return self.projector.project(total)

    def noise(self, p: int, std: float, generator: torch.Generator, device: torch.device) -> Tensor:
        """Isotropic noise in all p dimensions (``full``), or k-dimensional noise lifted into the
        subspace, Vz (``subspace``)."""
        if self.noise_space == NoiseSpace.FULL:
            return super().noise(p, std, generator, device)
        from gradspec.privacy import gaussian_noise

        z = gaussian_noise((self.projector.rank,), std, generator=generator, device=device)
        return self.projector.lift(z)

    def state_dict(self) -> dict[str, Any]:
        return {"projector": self.projector.state_dict(), "noise": str(self.noise_space),
                "complement": self.complement}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if bool(state.get("complement", False)) != self.complement:
            where = {True: "the subspace's orthogonal complement", False: "the subspace"}
            raise ValueError(f"the checkpoint trained in {where[bool(state.get('complement'))]}, "
                             f"this run in {where[self.complement]}")
        if state.get("noise") != str(self.noise_space):
            raise ValueError(f"the checkpoint drew noise in {state.get('noise')!r}, "
                             f"this run in {str(self.noise_space)!r}")
        self.projector.load_state_dict(state["projector"])


class ComplementRetrain(SubspaceRetrain):
    """DP-SGD with the subspace projected *out* of the clipped gradient sum, before noise.

    ``s <- (I - V V^T) sum_i clip(g_i)``, then isotropic noise in all p dimensions: the
    control of Song, Ahn & Yun (ICLR 2025) for retraining in the top-k subspace (see the
    module docstring). ``k`` is the rank of the subspace removed; the run trains in the
    other ``p - k`` dimensions.

    Args:
        projector: the subspace to remove (usually a :class:`FixedProjector` of a spectrum
            store's top-k).

    Example:
        >>> import torch
        >>> from gradspec.optim import ComplementRetrain, FixedProjector
        >>> hooks = ComplementRetrain(FixedProjector(torch.eye(5)[:, :2]))
    """

    name = "complement"
    complement = True

    def __init__(self, projector: Projector) -> None:
        super().__init__(projector, noise=NoiseSpace.FULL)

    def setup(self, ctx: StepContext) -> None:
        """Refuse a subspace of all p dimensions: its complement is {0} and every update would
        be the noise alone (was: trained on noise with exit 0)."""
        p = ctx.layout.p
        if self.projector.rank == p:  # above p, the projector's own setup refuses it
            raise ValueError(
                f"-a complement with k = {self.projector.rank} removes all {p} trained dimensions: "
                "nothing is left to train in and every update would be noise alone; choose k < "
                f"{p}"
            )
        super().setup(ctx)

    def before_noise(self, total: Tensor) -> Tensor:
        """Project the subspace out of the clipped sum, s − V(Vᵀs): sensitivity stays C."""
        return self.projector.project_out(total)
