"""DP-SGD for regularised finite sums, returning the averaged iterate (Li et al. 2022, Alg. 1).

    for t = 1..T:  S_t ~ B examples drawn uniformly without replacement (Alg. 1: B = 1)
                   x_t = x_{t-1} - lr * ( (1/B) sum_{i in S_t} clip_G(grad f(x_{t-1}; s_i))
                                          + alpha (x_{t-1} - x_0) + (G / B) sigma zeta_t ),
                   zeta_t ~ N(0, I_d)
    return  x_bar = (1/T) sum_{t=1}^T x_t     (and the last iterate x_T)

The regulariser's gradient ``alpha (x - x_0)`` is data-independent, so it is neither
clipped nor noised. Clipping at G is a no-op for G-Lipschitz losses (the algorithm's
assumption) and makes the privacy guarantee hold without it:
`gradspec.privacy.uniform_sampling_epsilon` accounts these steps (replace-one
relation; sensitivity 2G, proof there).

Unlike `gradspec.train.train` (a Poisson-sampled trainer of torch models with hooks, one
run at a time), this loop takes a per-example gradient function and runs ``m``
configurations side by side (rows of ``x``: step sizes, alphas, noise multipliers), all
sharing the sampled indices and the standard-normal draws ``zeta_t`` (common random
numbers: differences between configurations are not sampling noise). Each row on its own
is exactly Algorithm 1 with its settings and the run's seed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from gradspec.privacy import clip_factors, gaussian_noise

logger = logging.getLogger(__name__)

__all__ = ["AveragedSGDResult", "dp_sgd_averaged"]


@dataclass(frozen=True)
class AveragedSGDResult:
    """What `dp_sgd_averaged` returns: the averaged and the last iterates, shape (m, d)."""

    average: Tensor
    last: Tensor
    steps: int


def _per_config(value: float | Tensor, m: int, name: str, dtype: torch.dtype) -> Tensor:
    if isinstance(value, Tensor) and value.is_floating_point() and value.dtype != torch.float64:
        # a float32 sigma is rounded, possibly below its calibrated value (and epsilon above target)
        raise ValueError(f"{name} must be a Python number or a float64 tensor, got {value.dtype}; "
                         "build it with dtype=torch.float64")
    t = torch.as_tensor(value, dtype=dtype).flatten()
    if t.numel() == 1:
        t = t.expand(m).clone()
    if t.numel() != m:
        raise ValueError(f"{name} must be a number or have one entry per configuration ({m}), got {t.numel()}")
    if not torch.isfinite(t).all() or (t < 0).any():
        raise ValueError(f"{name} must be finite and >= 0, got {t.tolist()}")
    return t


def dp_sgd_averaged(
    *,
    grad_fn: Callable[[Tensor, Tensor], Tensor],
    x0: Tensor,
    n: int,
    steps: int,
    lr: float | Tensor,
    noise_multiplier: float | Tensor,
    clip: float,
    alpha: float | Tensor = 0.0,
    batch_size: int = 1,
    configs: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> AveragedSGDResult:
    """Run Algorithm 1 of Li et al. (2022) for ``m`` configurations at once (see the module docstring).

    Args:
        grad_fn: ``grad_fn(x, idx)`` with ``x`` of shape (m, d) and ``idx`` a LongTensor of
            B example indices; returns the per-example gradients, shape (m, B, d).
        x0: the initial iterate and the regulariser's centre, shape (d,).
        n: number of training examples (indices ``0..n-1``).
        steps: T.
        lr: step size, a number or one per configuration.
        noise_multiplier: sigma (noise std in units of ``clip``), a number or one per
            configuration; 0 = non-private.
        clip: G, the per-example clipping norm (the Lipschitz constant in Alg. 1).
        alpha: the ridge weight toward ``x0``, a number or one per configuration.
        batch_size: B examples per step (Algorithm 1: 1).
        configs: m; default the longest of lr / noise_multiplier / alpha.
        seed: seeds the index draws and the noise (one generator each).
        progress: log a line every 10% of the steps.

    Returns:
        `AveragedSGDResult` with ``average`` and ``last``, float64 of shape (m, d).
    """
    if x0.ndim != 1:
        raise ValueError(f"x0 must be a vector (d,), got shape {tuple(x0.shape)}")
    for name, value in (("n", n), ("steps", steps), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if batch_size > n:
        raise ValueError(f"batch_size {batch_size} exceeds n = {n}")
    if not (clip > 0 and clip < float("inf")):
        raise ValueError(f"clip (G) must be finite and > 0, got {clip}")
    dtype = torch.float64
    if configs is None:
        configs = max(torch.as_tensor(v).numel() for v in (lr, noise_multiplier, alpha))
    m = int(configs)
    lr_t = _per_config(lr, m, "lr", dtype)[:, None]
    sigma_t = _per_config(noise_multiplier, m, "noise_multiplier", dtype)[:, None]
    alpha_t = _per_config(alpha, m, "alpha", dtype)[:, None]
    x0 = x0.to(dtype)
    d = x0.shape[0]
    x = x0.expand(m, d).clone()
    total = torch.zeros_like(x)
    index_gen = torch.Generator().manual_seed(int(seed))
    noise_gen = torch.Generator().manual_seed(int(seed) + 1)
    noise_scale = lr_t * sigma_t * (clip / batch_size)  # lr * G * sigma / B
    decay = 1.0 - lr_t * alpha_t
    shift = lr_t * alpha_t * x0  # lr * alpha * x0, so x - lr * alpha (x - x0) = decay * x + shift
    private = bool((sigma_t > 0).any())
    ridge = bool((alpha_t > 0).any())
    report = max(1, steps // 10)
    start = time.perf_counter()
    for t in range(steps):
        if batch_size == 1:
            idx = torch.randint(n, (1,), generator=index_gen)
        else:
            idx = torch.randperm(n, generator=index_gen)[:batch_size]
        grads = grad_fn(x, idx)
        if grads.shape != (m, batch_size, d):
            raise ValueError(f"grad_fn returned shape {tuple(grads.shape)}, expected {(m, batch_size, d)}")
        grads = grads.to(dtype)
        grads = grads * clip_factors(grads.norm(dim=2), clip)[..., None]  # clip at G
        step_grad = grads.mean(1) if batch_size > 1 else grads[:, 0]
        if ridge:
            x.mul_(decay).add_(shift)  # x - lr alpha (x - x0)
        x.addcmul_(lr_t, step_grad, value=-1.0)
        if private:
            zeta = gaussian_noise((d,), 1.0, generator=noise_gen, dtype=dtype)
            x.addcmul_(noise_scale, zeta, value=-1.0)
        total.add_(x)
        if progress and (t + 1) % report == 0:
            logger.info("step %d/%d (%.0f s)", t + 1, steps, time.perf_counter() - start)
    return AveragedSGDResult(average=total / steps, last=x, steps=steps)
