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


def test_dask_over_gradient_store(client, h, tmp_path):
    write_store(tmp_path / "g", h)
    local = pca(source=tmp_path / "g", k=5, method="gram", params="enc.*", precision="float64")
    remote = pca(
        source=tmp_path / "g",
        k=5,
        method="gram",
        params="enc.*",
        scheduler=client,
        out=tmp_path / "spec",
    )
    np.testing.assert_allclose(remote.sigma, local.sigma, rtol=1e-10)
    from gradspec.store._spectrum import SpectrumStore

    np.testing.assert_allclose(SpectrumStore.open(tmp_path / "spec").read_v(), local.V, atol=1e-6)


def test_bad_scheduler():
    from gradspec.linalg._dask import connect

    with pytest.raises(ValueError, match="cannot reach the dask scheduler"):
        connect("tcp://127.0.0.1:1", timeout="1s")
    with pytest.raises(TypeError, match="address string or a dask Client"):
        connect(42)
