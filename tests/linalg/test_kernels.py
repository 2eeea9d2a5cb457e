"""The symmetric block update against a dense float64 product."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec.linalg._kernels import block_edges, sym_finish, sym_update


@pytest.mark.parametrize("n,block_rows", [(1, 512), (7, 3), (40, 512), (1200, 512), (1000, 333)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sym_update_equals_dense(n, block_rows, dtype):
    rng = np.random.default_rng(n)
    panels = [rng.standard_normal((n, w)) for w in (5, 64, 17)]
    edges = block_edges(n, torch.device("cpu"), block_rows)
    assert edges[0] == 0 and edges[-1] == n and sorted(set(edges)) == edges
    g = torch.zeros(n, n, dtype=torch.float64)
    for a in panels:
        sym_update(g, torch.from_numpy(a).to(dtype), edges)
    got = sym_finish(g, edges)
    h = np.concatenate(panels, axis=1)
    if dtype == torch.float32:
        h = h.astype(np.float32).astype(np.float64)
    ref = h @ h.T
    np.testing.assert_allclose(got, ref, rtol=1e-12 if dtype == torch.float64 else 1e-5, atol=1e-9 if dtype == torch.float64 else 1e-3)
    np.testing.assert_array_equal(got, got.T)


def test_block_edges_split_large_matrices_on_cpu_only():
    assert len(block_edges(2000, torch.device("cpu"))) - 1 == 10
    assert block_edges(100, torch.device("cpu")) == [0, 100]
    assert block_edges(2000, torch.device("cuda")) == [0, 2000]
