"""Every method against numpy.linalg.svd in float64 on matrices with known spectra.

Tolerances (σ relative; vectors by the largest principal angle of the top-k subspace):
- gram (exact, float64 Gram): rtol 1e-6 on σ, angle < 1e-6.
- lanczos (scipy svds, reference): rtol 1e-6, angle < 1e-6.
- krylov (depth 4, oversample 10): rtol 1e-6, angle < 1e-5 on these cases.
- orthogonal: its convergence budget depends on the gap σ_{k+b}/σ_k; with
  oversample 10 and 30 iterations: rtol 1e-6 and angle < 1e-4; the paper's
  10 iterations on the σ_i = i^-0.6 decay: rtol 1e-3 (see test below).
"""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.linalg import GradientOperator, choose_method, pca, sign_fix
from gradspec.linalg._result import rank_rtol
from tests.linalg.cases import Case, max_principal_angle

METHODS = {
    "gram": ({}, 1e-6, 1e-6),
    "lanczos": ({}, 1e-6, 1e-6),
    "krylov": ({"iters": 4}, 1e-6, 1e-5),
    "orthogonal": ({"iters": 30}, 1e-6, 1e-4),
}


@pytest.mark.parametrize("method", list(METHODS))
def test_against_numpy_svd(dense, method):
    case, h, u, s, vt = dense
    kw, rtol, angle = METHODS[method]
    k = case.k
    res = pca(source=h, k=k, method=method, v_dtype="float64", **kw)
    np.testing.assert_allclose(res.sigma, s[:k], rtol=rtol, atol=1e-9 * s[0])
    assert np.all(np.diff(res.sigma) <= 1e-12 * s[0]), "sigma must be descending"
    rank = int((s[:k] > 1e-8 * s[0]).sum())
    assert max_principal_angle(res.U[:, :rank], u[:, :rank]) < angle
    assert max_principal_angle(res.V[:, :rank], vt[:rank].T) < angle
    # The accuracy report is what it says: residuals small, errors from σ.
    assert res.residuals.max() < 1e-4 if method != "orthogonal" else res.residuals.max() < 1e-3
    expect = np.sqrt(max(0.0, 1 - (s[:k] ** 2).sum() / (s**2).sum()))
    assert res.reconstruction_error == pytest.approx(expect, abs=1e-6)
    np.testing.assert_allclose(
        res.cumulative_explained_variance[-1], (s[:k] ** 2).sum() / (s**2).sum(), rtol=1e-6
    )


def test_sign_convention_and_consistency(dense):
    case, h, *_ = dense
    res = pca(source=h, k=case.k, method="gram", v_dtype="float64")
    idx = np.argmax(np.abs(res.U), axis=0)
    assert np.all(res.U[idx, np.arange(case.k)] >= 0)
    np.testing.assert_array_equal(sign_fix(res.U), res.U)
    rank = int((res.sigma > 0).sum())
    np.testing.assert_allclose(h @ res.V[:, :rank], res.U[:, :rank] * res.sigma[:rank], atol=1e-9)


def test_methods_agree_on_signs():
    h = Case("power", r=50, p=300, k=5, spectrum="steep").matrix()
    results = [
        pca(source=h, k=5, method=m, v_dtype="float64") for m in ("gram", "krylov", "lanczos")
    ]
    for res in results[1:]:
        np.testing.assert_allclose(res.U, results[0].U, atol=1e-6)


def test_orthogonal_convergence_budget_paper_protocol(caplog):
    """The paper's 10 iterations on σ_i ∝ i^-0.6 (r=120, k=20): σ within 1e-3, logged per iteration."""
    case = Case("power-paper", r=120, p=500, k=20, spectrum="power", seed=5)
    h = case.matrix()
    s = case.singular_values()
    with caplog.at_level("INFO", logger="gradspec.linalg.orthogonal"):
        res = pca(source=h, k=20, method="orthogonal", iters=10)
    np.testing.assert_allclose(res.sigma, s[:20], rtol=1e-3)
    assert len(res.history) == 10 and res.passes == 11
    assert sum("iteration" in r.message for r in caplog.records) == 10
    assert res.history[-1]["max_residual"] < res.history[0]["max_residual"]


