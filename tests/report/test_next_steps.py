"""The commands the page suggests run as printed: a pca k the store can give, a retraining sweep
of the run's own task (retrain's default task is text: the bare command failed on any other),
and for a per-step sketched run the replay its spectrum needs first (`--projector` refuses
directions in sketch space). Found by running them: each failed before."""

from __future__ import annotations

import shlex

import pytest

from gradspec.report import read_run

from .conftest import TRAIN, ok, runner


def _run(command: str, *extra: str) -> None:
    """Run one suggested `gradspec ...` command line (with ``extra`` flags) in process."""
    from cli.main import app

    words = shlex.split(command)
    assert words[0] == "gradspec", command
    res = runner.invoke(app, [*words[1:], *extra])
    assert res.exit_code == 0, f"{command}\n{res.output}"


@pytest.mark.parametrize("sketch", [False, True])
def test_a_short_per_step_run_gets_commands_that_run(tmp_path, sketch):
    run = tmp_path / "run"
    ok("collect", "--out", run, "--steps", 6, *(["--sketch", 24, "--sketch-blocks", 2] if sketch else []), *TRAIN)
    pca = read_run(run).stages["pca"].next_step
    assert " --k 6 " in pca, pca  # 6 rows: --k 100 was refused ("exceeds min(r, p)")
    _run(pca, "--no-progress")
    step = read_run(run).stages["retrain"].next_step
    if sketch:
        replay, then = step.split(" && ")
        assert replay.startswith("gradspec replay ") and f"--out {run / 'directions.zarr'}" in replay, replay
        _run(replay, "--no-progress")
        step = read_run(run).stages["retrain"].next_step  # the replay done: no second one asked for
        assert step == then, (step, then)
    else:
        assert "gradspec replay" not in step, step
    k = read_run(run).spectrum["k"]  # pca keeps the directions the rank-3 task's rows resolve
    assert "--task lowrank -t n=200 -t d=40 -t r=3" in step and f"--ranks {k} " in step and k <= 6, step
    _run(step, "--steps", "2", "--no-progress", "--no-plot")


def test_a_per_example_sketched_run_is_offered_no_retraining_in_sketch_space(sketched_run):
    contents = read_run(sketched_run)
    assert contents.stages["pca"].state == "complete" and contents.stages["retrain"].next_step is None


def test_the_suggested_sweep_trains_on_the_runs_own_data(tmp_path):
    """A run collected with --seed 3 drew the task's data with seed 3; the suggested sweep must
    too (found by review: it drew seed 0's data, and the subspace arm learned nothing, exit 0)."""
    run = tmp_path / "run"
    ok("collect", "--out", run, "--steps", 6, "--seed", 3, *TRAIN)
    _run(read_run(run).stages["pca"].next_step, "--no-progress")
    step = read_run(run).stages["retrain"].next_step
    assert " --task-seed 3" in step, step
    ok("collect", "--out", tmp_path / "t", "--steps", 6, "--seed", 3, "--task-seed", 5, *TRAIN)
    _run(read_run(tmp_path / "t").stages["pca"].next_step, "--no-progress")
    assert " --task-seed 5" in read_run(tmp_path / "t").stages["retrain"].next_step


def test_an_unfinished_run_is_offered_a_k_its_finished_store_can_give(tmp_path):
    """An unfinished 30-step run (10 rows so far): --k 30, not 100 (found by review: --k 100 was
    refused then and after the run finished)."""
    run = tmp_path / "run"
    task = [a if a != "d=40" else "d=300" for a in TRAIN]
    ok("collect", "--out", run, "--steps", 30, "--stop-after", 10, "--noise-multiplier", 1.0, "--eval-every", 0, *task)
    assert " --k 30 " in read_run(run).stages["pca"].next_step
