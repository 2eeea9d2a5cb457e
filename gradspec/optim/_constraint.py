"""Projected steps onto an l2 ball: constrained private ERM (Kairouz et al. 2021, Alg. 1).

:class:`BallConstraint` wraps the hooks of any optimizer and turns its step
``theta <- theta - eta d`` into ``theta <- P_C(theta - eta d)`` with ``C = {||theta|| <= R}``
and ``P_C(y) = y min(1, R / ||y||)`` (the Euclidean projection). The trainer applies
``theta - lr * direction``, so the wrapper returns ``(theta - P_C(theta - lr d)) / lr``.

**Privacy.** The projection reads only the current parameters (a function of the earlier
private releases) and the public radius: it is post-processing, and the wrapper passes
the inner hooks' accounting (``subsampling_amplification``, ``record_privacy``) through
unchanged.

**Departure for noisy AdaGrad.** Algorithm 1 projects in the semi-norm of its
preconditioner, ``argmin_{theta in C} ||theta - y||_{H_t}``; this wrapper projects in the
Euclidean norm for every optimizer (DP-SGD's projected gradient descent, Bassily et al.
2014, uses the Euclidean one). For an iterate in span(V) both keep it in span(V).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gradspec.optim._base import OptimHooks
from gradspec.train import StepContext, StepHooks

__all__ = ["BallConstraint", "project_ball"]


def project_ball(y: Tensor, radius: float) -> Tensor:
    """The Euclidean projection of ``y`` onto ``{||theta|| <= radius}``."""
    norm = float(y.norm())
    return y if norm <= radius else y * (radius / norm)


class BallConstraint(OptimHooks):
    """Keep the iterates of ``inner`` in the l2 ball of radius R (projected steps).

    Args:
        inner: the optimizer's hooks (DP-SGD: ``StepHooks()``; PDP-SGD; noisy AdaGrad ...).
        radius: R > 0.
    """

    own_direction = True

    def __init__(self, inner: StepHooks, *, radius: float) -> None:
        if not radius > 0:
            raise ValueError(f"the radius must be > 0, got {radius}")
        if not isinstance(inner, StepHooks):
            raise TypeError(f"inner must be StepHooks, got {type(inner).__name__}")
        self.inner = inner
        self.radius = float(radius)
        self.name = inner.name
        self.subsampling_amplification = getattr(inner, "subsampling_amplification", True)
        # AdaDPS preconditions each per-example row: the backend must form them (ghost cannot)
        self.needs_rows = bool(getattr(inner, "needs_rows", False))
        self.extra_privacy = getattr(inner, "extra_privacy", False)
        self.projector = getattr(inner, "projector", None)

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        self._ctx = ctx
        self.inner.setup(ctx)

    def on_step_start(self, step: int, ctx: StepContext) -> None:
        super().on_step_start(step, ctx)
        self.inner.on_step_start(step, ctx)

    def precondition(self, grads: Tensor) -> Tensor:
        return self.inner.precondition(super().precondition(grads))

    def before_noise(self, total: Tensor) -> Tensor:
        return self.inner.before_noise(total)

    def noise(self, p: int, std: float, generator: torch.Generator, device: torch.device) -> Tensor:
        return self.inner.noise(p, std, generator, device)

    def after_noise(self, grad: Tensor) -> Tensor:
        return self.inner.after_noise(grad)

    def direction(self, grad: Tensor) -> Tensor:
        d = self.inner.direction(grad).double()
        lr = float(self._ctx.config.lr)
        theta = torch.cat([p.detach().reshape(-1) for p in self._ctx.params]).double()
        new = project_ball(theta - lr * d, self.radius)
        return ((theta - new) / lr).to(grad.dtype)

    def record_privacy(self, accountant: Any, step: int) -> None:
        self.inner.record_privacy(accountant, step)

    def describe(self) -> dict[str, Any]:
        """The constraint and what the inner hooks record."""
        inner = self.inner.describe() if callable(getattr(self.inner, "describe", None)) else {}
        if "projector" not in inner and callable(getattr(self.projector, "describe", None)):
            inner["projector"] = self.projector.describe()
        return {**inner, "constraint": {"set": "l2-ball", "radius": self.radius,
                                        "projection": "euclidean"}}

    def state_dict(self) -> dict[str, Any]:
        return {"radius": self.radius, "inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("radius") != self.radius:
            raise ValueError(f"the checkpoint's ball has radius {state.get('radius')}, this run {self.radius}")
        self.inner.load_state_dict(state.get("inner", {}))
