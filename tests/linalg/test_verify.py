"""The cheap accuracy check (the default): honest on right answers, flags wrong ones.

Each corruption below is one that matters — a wrong Gram, a wrong column or lost
orthogonality of U or of V, float32 products that underflow — and the cheap report,
which costs far less than multiplying H by V again, must flag it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gradspec.linalg.gram as gram_mod
from gradspec.linalg import GradientOperator, _passes, pca
from gradspec.linalg._verify import CONFIDENCE, probe_factor
from tests.linalg.cases import Case


@pytest.fixture(scope="module")
def h() -> np.ndarray:
    return Case("p", r=60, p=900, k=10, spectrum="power").matrix()


def true_residuals(h: np.ndarray, res) -> np.ndarray:
    """‖H·v_i − σ_i·u_i‖/σ_i in float64 with the V as stored."""
    v = res.V.astype(np.float64)
    return np.linalg.norm(h.astype(np.float64) @ v - res.U * res.sigma, axis=0) / res.sigma


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("method", ["gram", "krylov", "orthogonal", "lanczos"])
def test_the_cheap_report_bounds_the_true_residuals(h, dtype, method):
    x = h.astype(dtype)
    kw = {"iters": 8} if method == "orthogonal" else {}
    res = pca(source=x, k=10, method=method, **kw)
    acc = res.accuracy()
    assert acc["check"] == "cheap" and acc["confidence"] == CONFIDENCE and acc["probes"] == 16
    assert acc["ok"] and acc["flags"] == {}
    true = true_residuals(x, res)
    # The bounds hold (probability 0.999, fixed seed) and are not vacuous: within a small factor
    # of the truth, or of the rounding the report says the products can add.
    assert np.all(res.residual_h >= true)
    assert np.all(res.residual_h <= 20 * true + acc["rounding"])
    assert acc["orthogonality_u"] < 1e-12
    if method == "gram":
        assert acc["gram_residual"] < 1e-12
    expect = np.sqrt(max(0.0, 1 - (res.sigma**2).sum() / (x.astype(np.float64) ** 2).sum()))
    assert res.reconstruction_error == pytest.approx(expect, abs=1e-7)


def test_full_and_none_say_what_ran(h):
    full = pca(source=h, k=10, verify="full").accuracy()
    assert full["check"] == "full" and full["confidence"] == 1.0 and full["ok"]
    none = pca(source=h, k=10, verify="none").accuracy()
    assert none["check"] == "none" and none["confidence"] is None and "flags" not in none
    assert pca(source=h, k=10, verify=False).accuracy()["check"] == "none"
    assert pca(source=h, k=10, verify=True).accuracy()["check"] == "cheap"
    with pytest.raises(ValueError, match="unknown verify mode 'some'; choose one of: cheap, full, none"):
        pca(source=h, k=3, verify="some")


def test_probe_factor_is_the_chi_square_quantile():
    from scipy.stats import chi2

    f = probe_factor(16, 500)
    assert chi2.cdf(16 / f**2, 16) == pytest.approx(1e-3 / 500)


# ----------------------------------------------------------------------- corruptions
def _corrupt_gram(monkeypatch, how):
    orig = GradientOperator.gram

    def gram(self):
        return how(orig(self).copy())

    monkeypatch.setattr(GradientOperator, "gram", gram)


def _wrong_gram_column(g):
    j = 3
    g[:, j] *= 1.5
    g[j, :] *= 1.5  # symmetric, so eigh sees it whichever triangle it reads
    return g


def _corrupt_u(monkeypatch, how):
    orig = gram_mod.gram_svd

    def gram_svd(op, k):
        u, sigma, timings, g = orig(op, k)
        return how(u.copy()), sigma, timings, g

    monkeypatch.setattr(gram_mod, "gram_svd", gram_svd)


def _wrong_u_column(u):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(u.shape[0])
    u[:, 2] = x / np.linalg.norm(x)
    return u


def _u_not_orthogonal(u):
    u[:, 1] = u[:, 1] + 0.05 * u[:, 0]
    u[:, 1] /= np.linalg.norm(u[:, 1])
    return u


def _corrupt_v(monkeypatch, how):
    orig = _passes.form_v

    def form_v(*args):
        out, vs = orig(*args)
        return out, how(vs)

    monkeypatch.setattr(_passes, "form_v", form_v)


def _swap_v_columns(vs):
    return vs[:, [0, 1, 3, 2, *range(4, vs.shape[1])]].contiguous()


def _v_not_orthogonal(vs):
    out = vs.clone()
    out[:, 1] = (vs[:, 1] + 0.1 * vs[:, 0]) / float(np.sqrt(1.01))
    return out


CORRUPTIONS = {
    "gram-wrong-column": (lambda mp: _corrupt_gram(mp, _wrong_gram_column), {"residual"}),
    "u-wrong-column": (lambda mp: _corrupt_u(mp, _wrong_u_column), {"residual", "orthogonality", "gram", "unit"}),
    "u-lost-orthogonality": (lambda mp: _corrupt_u(mp, _u_not_orthogonal), {"residual", "orthogonality", "gram"}),
    "v-wrong-column": (lambda mp: _corrupt_v(mp, _swap_v_columns), {"residual"}),
    "v-lost-orthogonality": (lambda mp: _corrupt_v(mp, _v_not_orthogonal), {"residual"}),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_the_cheap_report_flags_a_corrupted_answer(h, monkeypatch, corruption, dtype):
    inject, expected = CORRUPTIONS[corruption]
    x = h.astype(dtype)
    clean = pca(source=x, k=10, method="gram")
    assert clean.accuracy()["ok"]
    inject(monkeypatch)
    res = pca(source=x, k=10, method="gram")
    acc = res.accuracy()
    assert acc["check"] == "cheap" and not acc["ok"]
    assert expected <= set(acc["flags"]), acc["flags"]
    assert acc["max_residual"] > 1e-2
    # The full product agrees that the answer is wrong: the probes do not cry wolf.
    assert true_residuals(x, res).max() > 1e-2


def test_the_cheap_report_flags_float32_underflow(h):
    """At 1e-21·H the float32 Gram's products fall into the subnormal range."""
    tiny = (h * 1e-21).astype(np.float32)
    res = pca(source=tiny, k=10, method="gram")
    acc = res.accuracy()
    assert not acc["ok"] and "underflow" in acc["flags"] and acc["underflow"] > 1
    assert "--precision float64" in acc["flags"]["underflow"]
    fixed = pca(source=tiny, k=10, method="gram", precision="float64").accuracy()
    assert fixed["ok"] and fixed["underflow"] == 0.0
    # Well inside float32's range the same matrix raises nothing.
    assert pca(source=(h * 1e-15).astype(np.float32), k=10).accuracy()["ok"]


