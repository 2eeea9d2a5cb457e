"""The collect loop: rows, clipping, noise, accounting, resume, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gradspec.collect import CollectConfig, collect
from gradspec.privacy import compute_epsilon
from gradspec.store import GradientStore

from ._tiny import tiny_task


def cfg(**kw) -> CollectConfig:
    base = dict(task="tiny", steps=12, batch_size=16, noise_multiplier=1.0, lr=0.05, optimizer="sgd",
                eval_every=5, log_every=3, checkpoint_every=4, microbatch=5)
    base.update(kw)
    return CollectConfig(**base)


def read_all(path):
    s = GradientStore.open(path)
    return s.read(), s.row_meta()


def metrics_without_time(path):
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


@pytest.mark.parametrize("mode", ["batch", "per-example"])
@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_resume_equals_uninterrupted_run(tmp_path, mode, sampling):
    config = cfg(mode=mode, sampling=sampling)
    full = collect(config, out=tmp_path / "full", task=tiny_task())
    part = collect(config, out=tmp_path / "part", task=tiny_task(), stop_after=6)
    assert part.steps == 6
    # a store cut short opens with its committed rows
    assert GradientStore.open(part.store).n_rows > 0
    done = collect(out=tmp_path / "part", task=tiny_task(), resume=True)
    assert done.steps == full.steps == 12
    a, ma = read_all(full.store)
    b, mb = read_all(done.store)
    assert a.shape[0] > 0
    np.testing.assert_array_equal(a, b)  # bitwise
    for k in ma:
        np.testing.assert_array_equal(ma[k], mb[k])
    assert metrics_without_time(full.metrics) == metrics_without_time(done.metrics)
    assert done.epsilon == pytest.approx(full.epsilon)
    assert GradientStore.open(done.store).status == "complete"


def test_per_example_rows_are_clipped_batch_of_one_gradients(tmp_path):
    """Stored rows equal a batch-of-one autograd loop, clipped to C, at the initial parameters."""
    C = 0.05
    res = collect(cfg(mode="per-example", steps=1, max_grad_norm=C), out=tmp_path / "r", task=tiny_task())
    rows, meta = read_all(res.store)
    task = tiny_task()  # same seed: same initial model
    model = task.model
    names = [n for n, _ in model.named_parameters()]
    for row, i in zip(rows, meta["example_index"], strict=True):
        batch = task.train.batch([int(i)])
        loss = task.loss(task.forward(model, batch), batch).sum()
        g = torch.cat([x.flatten() for x in torch.autograd.grad(loss, [model.get_parameter(n) for n in names])])
        g = g * min(1.0, C / float(g.norm()))
        np.testing.assert_allclose(row, g.detach().numpy(), rtol=2e-5, atol=1e-7)
        assert np.linalg.norm(row) <= C * (1 + 1e-5)
    assert meta["frac_clipped"][0] > 0  # the bound was active


def test_batch_row_is_mean_of_clipped_rows(tmp_path):
    """A batch-mode row equals the mean of the same step's per-example rows."""
    a = collect(cfg(mode="batch", steps=3, max_grad_norm=0.1), out=tmp_path / "a", task=tiny_task())
    b = collect(cfg(mode="per-example", steps=3, max_grad_norm=0.1), out=tmp_path / "b", task=tiny_task())
    rows_a, meta_a = read_all(a.store)
    rows_b, meta_b = read_all(b.store)
    for j, step in enumerate(meta_a["step"]):
        sel = meta_b["step"] == step
        assert sel.sum() == meta_a["batch_size"][j]
        np.testing.assert_allclose(rows_a[j], rows_b[sel].mean(0), rtol=1e-5, atol=1e-7)
        assert np.linalg.norm(rows_a[j]) <= 0.1 * (1 + 1e-5)


