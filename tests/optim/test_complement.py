"""Retraining in the orthogonal complement of a subspace (``complement``; Song, Ahn & Yun 2025):
``I - V V^T`` against a dense float64 reference, the hooks' step pieces, and what training
in the complement of the lowrank task's gradient row space does."""

from __future__ import annotations

import pytest
import torch

from gradspec.collect import collect
from gradspec.optim import (
    ComplementRetrain,
    FixedProjector,
    RandomProjector,
    SubspaceRetrain,
    make_algorithm,
)
from gradspec.privacy import gaussian_noise
from gradspec.tasks.lowrank import row_space_basis

from ._cases import LOWRANK, config, fake_run, lowrank_task, orthonormal

CASES = [  # (p, k): the removed subspace's rank k of p
    pytest.param(12, 4, id="p12-k4"),
    pytest.param(40, 1, id="p40-k1"),
    pytest.param(30, 29, id="p30-k29"),
]


def _dense(p: int, k: int, seed: int = 0) -> tuple[FixedProjector, torch.Tensor, torch.Tensor]:
    """A projector in float64 (the run's parameters are float64), its V and I - V V^T dense."""
    v = orthonormal(p, k, seed)
    proj = FixedProjector(v)
    proj.setup(fake_run(p, params=(torch.zeros(p, dtype=torch.float64),)))
    return proj, v, torch.eye(p, dtype=torch.float64) - v @ v.T


@pytest.mark.parametrize(("p", "k"), CASES)
def test_project_out_is_the_dense_complement_projector(p, k):
    proj, v, q = _dense(p, k)
    x = torch.randn(5, p, generator=torch.Generator().manual_seed(p + k), dtype=torch.float64) * 3
    out = proj.project_out(x)
    torch.testing.assert_close(out, x @ q.T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(proj.project_out(x[0]), q @ x[0], rtol=1e-12, atol=1e-12)
    # idempotent, orthogonal to V, and the two parts add up to x
    torch.testing.assert_close(proj.project_out(out), out, rtol=1e-12, atol=1e-12)
    assert float((out @ v).abs().max()) < 1e-12 * float(x.abs().max())
    torch.testing.assert_close(proj.project(x) + out, x, rtol=1e-12, atol=1e-12)
    assert float((proj.project(x) * out).sum(1).abs().max()) < 1e-11  # the parts are orthogonal


def test_project_out_in_float32_keeps_the_input_dtype():
    v = orthonormal(25, 6)
    proj = FixedProjector(v)
    proj.setup(fake_run(25))  # float32 parameters: the basis is moved to float32
    x = torch.randn(3, 25)
    out = proj.project_out(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), x.double() @ (torch.eye(25, dtype=torch.float64) - v @ v.T),
                               rtol=1e-5, atol=1e-6)


def test_complement_projects_the_clipped_sum_out_before_noise_and_keeps_full_noise():
    p, k = 12, 4
    _, v, q = _dense(p, k)
    hooks = ComplementRetrain(FixedProjector(v))
    hooks.setup(fake_run(p))
    total = torch.randn(p)
    torch.testing.assert_close(hooks.before_noise(total).double(), q @ total.double(), rtol=1e-5, atol=1e-6)
    assert hooks.after_noise(total) is total  # nothing after the noise, as subspace retraining
    inside = SubspaceRetrain(FixedProjector(v))
    inside.setup(fake_run(p))
    torch.testing.assert_close(inside.before_noise(total) + hooks.before_noise(total), total,
                               rtol=1e-5, atol=1e-6)
    # full noise: exactly DP-SGD's draw (the one noise function)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    torch.testing.assert_close(hooks.noise(p, 2.0, g1, torch.device("cpu")),
                               gaussian_noise((p,), 2.0, generator=g2))
    # the release moves by at most C when one clipped row (norm <= C) leaves the sum
    row = torch.randn(p)
    row = row / row.norm()
    assert float((hooks.before_noise(total + row) - hooks.before_noise(total)).norm()) <= 1 + 1e-6


def test_a_checkpoint_of_the_subspace_is_not_resumed_in_its_complement():
    v = orthonormal(12, 4)
    inside, outside = SubspaceRetrain(FixedProjector(v)), ComplementRetrain(FixedProjector(v))
    outside.load_state_dict(outside.state_dict())
    inside.load_state_dict(inside.state_dict())
    inside.load_state_dict({k: val for k, val in inside.state_dict().items() if k != "complement"})  # older
    with pytest.raises(ValueError, match="trained in the subspace, this run in the subspace's orthogonal"):
        outside.load_state_dict(inside.state_dict())
    with pytest.raises(ValueError, match="orthogonal complement, this run in the subspace$"):
        inside.load_state_dict(outside.state_dict())


def test_the_registry_builds_it_with_the_subspace_projectors():
    hooks = make_algorithm("complement", basis=orthonormal(12, 4), rank=3)
    assert isinstance(hooks, ComplementRetrain) and hooks.name == "complement"
    assert hooks.projector.rank == 3 and hooks.projector.kind == "fixed"
    assert make_algorithm("complement", projector="random", rank=2, seed=1).projector.kind == "random"
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['noise'\] for algorithm 'complement'"):
        make_algorithm("complement", basis=orthonormal(12, 4), rank=3, noise="subspace")
    with pytest.raises(ValueError, match="needs a rank"):
        make_algorithm("complement", projector="random")


def _train(tmp_path, name, hooks) -> tuple[float, torch.Tensor]:
    """The final held-out loss and weights (float64) of 40 noise-free steps on the lowrank task."""
    task = lowrank_task()
    res = collect(config(noise_multiplier=0.0, steps=40, lr=0.5), out=tmp_path / name, task=task,
                  hooks=hooks, write_store=False)
    (w,) = [p.detach().double().flatten() for p in task.model.parameters()]
    return res.final_metrics["eval_loss"], w


def test_in_the_complement_of_the_gradient_row_space_nothing_is_learned(tmp_path):
    """The lowrank task's gradients lie in its rank-r row space B (w starts at 0): with B
    projected out the update is zero; with one direction b of B projected out, w moves in
    the rest of B and stays orthogonal to b."""
    r, basis = LOWRANK["r"], row_space_basis(lowrank_task())
    start = lowrank_task().eval.tensors["targets"].square().mean().item() / 2  # loss at w = 0
    loss, w = _train(tmp_path, "all", ComplementRetrain(FixedProjector(basis, rank=r)))
    assert loss == pytest.approx(start, rel=1e-5) and float(w.norm()) < 1e-6  # float32 rounding
    full, w_full = _train(tmp_path, "full", SubspaceRetrain(FixedProjector(basis, rank=r)))
    assert full < 0.2 * start
    _, w = _train(tmp_path, "partial", ComplementRetrain(FixedProjector(basis, rank=1)))
    assert float(w.norm()) > 0.1 * float(w_full.norm())  # it trains ...
    assert abs(float(w @ basis[:, 0])) < 1e-5 * float(w.norm())  # ... never along b
    assert float((w - basis @ (basis.T @ w)).norm()) < 1e-5 * float(w.norm())  # inside B
    # a random 2-dimensional subspace of the 16 barely meets B: its complement trains on
    random, _ = _train(tmp_path, "random", ComplementRetrain(RandomProjector(2, seed=0)))
    assert random < 0.5 * start
