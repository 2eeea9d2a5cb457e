"""`gradspec retrain -a adadps --side-information frequency` on the bag-of-words task: AdaDPS
Option 2 with token frequencies of the public documents (Li et al. 2022, §6.1.2)."""

from __future__ import annotations

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from gradspec.optim import AdaDPS, frequency_side_information, retrain
from gradspec.tasks import make_task
from gradspec.train import TrainConfig

TASK = dict(n=200, n_eval=60, n_public=20, vocab=60, n_stop=5, doc_len=20)
ARGS = ["--task", "bow", *[a for k, v in TASK.items() for a in ("-t", f"{k}={v}")],
        "--steps", "6", "--batch-size", "32", "--accounting", "rdp", "--lr", "0.5", "--no-progress",
        "--seed", "3"]


def _app():
    from cli.retrain import retrain_command

    app = typer.Typer()
    app.command()(retrain_command)
    app.command("noop")(lambda: None)
    return app


def test_cli_runs_adadps_with_token_frequencies_on_bow(tmp_path):
    runner = CliRunner()
    result = runner.invoke(_app(), ["retrain-command", "--out", str(tmp_path / "freq"), *ARGS, "-a", "adadps",
                                    "--side-information", "frequency", "--public-size", "20"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "freq" / "retrain.json").read_text())
    assert saved["hooks"]["rule"] == "fixed" and saved["hooks"]["side_information"] == "frequency"
    task = make_task("bow", seed=3, **TASK)
    assert sorted(saved["hooks"]["public_ids"]) == sorted(task.public.ids.tolist())
    assert saved["epsilon"] > 0 and saved["final_metrics"]["eval_examples"] == 60
    # the same A computed by the library from the public documents gives the same run
    side = frequency_side_information(task.model, ["weight", "bias"], task.public)
    cfg = TrainConfig(task="bow", task_options=TASK, steps=6, batch_size=32, accounting="rdp", lr=0.5,
                      optimizer="sgd", seed=3, eval_every=0, log_every=10**6, checkpoint_every=10**6)
    lib = retrain(config=cfg, algorithm=AdaDPS(side_information=side), out=tmp_path / "lib")
    assert saved["final_metrics"]["eval_loss"] == pytest.approx(lib.final_metrics["eval_loss"], rel=1e-5)
    # and it is not DP-SGD: rare words get larger steps
    assert float(side[:60].min()) < 0.5 * float(side[:60].max())
    plain = runner.invoke(_app(), ["retrain-command", "--out", str(tmp_path / "dpsgd"), *ARGS, "-a", "dp-sgd"])
    assert plain.exit_code == 0, plain.output
    base = json.loads((tmp_path / "dpsgd" / "retrain.json").read_text())["final_metrics"]["eval_loss"]
    assert saved["final_metrics"]["eval_loss"] != pytest.approx(base, rel=1e-4)
    assert torch.isfinite(torch.tensor(saved["final_metrics"]["eval_loss"]))
