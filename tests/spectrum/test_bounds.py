"""Theorems 3.3 / 3.5 of Li et al. 2022 against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradspec.spectrum import (
    dimension_dependent_bound,
    dimension_free_rate,
    fit_power_law,
    lipschitz_lookup,
    restricted_lipschitz_bound,
    subspace_term,
)

# n = 100, ε = 1, δ = e^(−4) (so sqrt(log(1/δ)) = 2), D = 2, d = 8, G_j = 1/(j + 1).
SETTING = dict(n=100, epsilon=1.0, delta=math.exp(-4), diameter=2.0)
D8 = 8
KS8 = np.arange(0, 9)
G8 = 1.0 / (KS8 + 1.0)


def test_subspace_term_by_hand():
    # k = 1: S = ⌊log2 8⌋ + 1 = 4 → 1·2·G_1² + 4·4·G_2² + 9·8·G_4² + 16·16·G_8² (G_8 = G_d = 0)
    k1 = 2 * math.sqrt(2 / 4 + 16 / 9 + 72 / 25)
    # k = 3: S = ⌊log2(8/3)⌋ + 1 = 2 → 2·G_3² + 16·G_6²
    k3 = 2 * math.sqrt(2 / 16 + 16 / 49)
    # k = 5: S = 1 → 2·G_5²; k = 8: S = 1 → 2·G_8² = 0
    k5 = 2 * math.sqrt(2 / 36)
    got = subspace_term(np.array([1, 3, 5, 8]), ks=KS8, G=G8, dim=D8, diameter=2.0)
    np.testing.assert_allclose(got, [k1, k3, k5, 0.0], rtol=1e-12)


def test_bound_by_hand():
    rep = restricted_lipschitz_bound(ks=KS8, G=G8, dim=D8, **SETTING, candidates=[1, 3, 8])
    privacy = 1.0 * 2.0 * 2.0 * np.sqrt([1, 3, 8]) / 100  # G_0·D·sqrt(k·log(1/δ))/(ε·n)
    np.testing.assert_allclose(rep.privacy, privacy, rtol=1e-12)
    np.testing.assert_allclose(rep.total, rep.privacy + rep.subspace, rtol=1e-12)
    # k = d: the subspace term vanishes and eq. (1) is the dimension-dependent bound.
    assert rep.total[-1] == pytest.approx(rep.dimension_dependent, rel=1e-12)
    assert rep.dimension_dependent == pytest.approx(2 * 2 * math.sqrt(8) / 100, rel=1e-12)
    assert rep.k_star == 8 and rep.bound == pytest.approx(rep.total.min())
    assert rep.theorem == "3.3" and rep.statistical == 0.0
    assert rep.rate is None and rep.rate_valid is False


def test_population_adds_statistical_term():
    emp = restricted_lipschitz_bound(ks=KS8, G=G8, dim=D8, **SETTING)
    pop = restricted_lipschitz_bound(ks=KS8, G=G8, dim=D8, **SETTING, population=True)
    assert pop.theorem == "3.5"
    assert pop.statistical == pytest.approx(1.0 * 2.0 / 10)  # G_0·D/sqrt(n)
    np.testing.assert_allclose(pop.total - emp.total, 0.2)
    assert pop.dimension_dependent == pytest.approx(emp.dimension_dependent + 0.2)


def test_rate_eq2_by_hand():
    # G_0·D·(sqrt(log(1/δ))/(ε·n))^(2c/(1+2c)) at c = 1: 2·(2/100)^(2/3)
    assert dimension_free_rate(c=1.0, G0=1.0, **SETTING) == pytest.approx(2 * 0.02 ** (2 / 3))
    assert dimension_free_rate(c=1.0, G0=1.0, **SETTING, population=True) == pytest.approx(
        2 * 0.02 ** (2 / 3) + 0.2
    )
    assert dimension_dependent_bound(dim=10**6, G0=1.0, **SETTING) == pytest.approx(
        2 * 2 * 1000 / 100
    )
    rep = restricted_lipschitz_bound(ks=KS8, G=G8, dim=D8, **SETTING, c=1.0)
    assert rep.rate == pytest.approx(2 * 0.02 ** (2 / 3)) and rep.rate_valid


def test_lookup_between_and_beyond_measured_ranks():
    ks, G = np.array([0, 1, 2, 4]), np.array([1.0, 0.5, 0.25, 0.1])
    fit = fit_power_law([1, 2, 4], [0.5, 0.25, 0.125])  # 0.5·k^(−1)
    j = np.array([0, 3, 4, 5, 8, 16, 64])
    np.testing.assert_allclose(lipschitz_lookup(ks, G, j, dim=16), [1, 0.25, 0.1, 0.1, 0.1, 0, 0])
    np.testing.assert_allclose(
        lipschitz_lookup(ks, G, j, dim=16, tail="zero"), [1, 0.25, 0.1, 0, 0, 0, 0]
    )
    np.testing.assert_allclose(
        lipschitz_lookup(ks, G, j, dim=16, tail="fit", tail_fit=fit),
        [1, 0.25, 0.1, 0.1, 0.0625, 0, 0],
    )
    with pytest.raises(ValueError, match="tail_fit"):
        lipschitz_lookup(ks, G, j, dim=16, tail="fit")
    with pytest.raises(ValueError, match="hold, fit, zero"):
        lipschitz_lookup(ks, G, j, dim=16, tail="linear")


def test_tail_rules_by_hand():
    ks, G = np.array([0, 1, 2]), np.array([1.0, 0.5, 0.25])
    # d = 8, k = 1: indices 1, 2, 4, 8 → G_4 is beyond the measured ranks, G_8 = 0.
    hold = subspace_term(np.array([1]), ks=ks, G=G, dim=8, diameter=1.0, tail="hold")
    zero = subspace_term(np.array([1]), ks=ks, G=G, dim=8, diameter=1.0, tail="zero")
    assert hold[0] == pytest.approx(math.sqrt(2 * 0.25 + 16 * 0.0625 + 72 * 0.0625))
    assert zero[0] == pytest.approx(math.sqrt(2 * 0.25 + 16 * 0.0625))


@pytest.mark.parametrize(
    "c, dimension_free", [(1.0, True), (0.0, False)], ids=["decaying", "constant"]
)
def test_dimension_independence(c, dimension_free):
    """With c > 1/2 the minimised bound hardly moves from d = 10³ to 10⁷; with c = 0 it grows."""
    K = 512
    ks = np.arange(0, K + 1)
    G = np.maximum(ks, 1).astype(float) ** -c
    fit = fit_power_law(ks[1:], G[1:]) if c > 0 else None
    setting = dict(n=1000, epsilon=2.0, delta=1e-6, diameter=1.0)  # k* ≈ 66 ≪ d
    bounds, dep = [], []
    for dim in (10**3, 10**5, 10**7):
        rep = restricted_lipschitz_bound(
            ks=ks, G=G, dim=dim, tail="fit" if fit else "hold", tail_fit=fit, **setting
        )
        bounds.append(rep.bound)
        dep.append(rep.dimension_dependent)
        assert rep.bound <= rep.dimension_dependent * (1 + 1e-12)
    assert dep[-1] / dep[0] == pytest.approx(100.0)
    if dimension_free:
        assert bounds[-1] / bounds[0] < 1.5
    else:
        assert bounds[-1] / bounds[0] > 10


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(epsilon=0.0), "epsilon"),
        (dict(delta=1.0), "delta"),
        (dict(n=0), "n "),
        (dict(diameter=-1.0), "diameter"),
    ],
)
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        restricted_lipschitz_bound(ks=KS8, G=G8, dim=D8, **{**SETTING, **kw})


def test_hypotheses_flags():
    rep = restricted_lipschitz_bound(
        ks=KS8, G=G8, dim=D8, **{**SETTING, "delta": 0.7, "epsilon": 20.0}
    )
    assert rep.hypotheses == {
        "delta_in_(0,1/2]": False,
        "epsilon_in_(0,10]": False,
        "n_ge_sqrt(log(1/delta))/epsilon": True,
    }
    with pytest.raises(ValueError, match="G_0"):
        restricted_lipschitz_bound(ks=KS8[1:], G=G8[1:], dim=D8, **SETTING)
