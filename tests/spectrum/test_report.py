"""analyze_spectrum assembles every number into a JSON-clean report."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gradspec.spectrum as spectrum
from gradspec.spectrum import DecayConfig, analyze_spectrum


def test_all_public_names_import():
    for name in spectrum.__all__:
        assert getattr(spectrum, name) is not None, name


def _blocks(H, w=16):
    return [(a, H[:, a : a + w]) for a in range(0, H.shape[1], w)]


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    H = rng.standard_normal((60, 80)) * np.arange(1, 81) ** -0.8
    _, s, Vt = np.linalg.svd(H[:40], full_matrices=False)
    return H, s, Vt.T


def test_report_contents(data):
    H, s, V = data
    cfg = DecayConfig(n=1000, epsilon=2.0, delta=1e-5, diameter=1.0, k_max=32)
    a = analyze_spectrum(
        sigma=s,
        basis=V,
        config=cfg,
        gradients=_blocks(H[:40]),
        gradient_steps=np.arange(40),
        heldout=_blocks(H[40:]),
        heldout_steps=np.arange(40, 60),
        total_energy=float((H[:40] ** 2).sum()),
        sources={"spectrum": {"path": "spec.zarr"}, "collected": {"rows": [0, 40]}},
    )
    d = json.loads(json.dumps(a.to_dict(), allow_nan=False))
    assert d["format"] == spectrum.REPORT_FORMAT
    assert d["sources"]["spectrum"]["path"] == "spec.zarr"
    assert d["spectrum"]["fit_singular"]["c"] == pytest.approx(a.fit_singular.c)
    assert d["spectrum"]["fit_eigen"]["c"] == pytest.approx(2 * a.fit_singular.c)
    assert set(d["rows"]) == {"collected", "heldout"}
    held = d["rows"]["heldout"]
    assert held["G_k"]["ks"] == [0, 1, 2, 4, 8, 16, 32]
    assert held["G_k"]["source"] == {}
    assert d["rows"]["collected"]["G_k"]["source"] == {"rows": [0, 40]}
    assert set(held["bounds"]) == {"empirical", "population"}
    assert held["bounds"]["empirical"]["settings"]["dim"] == 80
    assert held["reconstruction_error_by_step"]["steps"] == list(range(40, 60))
    # The subspace explains less of the held-out rows than of the rows it was fitted to.
    ev_in = np.array(d["rows"]["collected"]["explained_variance"]["fraction"][1:])
    assert np.all(np.array(held["explained_variance"]["fraction"][1:]) < ev_in)
    assert DecayConfig.from_dict(d["config"]) == cfg
    assert any("in-sample" in n for n in d["notes"])
    assert "bound_heldout_empirical" in d["summary"]


def test_spectrum_only_and_errors(data):
    _, s, V = data
    a = analyze_spectrum(sigma=s)
    assert a.rows == {} and "spectrum_fit" in a.summary()
    with pytest.raises(ValueError, match="basis"):
        analyze_spectrum(sigma=s, gradients=[])
    with pytest.raises(ValueError, match="k_max"):
        analyze_spectrum(sigma=s, basis=V, config=DecayConfig(k_max=1000))
    with pytest.raises(ValueError, match="unknown decay settings"):
        DecayConfig.from_dict({"kmax": 3})
