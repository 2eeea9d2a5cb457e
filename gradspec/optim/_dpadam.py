"""DP-Adam: Adam applied to the privatised gradient (the baseline of Li et al. 2022 AdaDPS,
after Zhou et al. 2020).

The hooks keep Adam's moments of the privatised gradient g_t and return the direction::

    m_t = b1 m_{t-1} + (1 - b1) g_t,   v_t = b2 v_{t-1} + (1 - b2) g_t^2
    d_t = (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)

and the outer optimizer, SGD with learning rate lr, takes theta <- theta - lr d_t:
exactly ``torch.optim.Adam``. Post-processing of the private gradient: no extra privacy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from gradspec.optim._base import OptimHooks
from gradspec.train import StepContext

__all__ = ["DPAdam"]


class DPAdam(OptimHooks):
    """Adam moments of the privatised gradient as the update direction.

    Args:
        betas: (b1, b2).
        eps: added to the bias-corrected root second moment.
    """

    name = "dp-adam"
    own_direction = True

    def __init__(self, *, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        b1, b2 = (float(b) for b in betas)
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"Adam betas must be in [0, 1), got {betas}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.b1, self.b2, self.eps = b1, b2, float(eps)
        self.t = 0
        self.m: Tensor | None = None
        self.v: Tensor | None = None

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        self.t = 0
        self.m = torch.zeros(ctx.layout.p, device=ctx.device)
        self.v = torch.zeros(ctx.layout.p, device=ctx.device)

    def direction(self, grad: Tensor) -> Tensor:
        """Adam's bias-corrected step m̂ / (√v̂ + eps) from the privatised gradient
        (post-processing: no privacy cost)."""
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad.square()
        m_hat = self.m / (1 - self.b1**self.t)
        return m_hat / ((self.v / (1 - self.b2**self.t)).sqrt() + self.eps)

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "m": self.m.cpu().clone(), "v": self.v.cpu().clone(),
                "betas": (self.b1, self.b2), "eps": self.eps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state.get("betas", ())) != (self.b1, self.b2) or state.get("eps") != self.eps:
            raise ValueError(f"the checkpoint's DP-Adam used betas {state.get('betas')} and eps "
                             f"{state.get('eps')}, this run {(self.b1, self.b2)} and {self.eps}")
        if state["m"].shape != self.m.shape:
            raise ValueError("the checkpoint's Adam moments have the wrong size")
        self.t = int(state["t"])
        self.m, self.v = state["m"].to(self.m.device), state["v"].to(self.v.device)
