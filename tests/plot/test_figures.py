"""Figures render and hold the plotted data (line data, fill collections, legends)."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

import gradspec.plot as gplot
from gradspec.plot import (
    overlay_figures,
    plot_density,
    plot_explained_variance,
    plot_lipschitz,
    plot_spectrum,
    plot_step_error,
    report_figures,
    save_figure,
)
from gradspec.spectrum import (
    DecayConfig,
    RestrictedLipschitz,
    analyze_spectrum,
    fit_spectrum,
    lipschitz_decay,
    rank_grid,
    spectral_density,
)


def test_all_public_names_import():
    for name in gplot.__all__:
        assert getattr(gplot, name) is not None, name


def _lines(ax):
    return {ln.get_label(): ln for ln in ax.get_lines()}


def test_spectrum_plot_holds_values_and_fit():
    k = np.arange(1, 101)
    sigma = 3.0 * k**-0.7
    fit = fit_spectrum(sigma)
    fig = plot_spectrum({"run": sigma}, fits={"run": fit})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "rank k" and "σ_k" in ax.get_ylabel()
    data, fitline = ax.get_lines()
    np.testing.assert_allclose(data.get_xdata(), k)
    np.testing.assert_allclose(data.get_ydata(), sigma)
    np.testing.assert_allclose(fitline.get_ydata(), fit.predict(fitline.get_xdata()))
    assert "0.700" in fitline.get_label()
    eig = plot_spectrum(sigma, scale="eigen").axes[0]
    np.testing.assert_allclose(eig.get_lines()[0].get_ydata(), sigma**2)
    with pytest.raises(ValueError, match="singular or eigen"):
        plot_spectrum(sigma, scale="log")


def test_density_plot():
    d = spectral_density(np.geomspace(10, 0.1, 60))
    ax = plot_density({"run": d}).axes[0]
    (line,) = ax.get_lines()
    np.testing.assert_allclose(line.get_xdata(), d.grid)
    np.testing.assert_allclose(line.get_ydata(), d.density)
    assert ax.get_xlabel() == "log10 σ" and "scott" in line.get_label()


def test_lipschitz_plot_with_quantile_band_and_threshold():
    ks = rank_grid(64)
    g = 2.0 * np.maximum(ks, 1).astype(float) ** -0.8
    G = RestrictedLipschitz(ks=ks, max=g, quantiles={"p50": g / 3, "p95": g / 2}, n_rows=5)
    fit = lipschitz_decay(G).fit
    ax = plot_lipschitz({"held-out": G}, fits={"held-out": fit}).axes[0]
    lines = _lines(ax)
    data = lines["held-out: max"]
    np.testing.assert_allclose(data.get_xdata(), ks[1:])
    np.testing.assert_allclose(data.get_ydata(), g[1:])
    thr = lines["held-out: G_0·k^(−1/2)"]
    np.testing.assert_allclose(thr.get_ydata(), 2.0 * np.asarray(thr.get_xdata()) ** -0.5)
    assert any(lab.startswith("fit:") for lab in lines)
    (band,) = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx((g[1:] / 3).min()) and ys.max() == pytest.approx(
        (g[1:] / 2).max()
    )


def test_explained_variance_and_step_error_plots():
    ks = np.array([0, 1, 2, 4])
    frac = np.array([0.0, 0.5, 0.7, 0.9])
    ax = plot_explained_variance({"collected": (ks, frac)}).axes[0]
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), frac[1:])
    from gradspec.spectrum import StepError

    e = StepError(
        steps=np.array([0, 1, 2]),
        ks=ks,
        error=np.tile([1.0, 0.6, 0.4, 0.2], (3, 1)),
        rows_per_step=np.ones(3, int),
        source={},
    )
    ax = plot_step_error(e, ks=[2, 4]).axes[0]
    lines = _lines(ax)
    np.testing.assert_allclose(lines["k = 2"].get_ydata(), [0.4] * 3)
    np.testing.assert_allclose(lines["k = 4"].get_xdata(), [0, 1, 2])
    with pytest.raises(ValueError, match="not on the grid"):
        plot_step_error(e, ks=[3])


def test_save_png_and_pdf(tmp_path):
    fig = plot_spectrum(np.geomspace(1, 0.01, 20))
    paths = save_figure(fig, tmp_path / "figs", "spectrum")
    assert [p.name for p in paths] == ["spectrum.png", "spectrum.pdf"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths[1].read_bytes()[:5] == b"%PDF-"


def _analysis(seed: int, c: float):
    rng = np.random.default_rng(seed)
    H = rng.standard_normal((50, 60)) * np.arange(1, 61) ** -c
    _, s, Vt = np.linalg.svd(H[:30], full_matrices=False)

    def blocks(X):
        return [(a, X[:, a : a + 16]) for a in range(0, 60, 16)]

    return analyze_spectrum(
        sigma=s,
        basis=Vt.T,
        gradients=blocks(H[:30]),
        gradient_steps=np.arange(30),
        heldout=blocks(H[30:]),
        heldout_steps=np.arange(30, 50),
        config=DecayConfig(n=1000, epsilon=1.0, delta=1e-5, diameter=1.0),
    )


def test_report_figures_from_analysis_and_json():
    a = _analysis(0, 0.8)
    figs = report_figures(a)  # writing files: test_save_png_and_pdf and the CLI tests
    assert set(figs) == {
        "spectrum",
        "eigenvalues",
        "density",
        "lipschitz",
        "explained_variance",
        "step_error",
    }
    np.testing.assert_allclose(figs["spectrum"].axes[0].get_lines()[0].get_ydata(), a.sigma)
    again = report_figures(json.loads(json.dumps(a.to_dict())))
    l1 = _lines(figs["lipschitz"].axes[0])["heldout: max"].get_ydata()
    l2 = _lines(again["lipschitz"].axes[0])["heldout: max"].get_ydata()
    np.testing.assert_allclose(l1, l2)


def test_overlay_has_one_series_per_run():
    runs = {"T=10": _analysis(0, 0.8), "T=50": _analysis(1, 1.0)}
    figs = overlay_figures(runs)
    ax = figs["spectrum"].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "T=10" in labels and "T=50" in labels
    np.testing.assert_allclose(_lines(ax)["T=50"].get_ydata(), runs["T=50"].sigma)
    assert {"T=10 (heldout): max", "T=50 (heldout): max"} <= set(_lines(figs["lipschitz"].axes[0]))


def test_a_run_left_out_of_an_overlay_is_named(caplog):
    """A run whose analysis fitted σ only (no gradient rows) vanished from the G_k overlay without
    a word; it is now named in a warning, and the other run's curve stays."""
    rng = np.random.default_rng(3)
    sigma_only = analyze_spectrum(sigma=np.sort(rng.random(20))[::-1] + 0.1, config=DecayConfig())
    with caplog.at_level("WARNING", logger="gradspec.plot"):
        figs = overlay_figures({"rows": _analysis(0, 0.8), "sigma only": sigma_only})
    assert [n for n in _lines(figs["lipschitz"].axes[0]) if not n.startswith("fit:")] == ["rows (heldout): max"]
    warned = [r.getMessage() for r in caplog.records if "G_k" in r.getMessage()]
    assert warned == ["'sigma only' has no G_k (its analysis fitted sigma only): it is left out of the G_k and "
                      "explained-variance overlays"]