def test_orthogonal_tol_stops_early():
    h = Case("steep", r=60, p=300, k=5, spectrum="steep").matrix()
    res = pca(source=h, k=5, method="orthogonal", iters=100, tol=1e-8)
    assert res.params["converged"] and len(res.history) < 100
    assert res.residual_h.max() < 1e-6


def test_deterministic_given_seed():
    h = Case("power", r=70, p=300, k=8, spectrum="power").matrix()
    a = pca(source=h, k=8, method="krylov", seed=3)
    b = pca(source=h, k=8, method="krylov", seed=3)
    np.testing.assert_array_equal(a.sigma, b.sigma)
    np.testing.assert_array_equal(a.V, b.V)


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("method", ["gram", "krylov", "orthogonal"])
def test_k_beyond_numerical_rank_keeps_only_resolved_directions(method, precision):
    """Directions below what the precision resolves are not stored (before: zero or noise columns).

    In float32 the null directions of a rank-8 H came out as σ ≈ 2e-4·σ_1 with ‖v‖ ≈ 1e-4 and
    no warning; in float64 as zero columns that `gradspec decay` then refused.
    """
    h = Case("lr", r=30, p=200, k=8, spectrum="lowrank").matrix()
    res = pca(source=h, k=12, method=method, precision=precision)
    assert res.k == 8 and res.rank == 8 and res.V.shape == (200, 8)
    assert res.params["k_requested"] == 12 and res.params["k"] == 8
    assert "sigma_9" in res.params["k_reason"]
    assert res.params["rank_rtol"] == pytest.approx(rank_rtol(30, precision))
    np.testing.assert_allclose(res.V.T.astype(float) @ res.V, np.eye(8), atol=1e-5)
    ref = np.linalg.svd(h, compute_uv=False)[:8]
    np.testing.assert_allclose(res.sigma, ref, rtol=1e-5)


def test_float32_data_and_precision():
    """float32 panels with float64 accumulation: σ within 1e-5 on a moderately conditioned H."""
    case = Case("steep", r=80, p=2000, k=10, spectrum="power")
    h = case.matrix().astype(np.float32)
    ref = np.linalg.svd(h.astype(np.float64), compute_uv=False)[:10]
    res = pca(source=h, k=10, method="gram", precision="float32")
    np.testing.assert_allclose(res.sigma, ref, rtol=1e-5)


