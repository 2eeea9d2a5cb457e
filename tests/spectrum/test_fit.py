"""Power-law fits recover the exponent of synthetic spectra σ_k = a·k^(−c)·(1 + noise)."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.spectrum import PowerLawFit, compare_fits, fit_power_law, fit_spectrum

# (a, c, relative noise, seed). Tolerance on c: 0.02 absolute at 5% noise over k = 1..500
# (the OLS standard error is ~0.002 there, so 0.02 is ~10 standard errors).
CASES = [(1.0, 0.3, 0.05, 0), (50.0, 0.7, 0.05, 1), (3.0, 1.2, 0.05, 2), (0.01, 0.55, 0.02, 3)]
TOL_C = 0.02


def _spectrum(a: float, c: float, noise: float, seed: int, K: int = 500) -> np.ndarray:
    rng = np.random.default_rng(seed)
    k = np.arange(1, K + 1)
    s = a * k**-c * (1 + noise * rng.standard_normal(K))
    return np.sort(s)[::-1]


@pytest.mark.parametrize("case", CASES, ids=[f"a{a}-c{c}-noise{n}" for a, c, n, _ in CASES])
@pytest.mark.parametrize("ci", ["analytic", "bootstrap"])
def test_fit_recovers_exponent(case, ci):
    a, c, noise, seed = case
    fit = fit_spectrum(_spectrum(a, c, noise, seed), ci=ci, n_boot=300)
    assert abs(fit.c - c) < TOL_C
    assert abs(np.log(fit.a / a)) < 0.1
    assert fit.r2 > 0.95
    assert fit.ci[0] < fit.c < fit.ci[1]
    assert fit.ci[1] - fit.ci[0] < 4 * TOL_C
    assert fit.ci_method == ci
    assert (fit.k_min, fit.k_max, fit.n_points) == (1, 500, 500)


def test_exact_power_law_and_eigen_convention():
    k = np.arange(1, 101)
    s = 2.5 * k**-0.8
    fs = fit_spectrum(s)
    fe = fit_spectrum(s, scale="eigen")
    np.testing.assert_allclose([fs.c, fs.a, fs.r2], [0.8, 2.5, 1.0], rtol=1e-10)
    np.testing.assert_allclose([fe.c, fe.a], [1.6, 6.25], rtol=1e-10)
    assert fs.quantity == "singular" and fe.quantity == "eigen"
    assert "σ_k ≈ 2.5·k^(−0.800)" in fs.describe()
    assert fe.describe().startswith("λ_k")


def test_range_and_dropped_points():
    k = np.arange(1, 51).astype(float)
    y = np.where(k <= 20, 10 * k**-1.0, 10 * k**-2.0)
    y[5] = 0.0
    fit = fit_power_law(k, y, k_range=(1, 20))
    assert fit.c == pytest.approx(1.0, abs=1e-12)
    assert (fit.k_min, fit.k_max, fit.n_points, fit.n_dropped) == (1, 20, 19, 1)


def test_default_range_is_top_1000():
    fit = fit_spectrum(np.arange(1, 1501) ** -0.5)
    assert fit.k_max == 1000


def test_round_trip_and_predict():
    fit = fit_spectrum(_spectrum(1.0, 0.7, 0.05, 0))
    again = PowerLawFit.from_dict(fit.to_dict())
    assert again == fit
    np.testing.assert_allclose(fit.predict([1, 10]), fit.a * np.array([1, 10.0]) ** -fit.c)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(k=[1, 2], y=[1, 0.5]), "at least 3"),
        (dict(k=[0, 1, 2], y=[1, 1, 0.5]), "positive k"),
        (dict(k=[1, 2, 3], y=[1, 0.5]), "same length"),
        (dict(k=[1, 2, 3], y=[1, 0.5, 0.3], ci="jackknife"), "bootstrap"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_power_law(**kwargs)


def test_unsorted_spectrum_rejected():
    with pytest.raises(ValueError, match="decreasing"):
        fit_spectrum([1.0, 2.0, 0.5])


def test_compare_fits():
    fits = {
        f"c={c}": fit_spectrum(_spectrum(1.0, c, 0.05, i)) for i, c in enumerate((0.5, 0.52, 1.0))
    }
    cmp = compare_fits(fits)
    assert cmp["c_spread"] == pytest.approx(
        max(f.c for f in fits.values()) - min(f.c for f in fits.values())
    )
    pairs = {(p["a"], p["b"]): p for p in cmp["pairs"]}
    assert len(pairs) == 3
    assert not pairs[("c=0.5", "c=1.0")]["ci_overlap"]
    assert pairs[("c=0.5", "c=1.0")]["delta_c"] == pytest.approx(fits["c=1.0"].c - fits["c=0.5"].c)
