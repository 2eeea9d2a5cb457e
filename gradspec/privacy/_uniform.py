"""Accounting for DP-SGD that draws B examples uniformly (without replacement) each step.

This is the sampling of Li et al. (2022), Algorithm 1 (``j_t ~ Uniform([n])``, B = 1)
and of the classical analyses of DP-SGD (Bassily et al. 2014; Kulkarni et al. 2021),
as opposed to the Poisson sampling of gradspec's trainer.

Mechanism of one step. With clipping at G (``||g_i|| <= G``; Algorithm 1 assumes
G-Lipschitz losses, and gradspec clips anyway), the step releases
``sum_{i in S_t} g_i(x) + G * sigma * zeta``, ``zeta ~ N(0, I)``, where ``S_t`` is a
uniformly random subset of size B of the n examples, drawn afresh each step.

Neighbouring relation and sensitivity. A subset of fixed size B is not defined
for the add/remove relation (n changes), so this accounting is for the
*replace-one* relation: D and D' have the same size n and differ in one example.
Then for a fixed subset S the released sum changes only if S contains the replaced
index, and by ``g_i(x) - g'_i(x)``, whose norm is at most ``2G`` (triangle
inequality). So the noise ``G * sigma`` is ``sigma / 2`` times the replace-one
sensitivity, and one step is the Gaussian mechanism with noise multiplier
``sigma / 2`` subsampled without replacement at rate ``B / n``. Its Renyi DP is
bounded by Wang, Balle & Kasiviswanathan (AISTATS 2019, Theorem 27), which
dp-accounting implements (``SampledWithoutReplacementDpEvent`` under
``NeighboringRelation.REPLACE_ONE``); T steps compose (RDP adds up, the steps are
adaptive but each is the same mechanism), and epsilon(delta) uses dp-accounting's
RDP-to-(epsilon, delta) conversion. Replace-one (epsilon, delta)-DP implies
add/remove-then-add (2 epsilon, (1 + e^epsilon) delta)-DP; we report the replace-one
numbers and say so.
"""

from __future__ import annotations

import math

from gradspec.privacy._calibrate import _bracket, _illinois
from gradspec.privacy._validate import check_delta

__all__ = ["calibrate_uniform_sampling", "uniform_sampling_epsilon"]


def _check(n: int, batch_size: int, steps: int) -> None:
    for name, value in (("n", n), ("batch_size", batch_size), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if batch_size > n:
        raise ValueError(f"batch_size {batch_size} exceeds the dataset size n = {n}")


def uniform_sampling_epsilon(
    *, noise_multiplier: float, n: int, batch_size: int, steps: int, delta: float
) -> float:
    """Replace-one epsilon of ``steps`` DP-SGD steps that each draw ``batch_size`` of ``n``
    examples uniformly without replacement and add ``N(0, (noise_multiplier * G)^2 I)`` to the
    sum of the G-clipped per-example gradients (see the module docstring for the proof).

    Args:
        noise_multiplier: sigma, the noise std in units of the clipping norm G, > 0.
        n: dataset size (public under replace-one).
        batch_size: examples per step, ``1 <= B <= n`` (Algorithm 1 of Li et al.: 1).
        steps: number of steps T.
        delta: target delta in (0, 1).

    Returns:
        epsilon (``inf`` if no RDP order gives a finite value).
    """
    import dp_accounting as dpa
    from dp_accounting import rdp

    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier!r}")
    _check(n, batch_size, steps)
    delta = check_delta(delta)
    accountant = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    # noise / replace-one sensitivity = sigma G / (2 G) = sigma / 2.
    event = dpa.SampledWithoutReplacementDpEvent(n, batch_size, dpa.GaussianDpEvent(sigma / 2.0))
    accountant.compose(event, steps)
    return float(accountant.get_epsilon(delta))


def calibrate_uniform_sampling(
    *, target_epsilon: float, n: int, batch_size: int, steps: int, delta: float, tol: float | None = None
) -> float:
    """The smallest sigma (to ``tol``) with ``uniform_sampling_epsilon(sigma, ...) <= target_epsilon``.

    Same bracketing and Illinois search as `calibrate_noise_multiplier`: the returned
    sigma satisfies ``target - tol <= epsilon(sigma) <= target``.
    """
    target = float(target_epsilon)
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    tol = min(1e-3, 1e-3 * target) if tol is None else float(tol)
    _check(n, batch_size, steps)
    delta = check_delta(delta)

    def eps(sigma: float) -> float:
        return uniform_sampling_epsilon(noise_multiplier=sigma, n=n, batch_size=batch_size,
                                        steps=steps, delta=delta)

    lo, e_lo, hi, e_hi = _bracket(eps, target, 1.0, 0.5)
    return _illinois(eps, target, tol, lo, e_lo, hi, e_hi)
