"""One Gaussian step's PLD built with the vectorised inverse (`gradspec.privacy._pld_step`) is
dp-accounting's `from_gaussian_mechanism`, bit for bit; where the library's formulas differ
or a grid point needs a branch the module does not take, the library's own build is used."""

from __future__ import annotations

import logging
import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_mechanism as plm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradspec.privacy import _compose, _pld, _pld_step, calibrate_noise_multiplier
from gradspec.privacy._pld import DISCRETISATION, _from_library
from tests.privacy._pld_caches import _fresh_caches  # noqa: F401 (autouse: fresh PLD caches)

ADJACENCY = {"remove": plm.AdjacencyType.REMOVE, "add": plm.AdjacencyType.ADD}




def _library(sigma: float, q: float):
    return dpa.pld.privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma, value_discretization_interval=DISCRETISATION, sampling_prob=q,
        neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )


def _assert_same(a, b) -> None:
    for x, y in ((a.remove, b.remove), (a.add, b.add)):
        assert x.lower == y.lower
        assert x.infinity_mass == y.infinity_mass
        assert np.array_equal(x.probs, y.probs)
    assert (a.add is a.remove) == (b.add is b.remove)  # symmetric exactly when the library's is


# sigma, q: DP-SGD's range (q from 1e-6 to 1), a plain Gaussian (q = 1), q next to 1, a step
# of a few points, and one of 100k points
@pytest.mark.parametrize(("sigma", "q"), [
    (0.45, 1e-6), (0.6, 0.5), (0.8, 1.0), (1.0, 0.01), (1.1, 256 / 60_000), (2.0, 0.999),
    (5.0, 1e-4), (10.0, 0.05), (0.7, 0.3),
])
def test_the_step_is_dp_accountings_bit_for_bit(sigma, q):
    _assert_same(_from_library(_pld_step.gaussian_step(sigma, q, DISCRETISATION)), _from_library(_library(sigma, q)))


@pytest.mark.parametrize("adjacency", ["remove", "add"])
@pytest.mark.parametrize(("sigma", "q"), [(0.5, 0.003381), (1.3, 0.2), (0.9, 1.0)])
def test_the_inverse_privacy_loss_is_the_librarys_at_every_point(adjacency, sigma, q):
    loss = plm.GaussianPrivacyLoss(sigma, sampling_prob=q, adjacency_type=ADJACENCY[adjacency])
    rng = np.random.default_rng(0)
    if q == 1.0:
        eps = rng.uniform(-20, 20, 400)
    elif adjacency == "remove":
        edge = math.log(1 - q)
        eps = np.concatenate([edge + rng.exponential(2.0, 400), [edge, edge * (1 + 1e-12)]])
    else:
        edge = -math.log(1 - q)
        eps = np.concatenate([edge - rng.exponential(2.0, 400), [edge, edge * (1 - 1e-12)]])
    ours = _pld_step.inverse_privacy_loss(sigma, q, adjacency, eps)
    theirs = np.array([loss.inverse_privacy_loss(float(e)) for e in eps])
    assert np.array_equal(ours, theirs)
    if q < 1.0:  # the edge itself maps to the end of the line, as the library maps it
        assert ours[-2] == ours[-1] == (math.inf if adjacency == "remove" else -math.inf)


def test_a_loss_outside_the_inverse_range_is_left_to_the_library():
    with pytest.raises(_pld_step._Unsupported):
        _pld_step.inverse_privacy_loss(1.0, 0.1, "remove", np.array([math.log(0.9) - 0.5]))
    with pytest.raises(_pld_step._Unsupported):
        _pld_step.inverse_privacy_loss(1.0, 0.1, "add", np.array([-math.log(0.9) + 0.5]))
    with pytest.raises(ValueError, match="adjacency"):
        _pld_step.inverse_privacy_loss(1.0, 0.1, "replace", np.array([0.0]))


def test_an_unsupported_grid_point_builds_with_the_library(monkeypatch):
    def unsupported(*_args):
        raise _pld_step._Unsupported("a branch this module does not take")

    monkeypatch.setattr(_pld_step, "hockey_stick", unsupported)
    _assert_same(_from_library(_pld_step.gaussian_step(1.0, 0.05, DISCRETISATION)), _from_library(_library(1.0, 0.05)))


def test_a_library_whose_divergence_differs_is_used_with_a_warning(monkeypatch, caplog):
    """Another dp-accounting (its δ(ε) moved by 1e-13 here) fails the spot check: its own
    build, slower, is what gradspec uses, and it says so."""
    original = plm.AdditiveNoisePrivacyLoss.get_delta_for_epsilon

    def moved(self, epsilon):
        return np.asarray(original(self, epsilon)) + 1e-13

    monkeypatch.setattr(plm.AdditiveNoisePrivacyLoss, "get_delta_for_epsilon", moved)
    monkeypatch.setattr(_pld_step, "_library_only", False)
    with caplog.at_level(logging.WARNING, logger="gradspec.privacy._pld_step"):
        got = _pld_step.gaussian_step(1.0, 0.05, DISCRETISATION)
        assert caplog.text.count("differs from gradspec's vectorised one") == 1
        _assert_same(_from_library(got), _from_library(_library(1.0, 0.05)))  # the moved library's
        again = _pld_step.gaussian_step(2.0, 0.05, DISCRETISATION)  # the library's from now on, no more warnings
    assert caplog.text.count("differs from gradspec's vectorised one") == 1
    _assert_same(_from_library(again), _from_library(_library(2.0, 0.05)))


def test_the_spot_check_covers_both_ends_and_the_edge():
    eps = np.arange(-30_000, 30_001) * DISCRETISATION
    q = 0.1
    picks = _pld_step._spot_indices(eps, q)
    assert picks[0] == 0 and picks[-1] == len(eps) - 1
    for t in (math.log1p(-q), -math.log1p(-q)):
        i = int(np.searchsorted(eps, t))
        assert {i - 1, i} <= set(picks.tolist())


def test_a_calibration_gives_the_noise_multiplier_the_library_path_gives(monkeypatch):
    run = {"target_epsilon": 2.0, "sample_rate": 0.01, "steps": 100, "delta": 1e-5}
    fast = calibrate_noise_multiplier(**run)
    _pld.clear_cache()
    _compose._epsilon.cache_clear()
    monkeypatch.setattr(_pld, "gaussian_step", lambda sigma, q, _disc: _library(sigma, q))
    assert calibrate_noise_multiplier(**run) == fast


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sigma=st.floats(0.8, 20.0), log_q=st.floats(-5.0, 0.0))
def test_random_steps_are_dp_accountings_bit_for_bit(sigma, log_q):
    q = min(1.0, 10.0**log_q)
    _assert_same(_from_library(_pld_step.gaussian_step(sigma, q, DISCRETISATION)), _from_library(_library(sigma, q)))
