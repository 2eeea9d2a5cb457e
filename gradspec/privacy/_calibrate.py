"""epsilon of a whole DP-SGD run, and the noise multiplier that meets a target epsilon."""

from __future__ import annotations

import logging
import math

from gradspec._enums import Accounting, Sampling, parse_choice
from gradspec.privacy._accountant import PrivacyAccountant
from gradspec.privacy._epochs import steps_per_epoch
from gradspec.privacy._pld import MAX_PLD_POINTS, PldTooLarge
from gradspec.privacy._validate import (
    _check_float,
    _check_int,
    check_delta,
    check_noise_multiplier,
    check_sample_rate,
)

logger = logging.getLogger(__name__)

# The calibrated noise multiplier is searched in [SIGMA_MIN, SIGMA_MAX].
SIGMA_MIN = 1e-2
SIGMA_MAX = 1e6


def compute_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    sampling: Sampling | str = Sampling.POISSON,
    method: Accounting | str = Accounting.PLD,
) -> float:
    """epsilon(delta) of ``steps`` DP-SGD steps with noise multiplier sigma and sample rate q.

    Poisson sampling is accounted as the Poisson-subsampled Gaussian mechanism;
    shuffled batches as ceil(steps / round(1/q)) Gaussian mechanisms, one per
    epoch, without amplification (see `gradspec.privacy._compose`).

    Args:
        noise_multiplier: sigma = 0 (non-private: epsilon = inf) or sigma >= 0.01 (below
            that epsilon is in the thousands and is refused).
        sample_rate: q in (0, 1] (batch size / dataset size).
        steps: number of steps, >= 1.
        delta: target delta in (0, 1).
        sampling: ``poisson`` or ``shuffle``.
        method: ``pld``, ``rdp`` or ``rdp-classic``.

    Returns:
        epsilon (a float, possibly inf).

    Raises:
        ValueError: on out-of-range inputs or unknown choices, 0 < sigma < 0.01, or a
            sigma too large to evaluate (overflow).

    Example:
        >>> round(compute_epsilon(noise_multiplier=1.1, sample_rate=256 / 60000,
        ...                       steps=14063, delta=1e-5, method="rdp"), 3)
        2.597
    """
    sampling = parse_choice(Sampling, sampling, "sampling")
    accountant = PrivacyAccountant(method=method)
    steps = _check_int(steps, "steps", minimum=1)
    delta = check_delta(delta)
    sigma = check_noise_multiplier(noise_multiplier)
    if 0 < sigma < SIGMA_MIN:
        # epsilon is in the thousands here; PLD would need tens of GB for it, and below
        # ~1e-154 sigma**2 underflows and RDP would answer epsilon = 0.
        raise ValueError(
            f"noise_multiplier={sigma:g} is below {SIGMA_MIN:g}: such noise gives no meaningful "
            "privacy (epsilon in the thousands); use noise_multiplier=0 for a non-private run"
        )
    try:
        if sampling == Sampling.POISSON:
            accountant.record_poisson(sigma, sample_rate, steps)
        else:
            accountant.record_shuffled(sigma, steps_per_epoch(sample_rate), steps)
        return accountant.epsilon(delta)
    except OverflowError:
        raise ValueError(
            f"noise_multiplier={sigma:g} is too large for the accountant to evaluate; above "
            f"{SIGMA_MAX:g} epsilon is 0 for all practical purposes"
        ) from None


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float,
    sampling: Sampling | str = Sampling.POISSON,
    method: Accounting | str = Accounting.PLD,
    tol: float | None = None,
) -> float:
    """The smallest noise multiplier (to ``tol``) whose epsilon is at most ``target_epsilon``.

    Brackets the root of eps(sigma) - target in log sigma, then narrows the
    bracket with the Illinois variant of false position (a bisection-family
    method that keeps the bracket; it falls back to halving the bracket where
    epsilon is infinite). The returned sigma is always the bracket's upper
    end, so ``target - tol <= compute_epsilon(sigma) <= target`` (the lower
    bound can fail only where epsilon jumps by more than tol). For ``pld`` the
    bracket comes from cheap ``rdp`` calibrations, so a PLD calibration costs
    about four or five PLD evaluations.

    Args:
        target_epsilon: epsilon to meet, > 0.
        sample_rate: as in `compute_epsilon`.
        steps: as in `compute_epsilon`.
        delta: as in `compute_epsilon`.
        sampling: as in `compute_epsilon`.
        method: as in `compute_epsilon`.
        tol: absolute tolerance on epsilon, > 0; default ``min(1e-3, 1e-3 * target_epsilon)``
            (an absolute 1e-3 at a target of 0.002 would accept half the target, i.e.
            several percent more noise than needed).

    Returns:
        The noise multiplier sigma.

    Raises:
        ValueError: on bad inputs, or a target that needs sigma outside
            [SIGMA_MIN, SIGMA_MAX] (a target so small that no practical noise
            meets it, or so large that almost no noise does).
    """
    target = _check_float(target_epsilon, "target_epsilon")
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target}")
    if tol is None:
        tol = min(1e-3, 1e-3 * target)
    tol = _check_float(tol, "tol")
    if not (math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be finite and > 0, got {tol}")
    sampling = parse_choice(Sampling, sampling, "sampling")
    method = parse_choice(Accounting, method, "accounting method")
    sample_rate = check_sample_rate(sample_rate)
    steps = _check_int(steps, "steps", minimum=1)
    delta = check_delta(delta)

    def eps(sigma: float) -> float:
        return compute_epsilon(
            noise_multiplier=sigma,
            sample_rate=sample_rate,
            steps=steps,
            delta=delta,
            sampling=sampling,
            method=method,
        )

    try:
        if method == Accounting.PLD:
            lo, e_lo, hi, e_hi = _pld_bracket(eps, target, tol, sample_rate, steps, delta, sampling)
        else:
            lo, e_lo, hi, e_hi = _bracket(eps, target, 1.0, 0.5)
        sigma = _illinois(eps, target, tol, lo, e_lo, hi, e_hi)
    except PldTooLarge:
        # Its message names the noise multiplier of one step of the search, which the user
        # never gave (was: "at q = 0.01 and noise multiplier 1279 it takes at most ...").
        raise ValueError(
            f"calibrating the noise multiplier for epsilon = {target:g} by PLD over {steps:,} steps "
            f"needs more than the {MAX_PLD_POINTS:,} loss points PLD allows; use method 'rdp' "
            "(--method rdp), which answers any number of steps, or fewer steps"
        ) from None
    logger.debug("calibrated sigma=%.6g for epsilon=%g (%s, %s)", sigma, target, method, sampling)
    return sigma


def _pld_bracket(
    eps, target, tol, sample_rate, steps, delta, sampling
) -> tuple[float, float, float, float]:
    """A tight bracket for PLD (each evaluation is costly) found with cheap RDP calibrations.

    RDP's sigma for the target is an upper end (RDP >= PLD). With r = PLD/RDP
    there, which varies slowly with sigma, RDP's sigma for target/r, less 2%,
    is usually a lower end.
    """

    def rdp_sigma(target_epsilon: float) -> float:
        return calibrate_noise_multiplier(
            target_epsilon=target_epsilon,
            sample_rate=sample_rate,
            steps=steps,
            delta=delta,
            sampling=sampling,
            method=Accounting.RDP,
            tol=max(tol, 1e-3 * target_epsilon),
        )

    hi = rdp_sigma(target)
    e_hi = eps(hi)
    if e_hi > target:  # PLD above RDP: unusual, search upwards
        return _bracket(eps, target, hi, 0.9)
    ratio = max(e_hi / target, 0.5)
    try:
        lo = max(SIGMA_MIN, 0.98 * rdp_sigma(target / ratio))
    except ValueError:
        return _bracket(eps, target, hi, 0.9)
    e_lo = eps(lo)
    if lo < hi and e_lo > target:
        return lo, e_lo, hi, e_hi
    return _bracket(eps, target, min(lo, hi), 0.9)


def _bracket(eps, target: float, start: float, factor: float) -> tuple[float, float, float, float]:
    """Return (lo, eps(lo), hi, eps(hi)) with eps(lo) > target >= eps(hi); steps grow geometrically."""
    e = eps(start)
    if e <= target:
        hi, e_hi = start, e
        while True:
            lo = hi * factor
            if lo < SIGMA_MIN:
                raise ValueError(
                    f"target_epsilon={target:g} is met even with noise_multiplier < {SIGMA_MIN:g}; "
                    "such a target gives no meaningful privacy: lower it (or use noise_multiplier=0)"
                )
            e_lo = eps(lo)
            if e_lo > target:
                return lo, e_lo, hi, e_hi
            hi, e_hi, factor = lo, e_lo, factor * factor
    lo, e_lo = start, e
    while True:
        hi = lo / factor
        if hi > SIGMA_MAX:
            raise ValueError(
                f"target_epsilon={target:g} needs noise_multiplier > {SIGMA_MAX:g}; "
                "raise the target, or lower the sample rate or the number of steps"
            )
        e_hi = eps(hi)
        if e_hi <= target:
            return lo, e_lo, hi, e_hi
        lo, e_lo, factor = hi, e_hi, factor * factor


def _illinois(
    eps, target: float, tol: float, lo: float, e_lo: float, hi: float, e_hi: float
) -> float:
    """Narrow [lo, hi] (in log sigma) until target - tol <= eps(hi) <= target; return hi."""
    xl, xh = math.log(lo), math.log(hi)
    fl, fh = e_lo - target, e_hi - target  # fl > 0 >= fh; Illinois halves these, not e_hi
    side = 0
    for _ in range(200):
        if e_hi - target >= -tol or xh - xl < 1e-12:
            break
        x = xh - fh * (xh - xl) / (fh - fl) if math.isfinite(fl) else 0.5 * (xl + xh)
        if not xl < x < xh:
            x = 0.5 * (xl + xh)
        e = eps(math.exp(x))
        if e > target:
            xl, fl = x, e - target
            if side == -1:
                fh *= 0.5
            side = -1
        else:
            xh, fh, e_hi = x, e - target, e
            if side == 1:
                fl *= 0.5
            side = 1
    return math.exp(xh)
