"""Accounting of uniformly sampled DP-SGD steps (Li et al. 2022, Alg. 1), replace-one relation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradspec.privacy import calibrate_uniform_sampling, uniform_sampling_epsilon


def _gaussian_rdp_epsilon(noise_over_sensitivity: float, steps: int, delta: float) -> float:
    """Independent: T Gaussian mechanisms (RDP a / (2 s^2) each), converted with the improved bound
    eps = min_a T a / (2 s^2) + log((a - 1) / a) - (log delta + log a) / (a - 1)."""
    orders = np.concatenate([np.linspace(1.01, 12, 2000), np.arange(12, 5000)])
    rdp = steps * orders / (2 * noise_over_sensitivity**2)
    eps = rdp + np.log1p(-1 / orders) - (np.log(delta) + np.log(orders)) / (orders - 1)
    return float(eps.min())


def test_full_batch_is_the_gaussian_mechanism_with_sensitivity_2g():
    # B = n: no subsampling; replacing one example moves the sum by <= 2G, so the noise
    # G * sigma is sigma / 2 sensitivities. An independent RDP computation must agree.
    for sigma, steps in ((4.0, 1), (8.0, 10), (20.0, 100)):
        ours = uniform_sampling_epsilon(noise_multiplier=sigma, n=50, batch_size=50, steps=steps, delta=1e-6)
        ref = _gaussian_rdp_epsilon(sigma / 2, steps, 1e-6)
        assert ours == pytest.approx(ref, rel=2e-3)
        # ... and is clearly not the add/remove convention (sensitivity G)
        assert ours > 1.5 * _gaussian_rdp_epsilon(sigma, steps, 1e-6)


def test_subsampling_amplifies_and_epsilon_falls_with_sigma():
    kw = dict(n=10_000, batch_size=1, steps=20_000, delta=1e-6)
    eps = [uniform_sampling_epsilon(noise_multiplier=s, **kw) for s in (0.8, 1.25, 2.0, 4.0)]
    assert all(a > b for a, b in zip(eps, eps[1:], strict=False))
    # T steps sampling 1 of n are far more private than T full-batch steps with the same noise
    assert eps[1] < 0.01 * _gaussian_rdp_epsilon(1.25 / 2, 20_000, 1e-6)


@pytest.mark.slow  # each calibration evaluates dp-accounting's (scalar-loop) bound some 20 times
@pytest.mark.parametrize(("target", "n", "b", "steps"), [(2.0, 10_000, 1, 20_000), (2.0, 1000, 100, 50),
                                                        (0.5, 1000, 1, 1000)])
def test_calibration_meets_the_target(target, n, b, steps):
    sigma = calibrate_uniform_sampling(target_epsilon=target, n=n, batch_size=b, steps=steps, delta=1e-6)
    eps = uniform_sampling_epsilon(noise_multiplier=sigma, n=n, batch_size=b, steps=steps, delta=1e-6)
    assert target - 1e-3 * target - 1e-12 <= eps <= target
    assert uniform_sampling_epsilon(noise_multiplier=sigma * 0.99, n=n, batch_size=b, steps=steps,
                                    delta=1e-6) > target


def test_bad_inputs():
    with pytest.raises(ValueError, match="batch_size"):
        uniform_sampling_epsilon(noise_multiplier=1.0, n=10, batch_size=11, steps=1, delta=1e-5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        uniform_sampling_epsilon(noise_multiplier=0.0, n=10, batch_size=1, steps=1, delta=1e-5)
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_uniform_sampling(target_epsilon=math.inf, n=10, batch_size=1, steps=1, delta=1e-5)
