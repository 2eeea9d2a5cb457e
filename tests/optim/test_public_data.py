"""Public data come from the task's public split only — never from the held-out data that
evaluation scores — and runs record which examples they used."""

from __future__ import annotations

import json

import pytest
import torch

from gradspec.optim import AdaDPS, PublicProjector, make_algorithm, public_split, retrain
from gradspec.tasks import TensorData

from ._cases import LOWRANK, config, fake_run, lowrank_task


def _rows(data: TensorData) -> set[tuple]:
    return {tuple(r) for r in data.tensors["inputs"].tolist()}


def test_public_split_never_returns_eval_examples():
    """Old code fell back to the eval split when a task had no public split."""
    task = lowrank_task(n_public=0)
    with pytest.raises(ValueError, match=r"has no public split.*n_public=M"):
        public_split(task, 10)
    task = lowrank_task(n_public=40)
    for seed in range(3):
        got = public_split(task, 25, seed=seed)
        assert len(got) == 25
        assert not _rows(got) & _rows(task.eval) and not _rows(got) & _rows(task.train)
        assert set(got.ids.tolist()) <= set(task.public.ids.tolist())
    with pytest.raises(ValueError, match=r"m=41 must be in \[1, 40\].*n_public"):
        public_split(task, 41)


def test_public_split_refuses_a_public_split_overlapping_eval_at_first_use():
    task = lowrank_task()
    task.public = task.eval  # set after construction, past the constructor's check
    with pytest.raises(ValueError, match="public split shares 60 of 60 examples with its eval split"):
        public_split(task, 10)


@pytest.mark.parametrize("make", [
    lambda public: PublicProjector(2, public=public),
    lambda public: AdaDPS(public=public),
], ids=["public-projector", "adadps"])
def test_hooks_refuse_given_public_examples_that_overlap_eval(make):
    task = lowrank_task()
    run = fake_run(LOWRANK["d"], task=task)
    hooks = make(task.eval.subset(range(10)))
    with pytest.raises(ValueError, match="public split shares 10 of 10 examples with its eval split"):
        hooks.setup(run)


def test_adadps_refuses_a_public_batch_above_the_public_size():
    """Before, b' > m was silently cut to m."""
    run = fake_run(LOWRANK["d"], task=lowrank_task())
    with pytest.raises(ValueError, match=r"public batch size b' must be in \[1, m=10\]"):
        AdaDPS(public_size=10, public_batch=20).setup(run)


def test_public_projector_refuses_a_rank_above_the_public_size():
    task = lowrank_task()
    run = fake_run(LOWRANK["d"], task=task)
    with pytest.raises(ValueError, match=r"rank k=6 exceeds the public set size m=5"):
        PublicProjector(6, public_size=5).setup(run)


@pytest.mark.parametrize(("name", "options"), [
    ("pdp-sgd", {"rank": 3, "public_size": 20}),
    ("noisy-adagrad", {"rank": 3, "public_size": 20, "precond_noise_multiplier": 5.0}),
    ("adadps", {"public_size": 20}),
])
def test_runs_record_their_public_examples(tmp_path, name, options):
    task = lowrank_task()
    res = retrain(config=config(steps=3), algorithm=name, options=options, out=tmp_path / name,
                  task=task)
    saved = json.loads((tmp_path / name / "retrain.json").read_text())
    record = saved["hooks"].get("projector", saved["hooks"])
    ids = record["public_ids"]
    assert len(ids) == 20 and record["public_size"] == 20
    assert set(ids) <= set(task.public.ids.tolist())
    assert not set(ids) & set(task.eval.ids.tolist()) and not set(ids) & set(task.train.ids.tolist())
    assert res.hooks == saved["hooks"]


def test_a_run_without_public_data_fails_with_how_to_add_it(tmp_path):
    with pytest.raises(ValueError, match="has no public split"):
        retrain(config=config(steps=2), algorithm="pdp-sgd", options={"rank": 2},
                out=tmp_path / "run", task=lowrank_task(n_public=0))


def test_resume_with_other_public_examples_is_refused(tmp_path):
    from gradspec.collect import collect

    cfg = config()
    collect(cfg, out=tmp_path / "run", task=lowrank_task(), write_store=False, stop_after=2,
            hooks=make_algorithm("pdp-sgd", rank=3, public_size=20))
    other = lowrank_task()
    other.public = TensorData(other.public.tensors, other.public.ids + 1000)  # other examples
    with pytest.raises(ValueError, match="other public examples"):
        collect(out=tmp_path / "run", task=other, resume=True, write_store=False,
                hooks=make_algorithm("pdp-sgd", rank=3, public_size=20))


def test_retrain_reports_train_metrics_and_the_eval_standard_error(tmp_path):
    task = lowrank_task(kind="logistic")
    res = retrain(config=config(steps=4), algorithm="dp-sgd", out=tmp_path / "run", task=task)
    final = res.final_metrics
    assert {"eval_loss", "eval_accuracy", "train_loss", "train_accuracy"} <= set(final)
    assert final["eval_examples"] == LOWRANK["n_eval"]
    a = final["eval_accuracy"]
    assert final["eval_accuracy_se"] == pytest.approx((a * (1 - a) / LOWRANK["n_eval"]) ** 0.5)
    # train_* is the loss on the private training set at the final parameters
    with torch.no_grad():
        batch = task.train.batch(slice(None))
        loss = task.loss(task.forward(task.model, batch), batch).mean().item()
    assert final["train_loss"] == pytest.approx(loss, rel=1e-5)
    quiet = retrain(config=config(steps=2), algorithm="dp-sgd", out=tmp_path / "q",
                    task=lowrank_task(), train_metrics=False)
    assert not any(k.startswith("train_") for k in quiet.final_metrics)


def test_a_public_projector_passed_to_several_runs_starts_each_without_a_basis():
    """One projector object in a sweep's options serves several runs: each must compute its
    basis at its own first step (found by review: the second seed kept the first run's basis and
    update step, and trained in it until the period came round; eval_mse 1.0001 against 0.351)."""
    task = lowrank_task()
    run = fake_run(LOWRANK["d"], task=task)
    proj = PublicProjector(2, public_size=5, period=1000)
    proj.setup(run)
    assert proj.update(0, run) and proj.last_update == 0
    proj.setup(run)  # the next run
    assert proj.last_update is None and proj.eigenvalues is None
    with pytest.raises(RuntimeError, match="no basis yet"):
        _ = proj.basis
    assert proj.update(0, run)  # its first step computes a basis again
