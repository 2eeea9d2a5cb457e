"""A fixed subspace's epsilon is a DP guarantee only when the basis is of other data.

``gradspec pca`` of a collect run on the private training data (the README's step 6,
Li et al. Fig. 2b) gives a basis computed from noise-free clipped gradients of the
private examples: retraining in it reports epsilon for the gradient noise only, so
``retrain`` records ``dp_guarantee: false`` with the reason. A spectrum of data recorded
as disjoint from the private training split (another pool, or disjoint ids) keeps it.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

import gradspec
from gradspec.collect import collect
from gradspec.optim import make_algorithm, retrain
from gradspec.optim._registry import spectrum_provenance
from gradspec.tasks import Task

from ._cases import LOWRANK, config, lowrank_task

NOT_DP = "NOT a DP guarantee: the subspace comes from noise-free gradients of the private training data"


def _spectrum(root, task: Task | None = None):
    """collect (noise-free) -> pca, as the README does; ``task`` defaults to the bundled one."""
    collect(config(noise_multiplier=0.0, steps=6, checkpoint_every=6), out=root / "run", task=task)
    spectrum = root / "spectrum.zarr"
    gradspec.pca(source=root / "run" / "gradients.zarr", k=3, out=spectrum)
    return spectrum


@pytest.fixture(scope="module")
def same_data_spectrum(tmp_path_factory):
    return _spectrum(tmp_path_factory.mktemp("same"))


def _pooled(task: Task, name: str, train, held_out, public=None) -> Task:
    """``task``'s model and loss on other splits of its pool of examples, ids recorded."""
    return dataclasses.replace(task, name=name, train=train, eval=held_out, public=public,
                               config={"pool": "lowrank-0", "train_ids": train.ids.tolist()})


def test_readme_flow_is_not_a_dp_guarantee(tmp_path, same_data_spectrum, caplog):
    import typer
    from typer.testing import CliRunner

    from cli.retrain import retrain_command

    app = typer.Typer()
    app.command()(retrain_command)
    app.command("noop")(lambda: None)
    options = [a for k, v in LOWRANK.items() for a in ("-t", f"{k}={v}")]
    args = ["retrain-command", "--out", str(tmp_path / "cli"), "--task", "lowrank", *options,
            "--steps", "3", "--batch-size", "24", "--noise-multiplier", "1.0", "-a", "subspace", "--rank", "2",
            "--projector", str(same_data_spectrum), "--no-progress", "--no-train-metrics"]
    with caplog.at_level(logging.WARNING, logger="gradspec.optim._retrain"):
        out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    (line,) = [ln for ln in out.output.splitlines() if ln.startswith("privacy")]
    assert f"(gradient noise only; {NOT_DP})" in line, line
    saved = json.loads((tmp_path / "cli" / "retrain.json").read_text())
    assert saved["dp_guarantee"] is False
    assert "training split" in saved["dp_caveat"] and "not accounted" in saved["dp_caveat"]
    assert any("NOT a DP guarantee" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


@pytest.mark.parametrize("algorithm", ["subspace", "noisy-adagrad", "pdp-sgd"])
def test_any_spectrum_projector_of_the_private_data_is_flagged(tmp_path, same_data_spectrum, algorithm):
    options = {"projector": "spectrum", "spectrum": same_data_spectrum, "rank": 2}
    res = retrain(config=config(steps=2), algorithm=algorithm, options=options, out=tmp_path / "r",
                  task=lowrank_task(), train_metrics=False)
    assert res.dp_guarantee is False and "task 'lowrank'" in res.dp_caveat
    row = res.to_row()
    assert row["dp_guarantee"] is False and row["dp_caveat"] == res.dp_caveat


def test_public_and_random_projectors_keep_the_guarantee(tmp_path):
    res = retrain(config=config(steps=2), algorithm="rpdp-sgd", options={"rank": 2}, out=tmp_path / "r",
                  task=lowrank_task(), train_metrics=False)
    assert res.dp_guarantee is True and res.dp_caveat is None


def test_a_basis_without_provenance_is_treated_as_private_data(tmp_path, same_data_spectrum):
    import torch

    hooks = make_algorithm("subspace", basis=torch.linalg.qr(torch.randn(16, 2))[0], rank=2)
    res = retrain(config=config(steps=2), algorithm=hooks, out=tmp_path / "t", task=lowrank_task(),
                  train_metrics=False)
    assert res.dp_guarantee is False and "given as a tensor" in res.dp_caveat


def test_a_spectrum_of_disjoint_examples_keeps_the_guarantee(tmp_path):
    """The spectrum is computed on the pool's held-out examples; the private run trains on
    its training examples (ids 0..n-1): disjoint ids of the same pool."""
    base = lowrank_task()
    source = _pooled(lowrank_task(), "lowrank-heldout", train=base.eval, held_out=base.public)
    spectrum = _spectrum(tmp_path / "src", source)
    prov = spectrum_provenance(spectrum)
    assert prov["known"] and prov["pool"] == "lowrank-0"
    assert prov["train_ids"] == base.eval.ids.tolist()

    private = _pooled(base, "lowrank-private", train=base.train, held_out=base.eval)
    options = {"projector": "spectrum", "spectrum": spectrum, "rank": 2}
    res = retrain(config=config(steps=2), algorithm="subspace", options=options, out=tmp_path / "ok",
                  task=private, train_metrics=False)
    assert res.dp_guarantee is True and res.dp_caveat is None
    assert json.loads((tmp_path / "ok" / "retrain.json").read_text())["dp_guarantee"] is True

    # the same pool, training ids that overlap the spectrum's: not a guarantee
    both = base.eval.subset(slice(0, 10))
    overlap = _pooled(lowrank_task(), "lowrank-overlap", train=both, held_out=base.train)
    res = retrain(config=config(steps=2, batch_size=4), algorithm="subspace", options=options,
                  out=tmp_path / "bad", task=overlap, train_metrics=False)
    assert res.dp_guarantee is False and "shares 10 examples with" in res.dp_caveat