def test_the_probes_see_the_v_actually_stored(h, monkeypatch):
    """float64 products, V stored in float32: the rounding Δ is in ‖Hᵀu − σv‖ and the probes."""
    res = pca(source=h, k=10, precision="float64", v_dtype="float32")
    assert res.accuracy()["ok"] and res.residual_ht.max() > 0
    assert np.all(res.residual_h >= true_residuals(h, res))


def test_the_cheap_check_rides_in_the_gemm_that_forms_v(monkeypatch):
    """Counted, not timed: the probes are s = 16 more columns of the one GEMM per panel that
    forms V (no second read of the panel), then an s×k product: s(r + k) against rk."""
    r, k = 200, 100
    seen = []
    orig = _passes.form_v

    def spy(y, p, v_dtype, kk=None):
        seen.append((y.shape, kk))
        return orig(y, p, v_dtype, kk)

    monkeypatch.setattr(_passes, "form_v", spy)
    op = GradientOperator(np.random.default_rng(0).standard_normal((r, 50)))
    stats = op.project(np.eye(r)[:, :k], np.ones(k), lambda o, b: None, verify="cheap")
    assert seen == [((r, k + 16), k)] and stats["probe"].shape == (16, k)
    assert 16 * (r + k) < 0.25 * r * k
    seen.clear()
    op.project(np.eye(r)[:, :k], np.ones(k), lambda o, b: None, verify="none")
    assert seen == [((r, k), k)]


