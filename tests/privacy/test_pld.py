"""PLD accounting (`gradspec.privacy._pld`): dp-accounting's numbers, bounded memory, cheap queries.

The composition is a port of dp-accounting's; these tests hold it to dp-accounting's
`PLDAccountant` (an independent run of the same algorithm), check that a run too long for
the memory limit is refused before anything is allocated (and that the step count the
refusal names does fit), and that an accountant asked for epsilon after every step gives
exactly the numbers of a fresh accountant (the training loop's pattern).
"""

from __future__ import annotations

import math
import re

import dp_accounting as dpa
import pytest

from gradspec.privacy import PrivacyAccountant, _compose, _pld, compute_epsilon
from tests.privacy._pld_caches import _fresh_caches  # noqa: F401 (autouse: fresh PLD caches)

DELTA = 1e-5




def _library(events: list) -> float:
    return dpa.pld.PLDAccountant().compose(dpa.ComposedDpEvent(events)).get_epsilon(DELTA)


def _poisson(q: float, sigma: float, count: int):
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), count)


# ------------------------------------------------------------------ against dp-accounting
@pytest.mark.parametrize(
    ("sigma", "q", "steps"),
    [(1.0, 0.05, 1), (1.0, 0.05, 600), (2.0, 0.1, 100), (5.0, 0.01, 1000), (0.7, 0.02, 300)],
    ids=["one-step", "q0.05-600", "q0.1-100", "sparse-step", "small-sigma"],
)
def test_self_composition_matches_dp_accounting(sigma, q, steps):
    ours = compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=DELTA)
    # The same algorithm; only rounding differs (the loss grid read by multiplication, not by
    # repeated subtraction; rfft for fft): measured 2e-11 to 7e-9.
    assert ours == pytest.approx(_library([_poisson(q, sigma, steps)]), rel=1e-7)


def test_mixed_mechanisms_match_dp_accounting():
    acc = PrivacyAccountant()
    acc.record_poisson(3.0, 0.1, 20)
    acc.record_poisson(2.0, 0.05, 30)  # another mechanism: composed with an FFT convolution
    acc.record_gaussian(10.0, 2)
    acc.record_poisson(3.0, 0.1, 5)  # the first mechanism again: composition commutes
    library = _library([_poisson(0.1, 3.0, 25), _poisson(0.05, 2.0, 30), dpa.GaussianDpEvent(10.0 / math.sqrt(2))])
    assert acc.epsilon(DELTA) == pytest.approx(library, rel=1e-7)


def test_tiny_delta_falls_back_to_the_rdp_bound():
    eps = compute_epsilon(noise_multiplier=1.0, sample_rate=0.05, steps=10, delta=1e-300)
    rdp = compute_epsilon(noise_multiplier=1.0, sample_rate=0.05, steps=10, delta=1e-300, method="rdp")
    assert math.isfinite(eps) and eps == rdp


# ------------------------------------------------------------------ bounded memory
@pytest.mark.parametrize("steps", [10**9, 10**12])
def test_a_run_too_long_for_pld_is_refused_before_allocating(monkeypatch, steps):
    def no_composition(*_args, **_kwargs):
        raise AssertionError("composed although the size check should have refused")

    monkeypatch.setattr(_pld._Step, "self_compose", no_composition)
    with pytest.raises(ValueError, match=r"more than the 16,777,216 it allows; .* at most [\d,]+ steps: use method 'rdp'") as err:
        compute_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=steps, delta=DELTA)
    assert "\n" not in str(err.value)
    # RDP answers any step count (its cost does not depend on it).
    eps = compute_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=steps, delta=DELTA, method="rdp")
    assert math.isfinite(eps) and eps > 0


