"""`--backend ghost` through the CLI: collect and retrain run on it, per-example mode is refused."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app
from gradspec.store import GradientStore

runner = CliRunner()

LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "0", "--no-progress"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_collect_with_ghost_backend(tmp_path):
    res = invoke("collect", "--out", tmp_path / "run", "--steps", 4, "--sigma", 1.0, "--backend", "ghost", *LOWRANK)
    assert res.exit_code == 0, res.output
    store = GradientStore.open(tmp_path / "run" / "gradients.zarr")
    assert store.n_rows == 4 and store.config["per_example_engine"] == "ghost"


def test_ghost_with_per_example_mode_is_one_line(tmp_path):
    res = invoke("collect", "--out", tmp_path / "run", "--steps", 4, "--backend", "ghost", "--mode", "per-example",
                 *LOWRANK)
    assert res.exit_code != 0
    assert "--mode batch" in res.output and "Traceback" not in res.output


def test_retrain_with_ghost_backend(tmp_path):
    res = invoke("retrain", "--out", tmp_path / "r", "-a", "dp-sgd", "--steps", 3, "--backend", "ghost",
                 "--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
                 "--eval-every", "0")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r" / "config.json").read_text())["backend"] == "ghost"


def test_collect_and_retrain_default_to_auto_and_print_the_engine_once(tmp_path):
    """No --backend: auto, which takes ghost on a Linear model, says so in one log line and
    records the request and the engine used."""
    res = invoke("collect", "--out", tmp_path / "run", "--steps", 2, "--noise-multiplier", 1.0, *LOWRANK)
    assert res.exit_code == 0, res.output
    config = GradientStore.open(tmp_path / "run" / "gradients.zarr").config
    assert config["collect"]["backend"] == "auto" and config["per_example_engine"] == "ghost"
    assert config["ghost_check"] is True
    assert res.output.count("per-example backend: ghost (auto: ") == 1
    res = invoke("retrain", "--out", tmp_path / "r", "-a", "dp-sgd", "--steps", 2, "--task", "lowrank",
                 "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20", "--eval-every", "0")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r" / "config.json").read_text())["backend"] == "auto"
    assert res.output.count("per-example backend: ghost") == 1
