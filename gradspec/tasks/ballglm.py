"""Ball-constrained logistic regression on unit-norm data of exact rank r in dimension d.

The setting in which Kairouz et al. (2021) need the gradient subspace: *constrained*
convex ERM, ``min_{||theta|| <= R} (1/n) sum_i log(1 + exp(-s_i x_i^T theta))`` with
``s_i = 2 y_i - 1``. Every ``x_i`` lies in the r-dimensional column space of an orthonormal
``B`` (d x r, drawn from the seed) and has ``||x_i|| = 1``, so every per-example gradient
``-s_i sigmoid(-s_i x_i^T theta) x_i`` lies in that space and has norm < 1: the loss is
1-Lipschitz (L = 1) and clipping at C >= 1 changes nothing.

Why the constraint matters (the README of ``analyses/kairouz2021_noisy_adagrad`` has the
derivation): for the *unconstrained* problem, DP-GD's noise outside span(B) never touches
the loss (Kairouz et al. Theorem 5.1, Song et al. 2021), so DP-GD is dimension free. Over
a ball, the out-of-span noise fills the ball, and the projection onto it shrinks the
in-span part of theta: DP-GD pays for d (Bassily et al. 2014: Omega(sqrt(d) / (eps n)) in
the worst case), while methods that stay in a public estimate of span(B) do not.

Labels: ``y ~ Bernoulli(sigmoid(margin * x^T w*))`` with ``w* = B u``, ``u`` a uniform unit
vector. Splits: ``n`` training, ``n_eval`` held-out and ``n_public`` public examples, i.i.d.
from the same ``B`` and ``w*``, drawn in that order (training and held-out data do not
depend on ``n_public``); ids ``0..n-1``, ``n..n+n_eval-1``, then public.

:func:`ball_optimum` computes the constrained ERM minimiser in float64 (to a stated KKT
residual), the reference that excess risks are measured against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gradspec.tasks._base import DRAWN_IDS, Batch, Task, TensorData, drawn_splits
from gradspec.tasks._registry import register_task

__all__ = ["BallOptimum", "ball_basis", "ball_glm_task", "ball_optimum", "logistic_risk"]


def _basis(*, d: int, r: int, seed: int) -> tuple[torch.Generator, Tensor]:
    # drawn as r x d and transposed: a (d x r) draw from the same seed would equal the
    # random projector's basis at that seed (RandomProjector draws randn(p, k) then QR),
    # making the "random subspace" control the data's own subspace
    generator = torch.Generator().manual_seed(seed)
    g = torch.randn(r, d, generator=generator, dtype=torch.float64).T
    basis, _ = torch.linalg.qr(g)
    return generator, basis


def ball_basis(task_or_config: Task | dict) -> Tensor:
    """The orthonormal basis B (d x r, float64) of a ``ballglm`` task's data, regenerated
    exactly from its ``d``, ``r`` and ``seed`` (the oracle subspace; gamma = 0)."""
    config = task_or_config.config if isinstance(task_or_config, Task) else task_or_config
    if config.get("task") != "ballglm":
        raise ValueError("ball_basis needs a task (or config) built by make_task('ballglm')")
    return _basis(d=int(config["d"]), r=int(config["r"]), seed=int(config["seed"]))[1]


def _forward(call: Callable[..., Tensor], batch: Batch) -> Tensor:
    return call(batch["inputs"]).squeeze(-1)


def _loss(outputs: Tensor, batch: Batch) -> Tensor:
    return nn.functional.binary_cross_entropy_with_logits(
        outputs, batch["labels"].to(outputs.dtype), reduction="none")


def _metrics(outputs: Tensor, batch: Batch) -> dict[str, float]:
    return {"accuracy": ((outputs > 0).long() == batch["labels"]).float().mean().item()}


@register_task("ballglm")
def ball_glm_task(
    *, seed: int = 0, n: int = 500, n_eval: int = 2000, n_public: int = 100, d: int = 100,
    r: int = 5, margin: float = 4.0,
) -> Task:
    """Logistic regression without bias on unit-norm rank-r data in dimension d.

    The ball constraint itself is the optimizer's (:class:`gradspec.optim.BallConstraint`);
    :func:`ball_optimum` gives the constrained minimiser.

    Args:
        seed: draws B, the data, ``w*`` and the labels.
        n: training examples.
        n_eval: held-out examples.
        n_public: public examples (same distribution, disjoint), for the subspace oracle.
        d: the dimension (= the number of parameters p).
        r: the rank of the data, ``1 <= r <= d``.
        margin: scale of the planted logits.

    Returns:
        A task whose model is ``nn.Linear(d, 1, bias=False)`` initialised to zero, with data
        ``{"inputs": (n, d) float32, "labels": (n,) long}``.
    """
    if not 1 <= r <= d:
        raise ValueError(f"need 1 <= r <= d, got r={r}, d={d}")
    if n < 1 or n_eval < 1 or n_public < 0:
        raise ValueError(f"n and n_eval must be positive and n_public >= 0, got {n}, {n_eval}, {n_public}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    generator, basis = _basis(d=d, r=r, seed=seed)
    u = torch.randn(r, generator=generator, dtype=torch.float64)
    u = u / u.norm()

    def draw(m: int) -> tuple[Tensor, Tensor]:
        z = torch.randn(m, r, generator=generator, dtype=torch.float64)
        z = z / z.norm(dim=1, keepdim=True).clamp(min=1e-300)
        p = torch.sigmoid(margin * (z @ u))
        y = (torch.rand(m, generator=generator, dtype=torch.float64) < p).long()
        return z @ basis.T, y

    x, y = draw(n + n_eval)
    x_pub, y_pub = draw(n_public)
    model = nn.Linear(d, 1, bias=False)
    nn.init.zeros_(model.weight)
    train, held_out, public = drawn_splits({"inputs": x.float(), "labels": y},
                                           {"inputs": x_pub.float(), "labels": y_pub}, n=n, n_eval=n_eval)
    return Task(
        name="ballglm", model=model, train=train, eval=held_out, public=public,
        forward=_forward, loss=_loss, metrics=_metrics, params=("weight",), config={"ids": DRAWN_IDS},
    )


def logistic_risk(theta: Tensor, data: TensorData) -> float:
    """The mean logistic loss of ``theta`` (d,) on ``data``, in float64."""
    x = data.tensors["inputs"].double()
    s = 2.0 * data.tensors["labels"].double() - 1.0
    return float(nn.functional.softplus(-s * (x @ theta.double().reshape(-1))).mean())


@dataclass(frozen=True)
class BallOptimum:
    """The constrained ERM minimiser and how well it is certified.

    Attributes:
        theta: the minimiser (d,), float64.
        risk: its mean logistic loss on the data.
        multiplier: the KKT multiplier mu >= 0 (0: the constraint is inactive).
        kkt_residual: ``||grad F(theta) + mu theta||`` (stationarity of the Lagrangian).
        gap: a duality-type certificate: ``F(theta) - min_{||t|| <= R} [F(theta) + <grad F(theta), t - theta>]``
            = ``<grad, theta> + R ||grad||`` (the Frank-Wolfe gap), an upper bound on
            ``F(theta) - F*`` by convexity.
    """

    theta: Tensor
    risk: float
    multiplier: float
    kkt_residual: float
    gap: float


def ball_optimum(data: TensorData, radius: float, *, basis: Tensor | None = None,
                 tol: float = 1e-12, max_iter: int = 50) -> BallOptimum:
    """``argmin_{||theta|| <= radius}`` of the mean logistic loss on ``data``, in float64.

    The loss depends on theta only through ``B^T theta`` (the data lie in span(B)), and an
    out-of-span component only adds norm, so the minimiser lies in span(B): it is solved in
    r coordinates. For mu >= 0, ``c(mu) = argmin F(Bc) + mu ||c||^2 / 2`` by damped Newton;
    if ``||c(0)|| <= R`` (the unconstrained minimiser exists inside the ball) that is the
    answer, else mu solves ``||c(mu)|| = R`` (decreasing in mu), found by bisection in log mu.

    Args:
        data: the training data (``inputs`` (n, d), ``labels`` (n,)).
        radius: R > 0.
        basis: an orthonormal basis of the data's span (default: from an SVD of the inputs,
            keeping singular values above 1e-5 times the largest: the inputs are float32,
            whose rounding leaves ~1e-7 relative components outside the span).
        tol: tolerance on the Newton steps and on ``||c|| - R``.

    Returns:
        A :class:`BallOptimum` (check its ``gap``).
    """
    if radius <= 0:
        raise ValueError(f"the radius must be > 0, got {radius}")
    x = data.tensors["inputs"].double()
    s = 2.0 * data.tensors["labels"].double() - 1.0
    if basis is None:
        _, sv, vt = torch.linalg.svd(x, full_matrices=False)
        basis = vt[sv > sv.max() * 1e-5].T  # above the float32 rounding of the stored data
    basis = basis.double()
    a = (x @ basis) * s[:, None]  # n x r: margins are a @ c
    n, r = a.shape

    def f(c: Tensor, mu: float) -> float:
        return float(nn.functional.softplus(-(a @ c)).mean()) + 0.5 * mu * float(c @ c)

    def newton(mu: float, c: Tensor) -> Tensor:
        for _ in range(max_iter):
            p = torch.sigmoid(-(a @ c))
            g = -(a.T @ p) / n + mu * c
            h = (a.T * (p * (1 - p))) @ a / n + mu * torch.eye(r, dtype=torch.float64)
            step = torch.linalg.solve(h, g)
            decrement = float(g @ step)  # the Newton decrement squared
            if decrement < 1e-24:  # far below float64 resolution of F (~1e-16)
                break
            t = 1.0
            if decrement > 1e-6:  # damped phase; near the minimiser full steps converge quadratically
                f0 = f(c, mu)
                while f(c - t * step, mu) > f0 - 0.25 * t * decrement and t > 1e-6:
                    t *= 0.5
            c = c - t * step
        return c

    # Is the unconstrained minimiser inside the ball? Newton with a tiny ridge (separable
    # data have no minimiser: its norm then runs past R and the constraint is active).
    c = newton(1e-12, torch.zeros(r, dtype=torch.float64))
    mu = 0.0
    if float(c.norm()) > radius:
        lo, hi, c_hi = 1e-12, 1.0, newton(1.0, c)
        while float(c_hi.norm()) > radius:
            lo, hi = hi, hi * 10.0
            c_hi = newton(hi, c_hi)
        c = c_hi
        for _ in range(100):  # ||c(mu)|| decreases in mu: bisect log mu
            if abs(float(c_hi.norm()) - radius) < tol * radius or hi / lo - 1 < 1e-15:
                break
            mid = math.sqrt(lo * hi)
            cm = newton(mid, c)
            if float(cm.norm()) > radius:
                lo = mid
            else:
                hi, c_hi = mid, cm
            c = cm
        mu, c = hi, c_hi
    p = torch.sigmoid(-(a @ c))
    grad = -(a.T @ p) / n
    theta = basis @ c
    kkt = float((grad + mu * c).norm())
    gap = float(grad @ c) + radius * float(grad.norm())
    return BallOptimum(theta=theta, risk=f(c, 0.0), multiplier=mu, kkt_residual=kkt, gap=max(gap, 0.0))