def test_the_step_count_the_refusal_names_fits_and_one_more_does_not(monkeypatch):
    """With the limit lowered to 200,000 points (cheap), the step count the refusal names is
    accepted and gives dp-accounting's epsilon; one step more is refused."""
    monkeypatch.setattr(_pld, "MAX_PLD_POINTS", 200_000)
    run = dict(noise_multiplier=1.0, sample_rate=0.05, delta=DELTA)
    with pytest.raises(ValueError, match=r"at most ([\d,]+) steps") as err:
        compute_epsilon(steps=10**6, **run)
    fits = int(re.search(r"at most ([\d,]+) steps", str(err.value)).group(1).replace(",", ""))
    assert 10 < fits < 10**6
    assert compute_epsilon(steps=fits, **run) == pytest.approx(_library([_poisson(0.05, 1.0, fits)]), rel=1e-7)
    with pytest.raises(ValueError, match="at most"):
        compute_epsilon(steps=fits + 1, **run)


def test_a_single_step_too_fine_for_pld_is_refused_before_it_is_built(monkeypatch):
    def no_building(*_args, **_kwargs):
        raise AssertionError("dp-accounting built the step although its size was known to be too large")

    monkeypatch.setattr(dpa.pld.privacy_loss_distribution, "from_gaussian_mechanism", no_building)
    monkeypatch.setattr(_pld, "gaussian_step", no_building)
    # sigma = 0.01 at q = 0.5: one step is 59.7 million loss points (about 3 GB in
    # dp-accounting's dicts before any composition).
    with pytest.raises(ValueError, match=r"59,745,477 loss points for one step.*use method 'rdp'"):
        compute_epsilon(noise_multiplier=0.01, sample_rate=0.5, steps=1, delta=DELTA)


# ------------------------------------------------------------------ cheap repeated queries
def _fresh_epsilon(events: list[tuple[float, float, int]]) -> float:
    _pld.clear_cache()
    _compose._epsilon.cache_clear()
    acc = PrivacyAccountant()
    for sigma, q, count in events:
        acc.record_poisson(sigma, q, count)
    return acc.epsilon(DELTA)


def test_epsilon_after_every_step_equals_a_fresh_accountants():
    """The training loop's pattern (record one step, ask epsilon) gives exactly what an
    accountant that recorded all the steps at once gives, with nothing cached."""
    acc = PrivacyAccountant()
    logged = []
    for _ in range(40):
        acc.record_poisson(2.0, 0.1)
        logged.append(acc.epsilon(DELTA))
    acc.record_poisson(1.5, 0.1, 7)  # the noise multiplier changes mid-run
    logged.append(acc.epsilon(DELTA))
    assert logged[-1] == _fresh_epsilon([(2.0, 0.1, 40), (1.5, 0.1, 7)])
    for n in (1, 2, 17, 39, 40):
        assert logged[n - 1] == _fresh_epsilon([(2.0, 0.1, n)]), n
    assert all(a < b for a, b in zip(logged[:-1], logged[1:], strict=True))


def test_the_single_step_is_built_once_for_all_queries(monkeypatch):
    built = []
    original = _pld.gaussian_step

    def counting(sigma, q, discretisation):
        built.append(q)
        return original(sigma, q, discretisation)

    monkeypatch.setattr(_pld, "gaussian_step", counting)
    acc = PrivacyAccountant()
    for _ in range(30):
        acc.record_poisson(2.0, 0.1)
        acc.epsilon(DELTA)
    assert built == [0.1]


@pytest.mark.parametrize(("sigma", "q"), [(0.5, 0.003381), (1.0, 0.05), (0.8, 1.0)])
def test_the_tail_bounds_moments_are_scipys_logsumexp(sigma, q):
    """The moments of the composition's Chernoff bound (log E[exp(order * index)]) against
    scipy's logsumexp, also on a distribution with zero-mass points at both ends."""
    import numpy as np
    from scipy import special

    step = _pld._step(sigma, q)
    padded = step.pld.remove._replace(probs=np.concatenate([np.zeros(50), step.pld.remove.probs, np.zeros(70)]))
    for pmf in (step.pld.remove, step.pld.add, padded):
        orders, values = _pld._Step(step.pld)._log_mgfs(pmf)
        index = np.arange(len(pmf.probs))
        expected = np.array([special.logsumexp(index * o, b=pmf.probs) for o in orders])
        assert np.allclose(values, expected, rtol=1e-12, atol=1e-12)
