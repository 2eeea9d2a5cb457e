"""G_k on generalised-geometric-median gradients follows λ_{k+1}(A^{1/2}) (Li et al. §4.1).

Per-example gradients of f_i(x) = ‖x − x_i‖_A are ∇f_i = A(x − x_i)/‖x − x_i‖_A = A^{1/2}u
with ‖u‖ = 1, so with P_k the top-k eigenvectors of A^{1/2},
‖(I − P_k)∇f_i‖ ≤ λ_{k+1}(A^{1/2}) (the closed form), with equality when u is the
(k+1)-th eigenvector.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec.spectrum import (
    fit_power_law,
    lipschitz_decay,
    project_rows,
    rank_grid,
    restricted_lipschitz,
)

geomedian = pytest.importorskip("gradspec.tasks.geomedian")


def _per_example_grads(a_diag: torch.Tensor, x: torch.Tensor, points: torch.Tensor) -> np.ndarray:
    """Rows ∇_x ‖x − x_i‖_A through the task's own module (autograd, one point at a time)."""
    model = geomedian.GeometricMedian(a_diag, eps=1e-9)
    with torch.no_grad():
        model.x.copy_(x)
    rows = []
    for pt in points:
        model.zero_grad()
        model(pt[None]).sum().backward()
        rows.append(model.x.grad.detach().double().clone())
    return torch.stack(rows).numpy()


def _blocks(H: np.ndarray, width: int = 16):
    return [(a, H[:, a : a + width]) for a in range(0, H.shape[1], width)]


@pytest.mark.parametrize("spectrum", ["sqrt", "linear"])
def test_G_k_matches_closed_form_with_axis_aligned_data(spectrum):
    """Data x_i = ±t·e_j and iterates x near 0 along a trajectory: G_k → λ_{k+1}(A^{1/2})."""
    d = 32
    a_diag = geomedian.A_DIAGONALS[spectrum](d)
    t = 10.0
    eye = torch.eye(d, dtype=torch.float32)
    points = torch.cat([t * eye, -t * eye])
    gen = torch.Generator().manual_seed(0)
    rows = []
    for step in range(3):  # iterates along a short trajectory towards the median (0)
        x = 0.05 * (3 - step) * torch.randn(d, generator=gen)
        rows.append(_per_example_grads(a_diag, x, points))
    H = np.concatenate(rows)
    V = np.linalg.svd(H, full_matrices=False)[2].T
    ks = rank_grid(d - 1, every=True)
    G = restricted_lipschitz(project_rows(_blocks(H), V, ks=ks, atol=1e-4))
    closed = np.array([geomedian.restricted_lipschitz_closed_form(a_diag, int(k)) for k in ks])
    # The iterates are not exactly 0 (|x| ≤ 0.15 ≪ t = 10) and V is fitted to the rows:
    # agreement within 3% of G_0 (float32 gradients).
    np.testing.assert_allclose(G.max, closed, atol=0.03 * closed[0])
    # The fitted decay of Ĝ_k is that of the closed form (k+1)^(−c), c = 1/4 or 1/2.
    dec = lipschitz_decay(G)
    assert dec.c == pytest.approx(fit_power_law(ks[1:], closed[1:]).c, abs=0.02)


def test_task_gradients_respect_the_closed_form_bound():
    """The task's own data: with P_k from A's eigenbasis, every gradient obeys G_k ≤ λ_{k+1}."""
    d = 24
    task = geomedian.geomedian_task(d=d, spectrum="linear", d_min=d, n_train=64, n_eval=8, seed=0)
    a_diag = geomedian.a_linear(d)
    pts = task.train.tensors["points"]
    gen = torch.Generator().manual_seed(1)
    H = np.concatenate(
        [_per_example_grads(a_diag, 0.5 * s * torch.randn(d, generator=gen), pts) for s in range(3)]
    )
    V = np.eye(d)  # A is diagonal with decreasing entries: its eigenvectors are e_1, e_2, ...
    ks = rank_grid(d, every=True)
    G = restricted_lipschitz(project_rows(_blocks(H), V, ks=ks))
    closed = np.array([geomedian.restricted_lipschitz_closed_form(a_diag, int(k)) for k in ks])
    assert np.all(G.max <= closed * (1 + 1e-5) + 1e-7)
    assert G.max[-1] == pytest.approx(0.0, abs=1e-6)