def test_auto_says_what_it_chose(caplog):
    h = np.random.default_rng(0).standard_normal((40, 300))
    with caplog.at_level("INFO", logger="gradspec.linalg.api"):
        res = pca(source=h, k=4)
    assert (
        res.method == "gram"
        and "exact Gram" in res.params["reason"]
        and "method gram" in caplog.text
    )
    method, why = choose_method(r=5000, p=10**6, k=100, memory=200 * 2**20)
    assert method == "krylov" and "Gram needs 572 MiB" in why  # sizes in their unit (was "0.56 GiB")
    method, why = choose_method(r=50_000, p=10**6, k=100, memory=64 * 2**30)
    assert method == "krylov" and "r exceeds" in why


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"k": 41}, r"k=41 exceeds min\(r, p\) = 40"),
        ({"k": 0}, "positive integer"),
        ({"k": 3, "method": "svd"}, "unknown PCA method 'svd'; choose one of: auto, gram"),
        ({"k": 40, "method": "lanczos"}, "lanczos .* needs k < min"),
        ({"k": 3, "rows": slice(50, 60)}, "--rows 50:60 lies outside the 40 committed rows"),
        ({"k": 3, "rows": slice(20, 60)}, "--rows 20:60 lies outside the 40 committed rows"),
        ({"k": 3, "rows": slice(10, 10)}, "selects no rows of the 40"),
        ({"k": 3, "method": "gram", "iters": 5}, "gram .* does not use --iters"),
        ({"k": 3, "iters": 40}, r"method gram \(chosen by --method auto\) does not use --iters \(--iters is "
         r"used by orthogonal, krylov\); drop it or choose a method that uses it"),
        ({"k": 3, "tol": 1e-6}, r"method gram \(chosen by --method auto\) does not use --tol"),
        ({"k": 3, "method": "krylov", "tol": 1e-6}, "krylov .* does not use --tol"),
        ({"k": 3, "scheduler": "tcp://nowhere:1", "precision": "tf32"},
         "precision 'tf32' needs a CUDA device"),
        ({"k": 3, "scheduler": "tcp://nowhere:1", "kernel": "blas"}, "unknown Gram kernel 'blas'"),
        ({"k": 3, "resume": True}, "--resume needs --out"),
        ({"k": 3, "memory": "lots"}, "not a size"),
        ({"k": 3, "method": "orthogonal", "iters": 0}, "iters must be >= 1"),
        ({"k": 3, "memory": 10}, "too little memory"),
        ({"k": 3, "memory": 30_000, "method": "gram"}, "too little memory for --method gram: .* use --method krylov"),
        ({"k": 3, "kernel": "blas"}, "unknown Gram kernel 'blas'; choose one of: auto, numpy-syrk"),
        ({"k": 3, "verify": "quick"}, "unknown verify mode 'quick'; choose one of: cheap, full, none"),
    ],
    ids=[
        "k>min",
        "k=0",
        "method",
        "lanczos-k",
        "rows-beyond",
        "rows-clipped",
        "empty-rows",
        "gram-iters",
        "auto-gram-iters",
        "auto-gram-tol",
        "krylov-tol",
        "dask-tf32",
        "dask-kernel",
        "resume-no-out",
        "memory-str",
        "iters",
        "memory",
        "memory-gram",
        "kernel",
        "verify",
    ],
)
def test_bad_input_is_one_line(kw, match):
    h = np.random.default_rng(0).standard_normal((40, 300))
    with pytest.raises(ValueError, match=match) as err:
        pca(source=h, **kw)
    assert "\n" not in str(err.value)


def test_nan_in_h():
    h = np.random.default_rng(0).standard_normal((20, 100))
    h[4, 9] = np.inf
    with pytest.raises(ValueError, match="row 4"):
        pca(source=h, k=2, method="gram")


def test_auto_precision_on_float32_data_refines_sigma():
    """float32 data: ``auto`` takes float32 products (float64 sums) and refines σ by the Rayleigh
    quotient ‖Hᵀu‖; σ then beats the float32 Gram's own eigenvalues against a float64 SVD."""
    rng = np.random.default_rng(0)
    r, p, k = 200, 40000, 60
    u, _ = np.linalg.qr(rng.standard_normal((r, r)))
    h = ((u * np.arange(1, r + 1) ** -0.6) @ rng.standard_normal((r, p)) / np.sqrt(p)).astype(
        np.float32
    )
    ref = np.linalg.svd(h.astype(np.float64), compute_uv=False)[:k]
    res = pca(source=h, k=k)
    assert res.params["precision"] == "float32" and "rayleigh" in res.params["sigma_refined"]
    err = np.max(np.abs(res.sigma - ref) / ref)
    gram_only = np.sqrt(np.linalg.eigvalsh(GradientOperator(h).gram())[::-1][:k])
    assert err < 2e-8 and err < 0.5 * np.max(np.abs(gram_only - ref) / ref)
    assert np.all(np.diff(res.sigma) <= 0)
    # The stored V is Hᵀu/σ_gram: unit to float32 rounding, its residual against the refined σ says so.
    np.testing.assert_allclose(np.linalg.norm(res.V.astype(np.float64), axis=0), 1, atol=1e-6)
    assert res.residuals.max() < 1e-5
    f64 = pca(source=h, k=k, precision="float64")
    assert f64.params["precision"] == "float64" and "sigma_refined" not in f64.params
    np.testing.assert_allclose(f64.sigma, ref, rtol=1e-12)
