"""``task_seed``: repeat a run on the same data and model while the seed varies batches and noise."""

from __future__ import annotations

import json

import torch

from gradspec.optim import retrain, sweep
from gradspec.train import TrainConfig
from gradspec.train._config import bind_task

from ._cases import config, lowrank_task


def test_task_seed_builds_the_task_and_the_seed_only_the_randomness(tmp_path):
    cfg = config(seed=5, task_seed=0)
    assert cfg.seed_of_task == 0 and config(seed=5).seed_of_task == 5
    bound, task = bind_task(cfg, None)
    ref = lowrank_task(seed=0)
    for key, value in ref.train.tensors.items():
        assert torch.equal(task.train.tensors[key], value)
    # a registry task built with the task seed is recorded as itself, not as a custom task
    assert bind_task(cfg, lowrank_task(seed=0))[0].task == "lowrank"
    assert bind_task(config(seed=5), lowrank_task(seed=0))[0].task.startswith("custom:")

    rows = sweep(config=config(task_seed=0), algorithms=["dp-sgd"], seeds=[1, 2], out=tmp_path / "s",
                 train_metrics=False)
    saved = [json.loads((tmp_path / "s" / r["out"] / "retrain.json").read_text()) for r in rows]
    assert [s["settings"]["config"]["task_seed"] for s in saved] == [0, 0]
    assert [s["settings"]["config"]["seed"] for s in saved] == [1, 2]
    # same task (data and init), other batches and noise: other final weights
    a = retrain(config=config(seed=1, task_seed=0), algorithm="dp-sgd", out=tmp_path / "a", train_metrics=False)
    b = retrain(config=config(seed=1, task_seed=0), algorithm="dp-sgd", out=tmp_path / "b", train_metrics=False)
    c = retrain(config=config(seed=2, task_seed=0), algorithm="dp-sgd", out=tmp_path / "c", train_metrics=False)
    assert a.final_metrics == b.final_metrics and a.final_metrics != c.final_metrics
    assert TrainConfig.from_dict({k: v for k, v in config().to_dict().items() if k != "task_seed"}).task_seed is None
