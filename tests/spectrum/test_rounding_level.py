"""In-sample G_k at the rank of H is exactly 0 and computes as rounding noise (‖h‖² − Σσ²U²: a
difference of two numbers near ‖h‖²). That noise must not enter the power-law fit as a value:
with a float32 U it sat at ~2e-4·G_0, above the old fixed floor of 1e-6·G_0, and turned a
decay of k^-0.65 into k^-1.58 (exit 0). Both ways of measuring (from U and σ, and projecting
the rows onto V) report it as 0, say so in the notes, and fit the resolved ranks only."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.linalg import pca
from gradspec.spectrum import (
    DecayConfig,
    RowProjections,
    decay_analysis,
    fit_power_law,
    restricted_lipschitz,
    row_projections_from_svd,
)
from gradspec.spectrum._lipschitz import lipschitz_decay
from gradspec.spectrum._projection import unit_roundoff
from gradspec.store import META_FIELDS, GradientStore, ParamLayout, SpectrumStore

R, P = 12, 600


@pytest.fixture(scope="module")
def full_rank(tmp_path_factory):
    """12 float32 rows of a decaying spectrum; pca keeps all 12 directions (k = r = rank H)."""
    rng = np.random.default_rng(3)
    a = np.linalg.qr(rng.standard_normal((R, R)))[0] * np.arange(1, R + 1) ** -0.7
    h = (a @ np.linalg.qr(rng.standard_normal((P, R)))[0].T).astype(np.float32)
    meta = {name: np.zeros(R, dtype=dt) for name, dt in META_FIELDS.items()}
    meta["step"] = np.arange(R)
    tmp = tmp_path_factory.mktemp("rank")
    GradientStore.create(tmp / "g.zarr", layout=ParamLayout.from_shapes([("w", (P,))]),
                         rows_per_chunk=4, cols_per_chunk=128).append(h, meta)
    specs = {}
    for precision in ("float32", "float64"):
        specs[precision] = tmp / f"{precision}.zarr"
        pca(source=str(tmp / "g.zarr"), k=R, out=str(specs[precision]), method="gram", precision=precision,
            v_dtype=precision)
    return h.astype(np.float64), specs


def _reference(h):
    """max_i ‖(I − P_k)h_i‖ at k = 0..R from the float64 SVD of the stored rows."""
    _, _, vt = np.linalg.svd(h, full_matrices=False)
    return np.array([np.linalg.norm(h - h @ vt[:k].T @ vt[:k], axis=1).max() for k in range(R + 1)])


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("read_rows", [False, True], ids=["from-U-sigma", "projected"])
def test_the_rank_of_h_is_left_out_of_the_fit(full_rank, precision, read_rows):
    h, specs = full_rank
    cfg = DecayConfig(every_rank=True)
    rep = decay_analysis(spectrum=specs[precision], config=cfg, read_rows=read_rows).to_dict()
    g = rep["rows"]["collected"]["G_k"]
    ref = _reference(h)
    assert g["ks"] == list(range(R + 1))
    assert g["max"][-1] == 0.0 and g["unresolved"][-1] == R  # every row at k = r: rounding noise
    np.testing.assert_allclose(g["max"][:-1], ref[:-1], rtol=1e-4)  # below the rank: measured
    want = fit_power_law(np.arange(1, R), ref[1:R], quantity="G_k")
    got = rep["rows"]["collected"]["G_k_decay"]["fit"]
    assert got["k_max"] == R - 1 and got["n_points"] == R - 1
    assert got["c"] == pytest.approx(want.c, abs=1e-3)
    assert any(note.startswith("G_k on the collected rows at k = 12: every row's residual is at the rounding "
                               "level") for note in rep["notes"])


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_only_residuals_within_rounding_of_zero_are_zeroed(full_rank, precision):
    """Row by row: every zeroed residual is truly below 16·√u·‖h_i‖ (float64 SVD), and the
    others equal it to the spectrum's precision."""
    h, specs = full_rank
    spec = SpectrumStore.open(specs[precision])
    sq = np.einsum("ij,ij->i", h, h)
    proj = row_projections_from_svd(sq, spec.U, spec.sigma, np.arange(R + 1), unit_roundoff=unit_roundoff(precision))
    _, _, vt = np.linalg.svd(h, full_matrices=False)
    true = np.stack([np.linalg.norm(h - h @ vt[:k].T @ vt[:k], axis=1) for k in range(R + 1)], axis=1)
    flat = proj.unresolved()
    assert flat[:, -1].all() and flat.sum() < 2 * R
    assert np.all(true[flat] <= 16 * np.sqrt(unit_roundoff(precision)) * np.sqrt(sq)[:, None].repeat(R + 1, 1)[flat])
    np.testing.assert_allclose(proj.residual_norms()[~flat], true[~flat], rtol=1e-3 if precision == "float32" else 1e-8)


def test_a_resolved_residual_is_kept_however_small():
    """Only values at or below their own row's resolution are zeroed, and a fit keeps a small
    but resolved G_k (the fixed 1e-6·G_0 floor is not the only guard any more)."""
    ks = np.arange(5)
    sq = np.array([1.0, 4.0])
    resid = np.array([[1.0, 0.5, 0.1, 1e-9, 1e-12], [4.0, 1.0, 0.2, 4e-9, 1e-13]])
    proj = RowProjections(ks=ks, sq_norms=sq, residual_sq=resid, resolution_sq=np.array([1e-10, 4e-10]))
    G = restricted_lipschitz(proj)
    np.testing.assert_array_equal(G.unresolved, [0, 0, 0, 0, 2])
    np.testing.assert_allclose(G.max, np.sqrt([4.0, 1.0, 0.2, 4e-9, 0.0]))
    fit = lipschitz_decay(G).fit
    assert (fit.k_min, fit.k_max, fit.n_points) == (1, 3, 3)
    assert G.unresolved_ranks("max").tolist() == [4]
