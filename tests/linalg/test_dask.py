"""The Dask backend equals the local engine (LocalCluster, in-process, one worker)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from gradspec.linalg import pca
from gradspec.linalg._dask import DaskGradientOperator
from tests.linalg.cases import Case
from tests.linalg.test_store_backed import write_store

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    )
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def h():
    return Case("power", r=40, p=600, k=6, spectrum="power").matrix()


def test_products(client, h):
    op = DaskGradientOperator(
        da.from_array(h, chunks=(20, 128)),
        scheduler=client,
        rows=slice(2, 38),
        col_ranges=[(0, 100), (300, 600)],
    )
    ref = np.concatenate([h[2:38, :100], h[2:38, 300:]], axis=1)
    q = np.random.default_rng(0).standard_normal((36, 3))
    np.testing.assert_allclose(op.gram(), ref @ ref.T, atol=1e-10)
    np.testing.assert_allclose(op.hht(q), ref @ ref.T @ q, atol=1e-9)
    np.testing.assert_allclose(op.rmatmat(q), ref.T @ q, atol=1e-10)
    np.testing.assert_allclose(op.frob2, (ref**2).sum(), rtol=1e-12)


@pytest.mark.parametrize("method", ["gram", "krylov", "orthogonal"])
def test_dask_equals_local(client, h, method):
    kw = {"iters": 3} if method == "orthogonal" else {}
    local = pca(source=h, k=6, method=method, center=True, v_dtype="float64", **kw)
    remote = pca(
        source=da.from_array(h, chunks=(40, 100)),
        k=6,
        method=method,
        center=True,
        scheduler=client,
        v_dtype="float64",
        **kw,
    )
    np.testing.assert_allclose(remote.sigma, local.sigma, rtol=1e-10)
    np.testing.assert_allclose(remote.V, local.V, atol=1e-8)
    assert remote.reconstruction_error == pytest.approx(local.reconstruction_error, abs=1e-9)


@pytest.mark.parametrize("precision", ["auto", "float64"])
def test_dask_over_gradient_store(client, h, tmp_path, precision):
    """The workers run the local engine on each block: the same precision (auto: float32
    products for a float32 store, σ refined) gives the local result — to float64 rounding in
    float64; in float32 up to the rounding order of float32 GEMMs (thread counts may differ)."""
    write_store(tmp_path / "g", h)
    kw = {"k": 5, "method": "gram", "params": "enc.*", "precision": precision}
    local = pca(source=tmp_path / "g", **kw)
    remote = pca(source=tmp_path / "g", scheduler=client, out=tmp_path / "spec", **kw)
    assert remote.params["precision"] == local.params["precision"] == (
        "float32" if precision == "auto" else "float64")
    np.testing.assert_allclose(remote.sigma, local.sigma, rtol=1e-12 if precision == "float64" else 1e-7)
    from gradspec.store._spectrum import SpectrumStore

    v = SpectrumStore.open(tmp_path / "spec").read_v()
    np.testing.assert_allclose(np.abs(np.sum(v * local.V, axis=0)), 1.0, atol=1e-6)
    assert remote.accuracy()["ok"]


def test_float32_blocks_against_a_float64_reference(client):
    """float32 products on the workers (float64 sums across blocks) against a dense float64 SVD."""
    h = Case("power", r=60, p=5000, k=8, spectrum="power").matrix().astype(np.float32)
    ref = np.linalg.svd(h.astype(np.float64), compute_uv=False)[:8]
    res = pca(source=da.from_array(h, chunks=(60, 700)), k=8, method="gram", scheduler=client)
    assert res.params["precision"] == "float32"
    np.testing.assert_allclose(res.sigma, ref, rtol=1e-7)
    assert res.accuracy()["ok"]


@pytest.mark.parametrize("kernel", ["numpy-syrk", "scipy-syrk", "torch-blocked", "torch-gemm"])
def test_a_named_kernel_runs_on_the_workers(client, kernel):
    h = Case("power", r=30, p=900, k=4, spectrum="power").matrix()
    op = DaskGradientOperator(da.from_array(h, chunks=(30, 200)), scheduler=client, kernel=kernel)
    np.testing.assert_allclose(op.gram(), h @ h.T, rtol=1e-12, atol=1e-12)
    assert op.kernel_choice == (kernel, "as requested")
    assert op.pass_log[-1]["pass"] == "gram" and op.pass_log[-1]["gflops"] > 0


def test_nan_rows_are_named_by_the_workers(client):
    h = Case("power", r=20, p=400, k=4, spectrum="power").matrix()
    h[7, 333] = np.nan
    op = DaskGradientOperator(da.from_array(h, chunks=(20, 100)), scheduler=client)
    with pytest.raises(ValueError, match="NaN or inf in 1 selected row"):
        op.gram()


def test_bad_scheduler():
    from gradspec.linalg._dask import connect

    with pytest.raises(ValueError, match="cannot reach the dask scheduler"):
        connect("tcp://127.0.0.1:1", timeout="1s")
    with pytest.raises(TypeError, match="address string or a dask Client"):
        connect(42)
