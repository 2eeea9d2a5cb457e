"""Small real runs, made once per session by gradspec's own commands (in process): a finished
run of every step, a run stopped mid-collect, and a sketched per-example run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()

TASK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20"]
TRAIN = [*TASK, "--lr", "0.05", "--optimizer", "sgd", "--no-progress"]


def ok(*args) -> str:
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="session")
def full_run(tmp_path_factory) -> Path:
    """collect → pca → decay (with the bounds' setting) → plot → a retraining sweep."""
    run = tmp_path_factory.mktemp("report") / "run"
    ok("collect", "--out", run, "--steps", 24, "--epsilon", 2, "--eval-every", 8, "--checkpoint-every", 8, *TRAIN)
    ok("pca", run / "gradients.zarr", "--k", 10, "--out", run / "spectrum.zarr", "--no-progress")
    ok("decay", run / "spectrum.zarr", "--out", run / "decay", "--n", 200, "--epsilon", 2, "--delta", 1e-3,
       "--diameter", 1, "--format", "svg")
    ok("plot", run / "decay", "--out", run / "figures", "--format", "svg")
    ok("retrain", "--sweep", "-a", "subspace", "-a", "dp-sgd", "--projector", run / "spectrum.zarr", "--ranks", 2,
       "--epsilons", 2, "--steps", 6, "--eval-every", 3, *TRAIN, "--no-train-metrics", "--no-plot",
       "--out", run / "sweep")
    return run


@pytest.fixture(scope="session")
def stopped_run(tmp_path_factory) -> Path:
    """A collect stopped after 10 of 24 steps (its store unfinished), whose metrics.jsonl ends in
    a line still being written."""
    run = tmp_path_factory.mktemp("report") / "stopped"
    ok("collect", "--out", run, "--steps", 24, "--stop-after", 10, "--epsilon", 2, "--eval-every", 5,
       "--checkpoint-every", 5, *TRAIN)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "eval_lo')
    return run


@pytest.fixture(scope="session")
def sketched_run(tmp_path_factory) -> Path:
    """Per-example rows sketched to M = 512 columns in 4 blocks, their spectrum and decay report."""
    run = tmp_path_factory.mktemp("report") / "sketched"
    ok("collect", "--out", run, "--task", "lowrank", "-t", "n=200", "-t", "d=2000", "-t", "r=3", "--per-example",
       "--sketch", 512, "--sketch-blocks", 4, "--steps", 3, "--batch-size", 10, "--sampling", "shuffle",
       "--no-progress")
    ok("pca", run / "gradients.zarr", "--k", 8, "--out", run / "spectrum.zarr", "--no-progress")
    ok("decay", run / "spectrum.zarr", "--out", run / "decay", "--no-plots")
    return run
