"""PCA on a Dask cluster of worker *processes* that read the store's chunks themselves
(issue 24): equal to the local exact result, and the driver never holds H."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from gradspec.linalg import pca
from gradspec.store import SpectrumStore
from tests.linalg.test_store_backed import write_store

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, host="127.0.0.1")
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.mark.slow  # two worker processes and a 183 MiB store: ~30 s on 2 cores
def test_a_process_cluster_equals_the_local_exact_result_and_the_driver_never_loads_h(client, tmp_path):
    rng = np.random.default_rng(0)
    r, p, k = 48, 1_000_250, 6
    h = ((rng.standard_normal((r, 12)) * np.logspace(0, -2, 12)) @ rng.standard_normal((12, p))
         + 1e-3 * rng.standard_normal((r, p))).astype(np.float32)  # a decaying spectrum
    write_store(tmp_path / "g", h, rows_per_chunk=16, cols_per_chunk=16_384)
    local = pca(source=tmp_path / "g", k=k, method="gram", precision="float64")
    local32 = pca(source=tmp_path / "g", k=k, method="gram")  # float32 products, as on the workers
    # the workers open the store by its path: nothing of H is sent from the driver
    assert client.run(lambda: __import__("os").getpid()).keys().__len__() == 2
    tracemalloc.start()
    remote = pca(source=tmp_path / "g", k=k, method="gram", scheduler=client, out=tmp_path / "spec",
                 precision="float64")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    np.testing.assert_allclose(remote.sigma, local.sigma, rtol=1e-12)
    # the default (float32 products on the workers, the local path's choice for a float32 store):
    # equal to the local float32 run up to the rounding order of float32 GEMMs, which depends on
    # each process's thread count (~1e-8 here), and within the precision's stated error of exact
    remote32 = pca(source=tmp_path / "g", k=k, method="gram", scheduler=client)
    assert remote32.params["precision"] == local32.params["precision"] == "float32"
    np.testing.assert_allclose(remote32.sigma, local32.sigma, rtol=1e-7)
    np.testing.assert_allclose(remote32.sigma, local.sigma, rtol=1e-7)
    assert remote32.accuracy()["ok"]
    v = SpectrumStore.open(tmp_path / "spec").read_v().astype(np.float64)
    np.testing.assert_allclose(np.abs(np.sum(v * local.V.astype(np.float64), axis=0)), 1.0, atol=1e-6)
    # the driver's peak is O(r^2 + a chunk of V (8 MiB) and its copies), whatever p: under 48 MiB while
    # H is 183 MiB (the workers read it; the driver never does)
    assert h.nbytes > 3.5 * 48 * 2**20
    print(f"driver peak {peak / 2**20:.1f} MiB, H {h.nbytes / 2**20:.1f} MiB")
    assert peak < 48 * 2**20, f"driver peak {peak / 2**20:.1f} MiB vs H {h.nbytes / 2**20:.1f} MiB"
