"""KDE of singular values; explained variance and per-step reconstruction error."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.spectrum import (
    SpectralDensity,
    explained_variance,
    explained_variance_rows,
    project_rows,
    reconstruction_error_by_step,
    spectral_density,
)


def test_density_scott_rule_and_normalisation():
    rng = np.random.default_rng(0)
    sigma = np.sort(10 ** rng.normal(0.0, 0.5, 400))[::-1]
    d = spectral_density(sigma)
    x = np.log10(sigma)
    assert d.rule == "scott" and d.space == "log10" and d.n_values == 400
    assert d.bandwidth == pytest.approx(x.std(ddof=1) * 400 ** (-1 / 5), rel=1e-10)
    assert np.trapezoid(d.density, d.grid) == pytest.approx(1.0, abs=1e-3)
    assert abs(d.grid[np.argmax(d.density)]) < 0.2  # mode near log10 σ = 0
    assert "scott" in d.describe()


def test_density_other_rules():
    sigma = np.linspace(5, 1, 50)
    sil = spectral_density(sigma, space="linear", bandwidth="silverman")
    assert sil.bandwidth == pytest.approx(sigma.std(ddof=1) * (50 * 3 / 4) ** (-1 / 5), rel=1e-10)
    fixed = spectral_density(sigma, space="linear", bandwidth=0.3)
    assert fixed.bandwidth == pytest.approx(0.3) and fixed.rule == "fixed"
    again = SpectralDensity.from_dict(fixed.to_dict())
    np.testing.assert_array_equal(again.density, fixed.density)
    with pytest.raises(ValueError, match="scott, silverman"):
        spectral_density(sigma, bandwidth="wide")
    with pytest.raises(ValueError, match="equal"):
        spectral_density([1.0, 1.0, 1.0])


def _blocks(H, w=9):
    return [(a, H[:, a : a + w]) for a in range(0, H.shape[1], w)]


def test_explained_variance_in_sample_equals_spectrum():
    rng = np.random.default_rng(1)
    H = rng.standard_normal((25, 40)) * np.arange(1, 41) ** -0.6
    _, s, Vt = np.linalg.svd(H, full_matrices=False)
    frob2 = float((H**2).sum())
    ev = explained_variance(s, total_energy=frob2)
    proj = project_rows(_blocks(H), Vt.T, ks=np.arange(0, 26))
    rows = explained_variance_rows(proj)
    np.testing.assert_allclose(rows.fraction[1:], ev, rtol=1e-10)
    assert rows.fraction[0] == 0.0 and rows.fraction[-1] == pytest.approx(1.0)
    np.testing.assert_allclose(
        explained_variance(s[:5])[-1], 1.0
    )  # no total: fraction of the computed part
    with pytest.raises(ValueError, match="exceeds"):
        explained_variance(s, total_energy=frob2 / 2)


def test_explained_variance_held_out_is_lower():
    rng = np.random.default_rng(2)
    H = rng.standard_normal((60, 40)) * np.arange(1, 41) ** -0.6
    Vt = np.linalg.svd(H[:30], full_matrices=False)[2]
    ks = np.array([5, 10])
    ins = explained_variance_rows(project_rows(_blocks(H[:30]), Vt.T, ks=ks))
    out = explained_variance_rows(project_rows(_blocks(H[30:]), Vt.T, ks=ks))
    assert np.all(out.fraction < ins.fraction)
    ref = 1 - ((H[30:] - H[30:] @ Vt[:5].T @ Vt[:5]) ** 2).sum() / (H[30:] ** 2).sum()
    assert out.fraction[0] == pytest.approx(ref, rel=1e-10)


def test_reconstruction_error_by_step():
    rng = np.random.default_rng(3)
    H = rng.standard_normal((12, 20))
    V = np.linalg.svd(H[:6], full_matrices=False)[2].T
    steps = np.repeat([10, 20, 30], 4)  # per-example rows: 4 per step
    proj = project_rows(_blocks(H, 7), V, ks=[0, 3])
    se = reconstruction_error_by_step(proj, steps)
    assert se.steps.tolist() == [10, 20, 30] and se.rows_per_step.tolist() == [4, 4, 4]
    P = V[:, :3] @ V[:, :3].T
    for t, rows in enumerate((slice(0, 4), slice(4, 8), slice(8, 12))):
        g = H[rows]
        expect = np.sqrt(((g - g @ P) ** 2).sum() / (g**2).sum())
        assert se.error[t, 1] == pytest.approx(expect, rel=1e-10)
        assert se.error[t, 0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="steps"):
        reconstruction_error_by_step(proj, steps[:-1])
