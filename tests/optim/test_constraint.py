"""BallConstraint: projected steps in the real trainer, accounting passed through."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gradspec.optim import (
    BallConstraint,
    NoisyAdaGrad,
    PublicProjector,
    make_algorithm,
    project_ball,
    retrain,
)
from gradspec.train import StepHooks, TrainConfig


def _config(**kw) -> TrainConfig:
    base = TrainConfig(task="ballglm", task_options=dict(n=60, n_eval=20, n_public=20, d=30, r=3),
                       steps=12, batch_size=60, sampling="poisson", noise_multiplier=2.0,
                       max_grad_norm=1.0, optimizer="sgd", lr=0.5, eval_every=0, log_every=100,
                       checkpoint_every=100, seed=3, microbatch=60)
    return dataclasses.replace(base, **kw)


def _run(tmp_path, name, hooks, **kw):
    from gradspec.tasks import make_task

    cfg = _config(**kw)
    task = make_task("ballglm", seed=cfg.seed, **cfg.task_options)
    res = retrain(config=cfg, algorithm=hooks, out=tmp_path / name, task=task, train_metrics=False)
    return res, task.model.weight.detach().double().reshape(-1)


def test_project_ball():
    y = torch.tensor([3.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(project_ball(y, 1.0), y / 5)
    torch.testing.assert_close(project_ball(y, 10.0), y)


def test_every_iterate_stays_in_the_ball_and_equals_a_manual_projected_loop(tmp_path):
    # reference: projected DP-GD re-implemented in plain float64 torch with the trainer's
    # noise draws (same generator and seed), compared with the wrapper's final iterate
    radius = 0.3
    res, theta = _run(tmp_path, "ball", BallConstraint(StepHooks(), radius=radius), lr=2.0)
    assert float(theta.norm()) <= radius * (1 + 1e-6)
    assert abs(float(theta.norm()) - radius) < 1e-5  # noise at sigma 2 pushes it to the boundary

    from gradspec.privacy import gaussian_noise
    from gradspec.tasks import make_task

    cfg = _config(lr=2.0)
    task = make_task("ballglm", seed=cfg.seed, **cfg.task_options)
    x = task.train.tensors["inputs"].double()
    s = 2.0 * task.train.tensors["labels"].double() - 1.0
    gen = torch.Generator().manual_seed(cfg.seed + 2)  # the trainer's noise generator
    t = torch.zeros(30, dtype=torch.float64)
    for _ in range(cfg.steps):
        per = -(s * torch.sigmoid(-s * (x @ t)))[:, None] * x  # norms < 1: clipping inactive
        noise = gaussian_noise((30,), cfg.noise_multiplier * 1.0, generator=gen, device=torch.device("cpu"))
        g = (per.sum(0) + noise.double()) / 60
        t = project_ball(t - cfg.lr * g, radius)
    torch.testing.assert_close(theta, t, rtol=1e-4, atol=1e-5)


def test_a_ball_that_never_binds_changes_nothing(tmp_path):
    _, free = _run(tmp_path, "free", StepHooks())
    _, wide = _run(tmp_path, "wide", BallConstraint(StepHooks(), radius=1e6))
    torch.testing.assert_close(wide, free, rtol=1e-6, atol=1e-7)


def test_the_wrapper_keeps_the_inner_accounting(tmp_path):
    def adagrad():
        return NoisyAdaGrad(PublicProjector(3, public_size=20, period=1000), precond_noise_multiplier=2.0)

    bare, _ = _run(tmp_path, "bare", adagrad())
    wrapped, theta = _run(tmp_path, "wrapped", BallConstraint(adagrad(), radius=0.2))
    assert wrapped.epsilon == pytest.approx(bare.epsilon, rel=1e-12)
    assert wrapped.accounting == bare.accounting and "without subsampling amplification" in wrapped.accounting
    assert float(theta.norm()) <= 0.2 * (1 + 1e-6)
    dp, _ = _run(tmp_path, "dp", BallConstraint(StepHooks(), radius=0.2))
    assert dp.epsilon < wrapped.epsilon  # noisy AdaGrad spends more at the same sigma
    pdp = make_algorithm("pdp-sgd", rank=3, public_size=20, period=1000)
    res, _ = _run(tmp_path, "pdp", BallConstraint(pdp, radius=0.2))
    assert res.epsilon == pytest.approx(dp.epsilon, rel=1e-12)


def test_bad_radius_and_momentum_are_refused(tmp_path):
    with pytest.raises(ValueError, match="radius"):
        BallConstraint(StepHooks(), radius=0.0)
    with pytest.raises(TypeError, match="StepHooks"):
        BallConstraint(object(), radius=1.0)
    from gradspec.train import train

    with pytest.raises(ValueError, match="momentum"):
        train(_config(momentum=0.9), out=tmp_path / "m", hooks=BallConstraint(StepHooks(), radius=1.0))


def test_the_wrapper_passes_on_that_adadps_needs_rows(tmp_path):
    """AdaDPS preconditions per-example rows; wrapped, the default backend picked ghost clipping
    (no rows) and failed deep inside a step (found by review). The wrapper says it needs rows,
    and a wrapped AdaDPS trains as the bare one inside a ball that never binds."""
    def adadps():
        return make_algorithm("adadps", public_size=20)

    assert BallConstraint(adadps(), radius=1.0).needs_rows and not BallConstraint(StepHooks(), radius=1.0).needs_rows
    _, bare = _run(tmp_path, "bare", adadps(), backend="auto")
    _, wide = _run(tmp_path, "wide", BallConstraint(adadps(), radius=1e6), backend="auto")
    torch.testing.assert_close(wide, bare, rtol=1e-6, atol=1e-7)