def test_noise_has_the_predicted_scale(tmp_path):
    """With zero gradients, one SGD step (lr 1) moves each parameter by N(0, (sigma C / (q n))^2)."""
    task = tiny_task(n=64)
    task.loss = lambda outputs, batch: outputs.sum(1) * 0.0
    sigma, C, B = 2.0, 3.0, 16
    before = torch.cat([p.detach().flatten().clone() for p in task.model.parameters()])
    collect(cfg(steps=1, noise_multiplier=sigma, max_grad_norm=C, batch_size=B, lr=1.0, eval_every=0),
            out=tmp_path / "n", task=task)
    after = torch.cat([p.detach().flatten() for p in task.model.parameters()])
    delta = (after - before).double()
    expected = sigma * C / B  # q * n = B
    # p = 195 parameters: the sample std is within 15% of the truth with overwhelming probability
    assert delta.numel() > 150
    assert float(delta.std()) == pytest.approx(expected, rel=0.15)
    assert abs(float(delta.mean())) < 4 * expected / math.sqrt(delta.numel())


def test_epsilon_matches_the_accountant(tmp_path):
    res = collect(cfg(steps=10, noise_multiplier=1.3), out=tmp_path / "e", task=tiny_task())
    assert res.delta == pytest.approx(64 ** -1.1)
    assert res.epsilon == pytest.approx(
        compute_epsilon(noise_multiplier=1.3, sample_rate=16 / 64, steps=10, delta=res.delta), rel=1e-9
    )
    logged = [json.loads(x) for x in res.metrics.read_text().splitlines()]
    eps = [r["epsilon"] for r in logged if "epsilon" in r]
    assert eps == sorted(eps) and eps[-1] == pytest.approx(res.epsilon)
    assert any("eval_accuracy" in r for r in logged)


def test_target_epsilon_is_reached(tmp_path):
    res = collect(cfg(steps=8, noise_multiplier=None, target_epsilon=3.0), out=tmp_path / "t", task=tiny_task())
    assert res.epsilon <= 3.0 and res.epsilon == pytest.approx(3.0, rel=0.02)


def test_only_selected_parameters_train(tmp_path):
    task = tiny_task(params=("fc1.*",))
    frozen = task.model.fc2.weight.detach().clone()
    res = collect(cfg(steps=3), out=tmp_path / "s", task=task)
    store = GradientStore.open(res.store)
    assert store.layout.names == ["fc1.weight", "fc1.bias"]
    assert torch.equal(task.model.fc2.weight, frozen)


def test_nonfinite_gradients_are_refused_or_skipped(tmp_path):
    def poisoned():
        task = tiny_task()
        base = task.loss
        task.loss = lambda out, batch: base(out, batch) * torch.where(
            batch["tokens"][:, 0] == 7, torch.tensor(float("nan")), torch.tensor(1.0))
        return task

    with pytest.raises(ValueError, match=r"non-finite gradients at step \d+.*--skip-nonfinite"):
        collect(cfg(checkpoint_every=1), out=tmp_path / "a", task=poisoned())
    kept = GradientStore.open(tmp_path / "a" / "gradients.zarr")
    assert np.isfinite(kept.read()).all()
    res = collect(cfg(skip_nonfinite=True), out=tmp_path / "b", task=poisoned())
    rows, meta = read_all(res.store)
    assert np.isfinite(rows).all() and len(rows) < 12


def test_bad_settings_and_existing_runs(tmp_path):
    with pytest.raises(ValueError, match="choose one of"):
        cfg(mode="sometimes")
    with pytest.raises(ValueError, match="clipping"):
        cfg(clip=False)
    collect(cfg(steps=2), out=tmp_path / "x", task=tiny_task())
    with pytest.raises(FileExistsError, match="--resume"):
        collect(cfg(steps=2), out=tmp_path / "x", task=tiny_task())
    with pytest.raises(ValueError, match="differ in"):
        collect(cfg(steps=3), out=tmp_path / "x", task=tiny_task(), resume=True)
    with pytest.raises(ValueError, match="layout"):
        collect(out=tmp_path / "x", task=tiny_task(params=("fc1.*",)), resume=True)
