"""AdaDPS Option 2 (Li et al. 2022, Alg. 1): fixed side information, from the CLI too."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import typer
from torch import nn
from typer.testing import CliRunner

from gradspec.optim import AdaDPS, retrain
from gradspec.optim._adadps import frequency_side_information, load_side_information
from gradspec.tasks import Task, TensorData

from ._cases import LOWRANK, config, fake_run, lowrank_task

D = LOWRANK["d"]


def test_feature_frequencies_of_the_public_examples():
    """A_j = E|x_j| + 1/m over the public examples, scaled to max 1 (dense reference)."""
    task = lowrank_task()
    hooks = AdaDPS(side_information="frequency", public_size=30, seed=2)
    hooks.setup(fake_run(D, task=task))
    x = hooks.public.tensors["inputs"].double()
    assert len(x) == 30 and set(hooks.public.ids.tolist()) <= set(task.public.ids.tolist())
    ref = x.abs().mean(0) + 1 / 30
    torch.testing.assert_close(hooks.A.double(), ref / ref.max(), rtol=1e-6, atol=0)
    grads = torch.randn(4, D)
    torch.testing.assert_close(hooks.precondition(grads), grads / hooks.A)
    assert hooks.describe()["side_information"] == "frequency"


class _Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 3)
        self.fc = nn.Linear(3, 2)

    def forward(self, tokens):
        return self.fc(self.emb(tokens).mean(1))


def test_token_frequencies_of_an_embedding():
    tokens = torch.tensor([[1, 2, 2, 0], [1, 3, 0, 0], [4, 4, 4, 1]])
    mask = (tokens != 0).long()
    data = TensorData({"input_ids": tokens, "attention_mask": mask, "labels": torch.zeros(3).long()})
    model = _Bag()
    a = frequency_side_information(model, ["emb.weight"], data)
    counts = torch.tensor([0, 3, 2, 1, 3, 0, 0, 0, 0, 0], dtype=torch.float64)  # padding 0 not counted
    ref = (counts / 3 + 1 / 3)[:, None].expand(10, 3).flatten()
    torch.testing.assert_close(a.double(), ref / ref.max(), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match=r"'fc.weight' is neither: pass the side information as a file"):
        frequency_side_information(model, ["emb.weight", "fc.weight"], data)


def test_side_information_files(tmp_path):
    values = np.linspace(0.5, 2.0, D)
    np.save(tmp_path / "a.npy", values)
    (tmp_path / "a.txt").write_text(" ".join(f"{v:.10f}" for v in values))
    torch.save(torch.from_numpy(values), tmp_path / "a.pt")
    for name in ("a.npy", "a.txt", "a.pt"):
        np.testing.assert_allclose(load_side_information(tmp_path / name, D).numpy(), values, rtol=1e-6)
    with pytest.raises(ValueError, match="has 16 entries, the run trains 5"):
        load_side_information(tmp_path / "a.npy", 5)
    np.save(tmp_path / "bad.npy", np.r_[values[:-1], 0.0])
    with pytest.raises(ValueError, match="positive"):
        load_side_information(tmp_path / "bad.npy")
    with pytest.raises(ValueError, match="not found"):
        load_side_information(tmp_path / "missing.npy")
    os.mkfifo(tmp_path / "fifo.npy")  # was "not found"
    with pytest.raises(ValueError, match="'.*fifo.npy' is not a regular file"):
        load_side_information(tmp_path / "fifo.npy")
    with pytest.raises(ValueError, match="exactly when rule='fixed'"):
        AdaDPS(rule="rmsprop", side_information=tmp_path / "a.npy")
    with pytest.raises(ValueError, match="exactly when rule='fixed'"):
        AdaDPS(rule="fixed")
    assert AdaDPS(side_information=tmp_path / "a.npy").rule == "fixed"


def test_frequency_needs_public_data():
    with pytest.raises(ValueError, match="has no public split"):
        AdaDPS(side_information="frequency").setup(fake_run(D, task=lowrank_task(n_public=0)))


def _app():
    from cli.retrain import retrain_command

    app = typer.Typer()
    app.command()(retrain_command)
    app.command("noop")(lambda: None)
    return app


ARGS = ["--task", "lowrank", "-t", "n=120", "-t", "d=16", "-t", "r=3", "-t", "n_eval=60", "--steps", "4",
        "--batch-size", "24", "--accounting", "rdp", "--lr", "0.3", "--no-progress"]


def test_cli_reaches_option_2(tmp_path):
    """`gradspec retrain -a adadps --side-information FILE|frequency` (no way to pass it before)."""
    side = np.linspace(0.2, 1.0, D)
    np.save(tmp_path / "side.npy", side)
    runner = CliRunner()
    result = runner.invoke(_app(), ["retrain-command", "--out", str(tmp_path / "file"), *ARGS,
                                    "-a", "adadps", "--side-information", str(tmp_path / "side.npy")])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "file" / "retrain.json").read_text())
    assert saved["hooks"]["rule"] == "fixed" and saved["hooks"]["side_information"].endswith("side.npy")
    # the file is what the run used: the library with the same A gives the same numbers
    cfg = config(steps=4, lr=0.3, sampling="poisson", optimizer="sgd", eval_every=20, log_every=10,
                 checkpoint_every=50, microbatch=32)
    same = retrain(config=cfg, algorithm=AdaDPS(side_information=torch.from_numpy(side)),
                   out=tmp_path / "lib", task=lowrank_task())
    assert saved["final_metrics"]["eval_loss"] == pytest.approx(same.final_metrics["eval_loss"], rel=1e-6)
    plain = runner.invoke(_app(), ["retrain-command", "--out", str(tmp_path / "dpsgd"), *ARGS, "-a", "dp-sgd"])
    assert plain.exit_code == 0
    base = json.loads((tmp_path / "dpsgd" / "retrain.json").read_text())["final_metrics"]["eval_loss"]
    assert saved["final_metrics"]["eval_loss"] != pytest.approx(base, rel=1e-3)

    freq = runner.invoke(_app(), ["retrain-command", "--out", str(tmp_path / "freq"), *ARGS,
                                  "-a", "adadps", "--side-information", "frequency", "--public-size", "50"])
    assert freq.exit_code == 0, freq.output
    hooks = json.loads((tmp_path / "freq" / "retrain.json").read_text())["hooks"]
    assert hooks["side_information"] == "frequency" and len(hooks["public_ids"]) == 50
    bad = runner.invoke(_app(), ["retrain-command", "--out", str(tmp_path / "bad"), *ARGS,
                                 "-a", "adadps", "--side-information", "frequency", "--rule", "adam"])
    assert bad.exit_code != 0 and "exactly when rule='fixed'" in bad.output


def test_user_task_with_embeddings_trains_with_token_frequencies(tmp_path):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 10, (90, 5), generator=g)
    labels = (tokens.sum(1) % 2).long()
    data = {"input_ids": tokens, "labels": labels}

    def split(a, b):
        return TensorData({k: v[a:b] for k, v in data.items()}, torch.arange(a, b))

    task = Task(name="bag", model=_Bag(), train=split(0, 60), eval=split(60, 80), public=split(80, 90),
                forward=lambda call, batch: call(batch["input_ids"]), params=("emb.weight",))
    hooks = AdaDPS(side_information="frequency", public_size=10)
    res = retrain(config=config(task="bag", task_options={}, steps=3, batch_size=16), algorithm=hooks,
                  out=tmp_path / "run", task=task)
    assert res.steps == 3 and hooks.A.shape == (30,)
    assert res.hooks["public_ids"] == list(range(80, 90))
