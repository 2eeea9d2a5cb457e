"""Projectors against dense float64 references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec.optim import (
    FixedProjector,
    PublicProjector,
    RandomProjector,
    make_projector,
    top_eigenvectors_from_rows,
)
from gradspec.tasks.lowrank import row_space_basis

from ._cases import fake_run, lowrank_task, orthonormal, subspace_distance

CASES = [  # (m, p, k)
    pytest.param(12, 30, 4, id="m12-p30-k4"),
    pytest.param(5, 40, 5, id="full-rank-m"),
    pytest.param(40, 20, 7, id="m>p"),
]


@pytest.mark.parametrize(("m", "p", "k"), CASES)
def test_public_eigenvectors_match_dense_second_moment(m, p, k):
    g = torch.Generator().manual_seed(m * p + k)
    rows = torch.randn(m, p, generator=g, dtype=torch.float64) * torch.linspace(3, 0.1, p)
    lam, v = top_eigenvectors_from_rows(rows, k)
    dense = rows.T @ rows / m  # M = (1/m) sum g g^T, p x p (only in the test)
    ref_lam, ref_v = np.linalg.eigh(dense.numpy())
    ref_lam, ref_v = ref_lam[::-1][:k], ref_v[:, ::-1][:, :k]
    np.testing.assert_allclose(lam.numpy(), ref_lam, rtol=1e-6)
    assert subspace_distance(v, torch.from_numpy(ref_v.copy())) < 1e-6
    np.testing.assert_allclose((v.T @ v).numpy(), np.eye(k), atol=1e-10)


def test_rank_deficient_public_gradients_are_completed_orthonormally():
    rows = torch.randn(2, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    lam, v = top_eigenvectors_from_rows(rows, 4, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose((v.T @ v).numpy(), np.eye(4), atol=1e-10)
    assert lam[2:].abs().max() == 0
    # the two informative directions span the rows
    q, _ = torch.linalg.qr(rows.T)
    assert subspace_distance(v[:, :2], q) < 1e-8


def test_projection_equals_dense_projector():
    v = orthonormal(25, 6)
    proj = FixedProjector(v)
    proj.setup(fake_run(25))
    x = torch.randn(3, 25)
    dense = (v @ v.T).float()
    torch.testing.assert_close(proj.project(x), x @ dense.T, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(proj.project(x[0]), dense @ x[0], rtol=1e-5, atol=1e-6)


def test_fixed_projector_checks_orthonormality_and_size():
    with pytest.raises(ValueError, match="not orthonormal"):
        FixedProjector(torch.randn(10, 3))
    fixed = FixedProjector(torch.randn(10, 3), orthonormalize=True)
    with pytest.raises(ValueError, match="rows but the run trains 12"):
        fixed.setup(fake_run(12))
    with pytest.raises(ValueError, match="exceeds"):
        FixedProjector(orthonormal(10, 3), rank=4)


def test_random_projector_is_orthonormal_and_seeded():
    a, b = RandomProjector(5, seed=3), RandomProjector(5, seed=3)
    a.setup(fake_run(50))
    b.setup(fake_run(50))
    torch.testing.assert_close(a.basis, b.basis)
    torch.testing.assert_close(a.basis.T @ a.basis, torch.eye(5), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="seed"):
        RandomProjector(5, seed=4).load_state_dict(a.state_dict())


def test_public_projector_finds_the_lowrank_row_space():
    """On the lowrank task every gradient lies in the rank-r row space: k = r recovers it."""
    task = lowrank_task()
    with torch.no_grad():
        task.model.weight.normal_()  # away from w = 0, where all gradients are ~ -y x
    proj = PublicProjector(3, public_size=20, period=5)
    run = fake_run(16, task=task)
    proj.setup(run)
    assert proj.update(0, run)
    assert not proj.update(4, run)
    assert proj.update(5, run)
    assert subspace_distance(proj.basis, row_space_basis(task)) < 1e-4


def test_public_projector_state_round_trip():
    task = lowrank_task()
    run = fake_run(16, task=task)
    a = PublicProjector(2, public_size=10)
    a.setup(run)
    a.update(0, run)
    b = PublicProjector(2, public_size=10)
    b.setup(run)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a.basis, b.basis)
    assert b.last_update == 0
    with pytest.raises(ValueError, match="rank"):
        PublicProjector(3, public_size=10).load_state_dict(a.state_dict())


def test_make_projector_choices():
    with pytest.raises(ValueError, match="spectrum, public, random"):
        make_projector("pca", rank=2)
    with pytest.raises(ValueError, match="exactly one"):
        make_projector("spectrum", rank=2)
    assert isinstance(make_projector("spectrum", rank=2, basis=orthonormal(8, 3)), FixedProjector)


# ---------------------------------------------------------------- large bases (float32, in place)
@pytest.fixture
def small_large_basis(monkeypatch):
    """Make every basis above 2,000 entries "large", so the float32 path runs at test size."""
    import gradspec.optim._orthonormal as orthonormal
    import gradspec.optim._projectors as projectors

    monkeypatch.setattr(projectors, "LARGE_BASIS", 2_000)
    monkeypatch.setattr(orthonormal, "LARGE_BASIS", 2_000)
    monkeypatch.setattr(orthonormal, "_GRAM_ROWS", 64)  # several row blocks
    return projectors


def test_orthonormalize_in_place_keeps_nested_spans_against_float64_qr(small_large_basis):
    """Cholesky QR in float32 spans what float64 Householder QR spans, column prefix by prefix."""
    g = torch.Generator().manual_seed(0)
    p, k = 500, 12
    a = torch.randn(p, k, generator=g, dtype=torch.float64) @ torch.triu(torch.rand(k, k, generator=g) + 0.5).double()
    v = a.float().contiguous()
    ptr = v.data_ptr()
    err = small_large_basis.orthonormalize_(v)
    assert v.data_ptr() == ptr and v.dtype == torch.float32  # in place, no copy
    assert err <= 1e-5
    np.testing.assert_allclose((v.double().T @ v.double()).numpy(), np.eye(k), atol=2e-6)
    q, _ = torch.linalg.qr(a)
    for j in (1, 5, k):  # span of the first j columns is unchanged
        assert subspace_distance(v[:, :j].double(), q[:, :j]) < 1e-5
    with pytest.raises(ValueError, match="linearly dependent"):
        small_large_basis.orthonormalize_(torch.ones(p, 3))
    with pytest.raises(ValueError, match="tall"):
        small_large_basis.orthonormalize_(torch.randn(3, 5))
    with pytest.raises(ValueError, match="could not be orthonormalised"):  # float32 cannot reach 1e-12
        small_large_basis.orthonormalize_(a.float().contiguous(), tol=1e-12, max_passes=2)


def test_large_fixed_basis_stays_float32_and_projects_like_float64(small_large_basis):
    g = torch.Generator().manual_seed(1)
    p, k = 400, 9
    raw = torch.randn(p, k, generator=g)
    caller = raw.clone()
    proj = FixedProjector(caller, orthonormalize=True)
    assert torch.equal(caller, raw)  # copy=True (default) leaves the caller's tensor alone
    assert proj.describe()["dtype"] == "float32" and proj.orthonormality_error <= 1e-5
    proj.setup(fake_run(p))
    ref, _ = torch.linalg.qr(raw.double())
    x = torch.randn(3, p, generator=g)
    torch.testing.assert_close(proj.project(x).double(), x.double() @ ref @ ref.T, atol=1e-5, rtol=0)
    owned = raw.clone()
    FixedProjector(owned, orthonormalize=True, copy=False)
    assert not torch.equal(owned, raw)  # copy=False: orthonormalised in the caller's tensor
    with pytest.raises(ValueError, match="not orthonormal"):
        FixedProjector(raw)  # the check runs on the large path too
    same = FixedProjector(proj.basis.clone())  # checked, not changed
    assert same.state_dict()["fingerprint"] == proj.state_dict()["fingerprint"]


def test_large_random_basis_is_orthonormal_seeded_and_float32(small_large_basis):
    a, b = RandomProjector(8, seed=3), RandomProjector(8, seed=3)
    a.setup(fake_run(600))
    b.setup(fake_run(600))
    assert a.basis.dtype == torch.float32 and a.orthonormality_error <= 1e-5
    assert a.describe()["orthonormality_error"] == a.orthonormality_error
    torch.testing.assert_close(a.basis, b.basis)
    np.testing.assert_allclose((a.basis.double().T @ a.basis.double()).numpy(), np.eye(8), atol=2e-6)
    c = RandomProjector(8, seed=4)
    c.setup(fake_run(600))
    assert subspace_distance(a.basis.double(), c.basis.double()) > 0.5  # another seed, another subspace


def test_a_nearly_orthonormal_basis_is_made_a_contraction():
    """A user's basis within atol of orthonormal is orthonormalised, its span kept: V·Vᵀ must not
    lengthen a clipped sum, or the sensitivity C the accounting assumes fails (found by review:
    max |VᵀV − I| = 1e-3 at k = 100 lengthened a sum of norm 1 to 1.099, exit 0)."""
    from gradspec.optim import FixedProjector

    p, k = 400, 100
    q, _ = torch.linalg.qr(torch.randn(p, k, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    v = q @ (torch.eye(k, dtype=torch.float64) + 4.5e-4 * torch.ones(k, k, dtype=torch.float64))  # stretched along 1
    assert (v.T @ v - torch.eye(k, dtype=torch.float64)).abs().max() < 1e-3  # passes the check
    g = (v @ torch.ones(k, dtype=torch.float64))
    g = g / g.norm()  # the direction V·Vᵀ stretches most
    assert float((v @ (v.T @ g)).norm()) > 1.09  # what the basis as given would do
    proj = FixedProjector(v)
    basis = proj._source
    assert (basis.T @ basis - torch.eye(k, dtype=torch.float64)).abs().max() < 1e-12
    assert float((basis @ (basis.T @ g)).norm()) <= 1 + 1e-12
    # the same subspace: the given columns lie in the new span
    assert float((v - basis @ (basis.T @ v)).norm()) < 1e-10
    assert proj.describe()["orthonormality_error"] < 1e-12
    assert v.data_ptr() != basis.data_ptr()  # the caller's tensor is not changed


@pytest.mark.parametrize("task_name", ["lowrank", "ballglm"])
def test_a_random_projector_is_independent_of_a_task_seeded_alike(task_name):
    """A rank-1 random control drawn from Generator(seed) was the first row of the lowrank and
    ballglm tasks' data matrix at the same seed (found by review: 0.54–0.82 of its energy in the
    data's 5-dimensional row space, against ~0.05 for an independent direction)."""
    from gradspec.optim import RandomProjector
    from gradspec.tasks import make_task
    from gradspec.tasks.ballglm import ball_basis
    from gradspec.tasks.lowrank import row_space_basis

    d, r = 100, 5
    shares = []
    for seed in range(8):
        if task_name == "lowrank":
            task = make_task("lowrank", seed=seed, n=20, n_eval=10, d=d, r=r)
            b = row_space_basis(task)
        else:
            task = make_task("ballglm", seed=seed, n=20, n_eval=10, n_public=10, d=d, r=r)
            b = ball_basis(task)
        proj = RandomProjector(1, seed=seed)
        proj.setup(fake_run(d))
        v = proj.basis.double()[:, 0]
        shares.append(float((b.T @ v).norm() ** 2))
    assert np.mean(shares) < 0.2  # r / d = 0.05 on average for an independent direction
