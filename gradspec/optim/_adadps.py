"""AdaDPS: precondition per-example gradients with side information, then privatise
(Li, Zaheer, Liu, Reddi, McMahan, Smith 2022, Algorithm 1).

Each step, before clipping::

    g_i <- A(g_i, A_t, M_t)                  per-example preconditioning
    g~  <- (sum_i clip(g_i, C) + N(0, sigma^2 C^2 I)) / B,   w <- w - alpha g~

Option 1 (public data): a public mini-batch of size b' gives g^_t, the mean public
gradient at the current parameters, and

* ``rmsprop``: v_t = beta2 v_{t-1} + (1 - beta2) g^_t^2, A_t = sqrt(v_t) + eps, A(g) = g / A_t;
* ``adagrad``: A_t^2 = A_{t-1}^2 + g^_t^2, A(g) = g / (A_t + eps);
* ``adam``: M_t = beta1 M_{t-1} + (1 - beta1) g^_t and v_t as RMSProp, both bias-corrected,
  A(g) = (beta g + (1 - beta) M_t) / (sqrt(v_t) + eps), with beta = 1 - beta1 (the weight
  Adam gives a fresh gradient; the paper leaves beta^t open).

Option 2 (no public data): a fixed ``side_information`` vector A (e.g. token
frequencies), A(g) = g / A. An all-ones A is DP-SGD. The side information and public
statistics are non-sensitive, so the privacy is DP-SGD's (the paper's Theorem 1).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import torch
from torch import Tensor

from gradspec._enums import parse_choice
from gradspec.optim._base import OptimHooks
from gradspec.optim._projectors import public_gradients, public_split
from gradspec.tasks._base import TensorData

__all__ = ["AdaDPS", "AdaDPSRule"]


class AdaDPSRule(StrEnum):
    """How AdaDPS builds its preconditioner A_t."""

    RMSPROP = "rmsprop"
    ADAM = "adam"
    ADAGRAD = "adagrad"
    FIXED = "fixed"  # fixed side information, no public data (Option 2)


class AdaDPS(OptimHooks):
    """AdaDPS: per-example preconditioning before clipping and noise.

    Args:
        rule: ``rmsprop`` (the paper's main choice), ``adam``, ``adagrad`` or ``fixed``.
        side_information: the fixed A (p,) for ``rule="fixed"``; positive entries.
        public_size: m, public examples (taken by :func:`public_split`).
        public_batch: b', public examples per step (default: min(m, the batch size)).
        beta1, beta2: moment decay rates.
        eps: added to the square root of the second moment.
        seed: chooses the public examples and the public mini-batches.
        public: the public examples themselves (overrides ``public_size``).
    """

    name = "adadps"

    def __init__(
        self, *, rule: AdaDPSRule | str = AdaDPSRule.RMSPROP, side_information: Tensor | None = None,
        public_size: int = 100, public_batch: int | None = None, beta1: float = 0.9,
        beta2: float = 0.999, eps: float = 1e-8, seed: int = 0, public: TensorData | None = None,
    ) -> None:
        self.rule = parse_choice(AdaDPSRule, rule, "AdaDPS rule")
        if (self.rule == AdaDPSRule.FIXED) != (side_information is not None):
            raise ValueError("side_information is given exactly when rule='fixed'")
        if side_information is not None:
            side_information = torch.as_tensor(side_information, dtype=torch.float32).flatten()
            if not bool((side_information > 0).all()):
                raise ValueError("side information A must be positive (gradients are divided by it)")
        for name, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= beta < 1:
                raise ValueError(f"{name} must be in [0, 1), got {beta}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.side_information = side_information
        self.public_size, self.public_batch = int(public_size), public_batch
        self.beta1, self.beta2, self.eps, self.seed = float(beta1), float(beta2), float(eps), int(seed)
        self.public = public
        self.t = 0

    def setup(self, run: Any) -> None:
        super().setup(run)
        p = run.layout.p
        if self.rule == AdaDPSRule.FIXED:
            if self.side_information.numel() != p:
                raise ValueError(f"side information has {self.side_information.numel()} entries, "
                                 f"the run trains {p} parameters")
            self.A = self.side_information.to(run.device)
            return
        if self.public is None:
            self.public = public_split(run.task, self.public_size, seed=self.seed)
        m = len(self.public)
        self.b_pub = min(m, self.public_batch or run.config.batch_size)
        if not 1 <= self.b_pub <= m:
            raise ValueError(f"public batch size must be in [1, {m}], got {self.b_pub}")
        self._pub_gen = torch.Generator().manual_seed(self.seed + 1)
        self.v = torch.zeros(p, device=run.device)
        self.M = torch.zeros(p, device=run.device)
        self.A = torch.ones(p, device=run.device)
        self.t = 0

    def on_step_start(self, step: int, run: Any) -> None:
        super().on_step_start(step, run)
        if self.rule == AdaDPSRule.FIXED:
            return
        idx = torch.randperm(len(self.public), generator=self._pub_gen)[: self.b_pub]
        ghat = public_gradients(run, self.public, idx).mean(0)
        self.t += 1
        if self.rule == AdaDPSRule.ADAGRAD:
            self.v = self.v + ghat.square()
            self.A = self.v.sqrt() + self.eps
            return
        self.v = self.beta2 * self.v + (1 - self.beta2) * ghat.square()
        if self.rule == AdaDPSRule.RMSPROP:
            self.A = self.v.sqrt() + self.eps
        else:
            self.M = self.beta1 * self.M + (1 - self.beta1) * ghat
            self.A = (self.v / (1 - self.beta2**self.t)).sqrt() + self.eps

    def precondition(self, grads: Tensor) -> Tensor:
        grads = super().precondition(grads)
        if self.rule == AdaDPSRule.ADAM:
            beta = 1 - self.beta1
            m_hat = self.M / (1 - self.beta1**self.t)
            return (beta * grads + (1 - beta) * m_hat) / self.A
        return grads / self.A

    def state_dict(self) -> dict[str, Any]:
        if self.rule == AdaDPSRule.FIXED:
            return {"rule": str(self.rule)}
        return {"rule": str(self.rule), "t": self.t, "v": self.v.cpu().clone(),
                "M": self.M.cpu().clone(), "A": self.A.cpu().clone(),
                "generator": self._pub_gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("rule") != str(self.rule):
            raise ValueError(f"the checkpoint used AdaDPS rule {state.get('rule')!r}, "
                             f"this run {str(self.rule)!r}")
        if self.rule == AdaDPSRule.FIXED:
            return
        if state["v"].shape != self.v.shape:
            raise ValueError("the checkpoint's AdaDPS statistics have the wrong size")
        self.t = int(state["t"])
        self.v, self.M, self.A = (state[k].to(self.v.device) for k in ("v", "M", "A"))
        self._pub_gen.set_state(state["generator"])