def test_dask_backend_runs_the_cheap_check(h):
    distributed = pytest.importorskip("distributed")
    import dask.array as da

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        res = pca(source=da.from_array(h, chunks=(60, 300)), k=10, scheduler=client, v_dtype="float64")
    acc = res.accuracy()
    assert acc["check"] == "cheap" and acc["ok"]
    assert np.all(res.residual_h >= true_residuals(h, res))


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_cheap_check_on_each_device(h, device):
    res = pca(source=h.astype(np.float32), k=10, device=device)
    assert res.accuracy()["ok"]


# ------------------------------------------------------------- residual_ht, measured
@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A float32 and a bfloat16 gradient store of one matrix (r = 64, p = 6,000, four column
    chunks, so several panels): {dtype: (path, H as stored, in float64)}."""
    from gradspec.store import META_FIELDS, GradientStore, ParamLayout

    h = Case("ht", r=64, p=6000, k=12, spectrum="power", seed=5).matrix() * 1e-2
    out = {}
    for dtype in ("float32", "bfloat16"):
        path = tmp_path_factory.mktemp(dtype) / "g.zarr"
        store = GradientStore.create(path, layout=ParamLayout.from_shapes([("w", (6000,))]), dtype=dtype,
                                     rows_per_chunk=32, cols_per_chunk=1536)
        store.write_rows(0, h.astype(np.float32), {f: np.arange(64) for f in META_FIELDS})
        store.commit(64)
        out[dtype] = path, GradientStore.open(path).read().astype(np.float64)
    return out


def true_residual_ht(h64: np.ndarray, spec) -> np.ndarray:
    """‖Hᵀ·u_i − σ_i·v_i‖/σ_i in float64 from what the spectrum store holds (V widened exactly)."""
    return np.linalg.norm(h64.T @ spec.U - spec.read_v().astype(np.float64) * spec.sigma, axis=0) / spec.sigma


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("verify", ["cheap", "full"])
def test_the_stored_residual_ht_is_measured_not_assumed(stores, tmp_path, dtype, verify):
    """The stored ‖Hᵀu_i − σ_i·v_i‖/σ_i against its float64 truth. It used to count only V's
    storage rounding and σ's refinement, not the float32 arithmetic that formed V: 5e-9 where
    the truth was 3.5e-7 (up to 1e5× too small). The cheap check's p-side probes give an upper
    bound at the stated joint confidence and within the estimator's stated spread of the truth
    (a χ²_s quantile: at most ~5x for s = 16, k = 12); the full check measures it."""
    from scipy.stats import chi2

    from gradspec.store import SpectrumStore

    path, h64 = stores[dtype]
    res = pca(source=path, k=12, out=tmp_path / "s.zarr", verify=verify)
    spec = SpectrumStore.open(tmp_path / "s.zarr")
    true = true_residual_ht(h64, spec)
    stored = spec.array("residual_ht")
    assert true.min() > 1e-8  # the float32 arithmetic that formed V: what is to be measured
    acc = spec.accuracy
    if verify == "cheap":
        s, k = acc["probes"], res.k
        spread = probe_factor(s, k) * np.sqrt(chi2.ppf(1 - (1 - CONFIDENCE) / k, s) / s)
        assert np.all(stored >= true) and np.all(stored <= spread * true), stored / true
        assert acc["residual_ht_check"] == "bound: 16 Gaussian probes of Hᵀ·U − V·Σ in float64"
    else:
        np.testing.assert_allclose(stored, true, rtol=1e-6)
        assert acc["residual_ht_check"] == "measured: Hᵀ·U in float64"
        # The full check's H·V is a float64 product too: residual_h is the truth as well.
        h_true = np.linalg.norm(h64 @ spec.read_v().astype(np.float64) - spec.U * spec.sigma, axis=0) / spec.sigma
        np.testing.assert_allclose(spec.array("residual_h"), h_true, rtol=1e-6)
    np.testing.assert_array_equal(spec.array("residuals"),
                                  np.sqrt(spec.array("residual_h") ** 2 + stored**2))


def test_with_float64_products_residual_ht_is_the_measured_rounding_of_v(stores, tmp_path):
    path, h64 = stores["float32"]
    pca(source=path, k=12, out=tmp_path / "s.zarr", precision="float64")
    from gradspec.store import SpectrumStore

    spec = SpectrumStore.open(tmp_path / "s.zarr")
    assert spec.accuracy["residual_ht_check"].startswith("measured: the rounding of V")
    np.testing.assert_allclose(spec.array("residual_ht"), true_residual_ht(h64, spec), rtol=1e-6)


def test_without_a_check_residual_ht_is_not_measured_and_says_so(h):
    res = pca(source=h.astype(np.float32), k=10, verify="none")
    assert np.isnan(res.residual_ht).all() and res.accuracy()["residual_ht_check"] is None
    assert "residual_ht not measured" in res.accuracy()["check_text"]


def test_a_columns_p_side_probes_do_not_depend_on_the_panels():
    whole = _passes.panel_gaussians(3, 0, 5000, 16)
    assert whole.shape == (5000, 16) and whole.dtype == torch.float32
    for col, w in ((0, 1), (1000, 500), (1023, 2), (2047, 1500), (4999, 1)):
        torch.testing.assert_close(_passes.panel_gaussians(3, col, w, 16), whole[col : col + w], rtol=0, atol=0)
    assert not torch.equal(_passes.panel_gaussians(4, 0, 5000, 16), whole)


def test_the_p_side_probes_are_the_same_on_dask_blocks(h):
    """Each column draws its probes by its index in H: a Dask worker, which sees only its
    block, sums the same Gᵀ·Hᵀ and Gᵀ·V_s as the local pass (blocks drawing the same probes
    would make them differ), and the bounds hold."""
    distributed = pytest.importorskip("distributed")
    import dask.array as da

    from gradspec.linalg._dask import DaskGradientOperator

    x = h.astype(np.float32)
    u, sig, _ = np.linalg.svd(x.astype(np.float64), full_matrices=False)
    u, sig = u[:, :10], sig[:10]
    local = GradientOperator(x).project(u, sig, lambda o, b: None, verify="cheap", seed=2)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        op = DaskGradientOperator(da.from_array(x, chunks=(60, 300)), scheduler=client)
        remote = op.project(u, sig, lambda o, b: None, verify="cheap", seed=2)
        res = pca(source=da.from_array(x, chunks=(60, 300)), k=10, scheduler=client)
    for key in ("probe_ht", "probe_ht_v"):
        np.testing.assert_allclose(remote[key], local[key], rtol=1e-9, atol=1e-12)
    true = np.linalg.norm(x.T.astype(np.float64) @ res.U - res.V.astype(np.float64) * res.sigma, axis=0) / res.sigma
    assert np.all(res.residual_ht >= true) and np.all(res.residual_ht <= 6 * true)


@pytest.mark.parametrize("method", ["gram", "krylov"])
@pytest.mark.parametrize("verify", ["cheap", "full"])
def test_centred_rows_about_a_large_mean_report_their_true_residuals(h, method, verify):
    """--center with float32 products on rows that vary little about a large mean: the panel is
    centred in float64 and rounded once (found by review: centred in float32, the means'
    rounding swamped the rows; max residual 1e-6 reported where the true one was 8.6e-4, also
    with the full check, which measured the rounded matrix)."""
    x = (30.0 + 1e-3 * h / np.abs(h).max()).astype(np.float32)
    kw = {"iters": 3} if method == "krylov" else {}
    res = pca(source=x, k=6, method=method, center=True, verify=verify, precision="float32", **kw)
    c = x.astype(np.float64) - x.astype(np.float64).mean(axis=0)
    true = true_residuals(c, res)
    assert np.all(res.residual_h >= true * (1 - 1e-9)), (res.residual_h, true)  # full: measured exactly
    assert true.max() < 1e-5  # and the spectrum is right, not merely its report honest
    ref = np.linalg.svd(c, compute_uv=False)[:6]
    np.testing.assert_allclose(res.sigma, ref, rtol=1e-5)
