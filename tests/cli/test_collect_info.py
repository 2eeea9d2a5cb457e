"""`gradspec collect` and `gradspec info` through typer's CliRunner, checked through the library."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import GradientStore

runner = CliRunner()

LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "5", "--checkpoint-every", "4",
           "--no-progress"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_collect_then_info(tmp_path):
    out = tmp_path / "run"
    res = invoke("collect", "--out", out, "--steps", 10, "--epsilon", 2.0, "--mode", "per-example", *LOWRANK)
    assert res.exit_code == 0, res.output
    store = GradientStore.open(out / "gradients.zarr")
    assert store.status == "complete" and store.per_example
    meta = store.row_meta()
    _, first = np.unique(meta["step"], return_index=True)
    assert store.p == 40 and store.n_rows == int(meta["batch_size"][first].sum())
    # lowrank gradients span exactly r = 3 dimensions
    s = np.linalg.svd(store.read().astype(np.float64), compute_uv=False)
    assert (s > 1e-6 * s[0]).sum() == 3
    cfg = store.config
    assert cfg["final_epsilon"] <= 2.0 + 1e-9 and cfg["collect"]["target_epsilon"] == 2.0
    assert f"({store.n_rows} rows)" in res.output

    info = invoke("info", out / "gradients.zarr")
    assert info.exit_code == 0, info.output
    assert f"{store.n_rows} rows x 40 columns" in info.output and "[complete]" in info.output
    as_json = json.loads(invoke("info", out / "gradients.zarr", "--json").output)
    assert as_json["shape"] == [store.n_rows, 40]


def test_resume_through_the_cli(tmp_path):
    """--resume continues from the last checkpoint (killed runs: tests/collect/test_kill_resume.py)."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert invoke("collect", "--out", a, "--steps", 8, *LOWRANK).exit_code == 0
    assert invoke("collect", "--out", b, "--steps", 8, "--stop-after", 5, *LOWRANK).exit_code == 0
    assert GradientStore.open(b / "gradients.zarr").status == "writing"
    res = invoke("collect", "--out", b, "--resume")
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(GradientStore.open(a / "gradients.zarr").read(),
                                  GradientStore.open(b / "gradients.zarr").read())
    # a damaged run (fewer committed rows than its checkpoint) is refused, not silently redone
    GradientStore.open(b / "gradients.zarr", mode="r+").truncate(3)
    res = invoke("collect", "--out", b, "--resume")
    assert res.exit_code != 0 and "damaged" in res.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["info", "{tmp}/missing"], "no gradspec store"),
        (["info", "{tmp}/plain"], "not a gradspec store"),
        (["info", "{tmp}/other.zarr"], "not a gradspec store"),
        (["collect", "--out", "{tmp}/x", "--mode", "sometimes"], "choose one of"),
        (["collect", "--out", "{tmp}/x", "--task", "nope"], "nope"),
        (["collect", "--out", "{tmp}/x", "--noise-multiplier", "1", "--epsilon", "2"], "not both"),
        (["collect", "--out", "{tmp}/x", "--resume"], "no run to resume"),
        (["collect", "--out", "{tmp}/x", "--resume", "--overwrite"], "give one of them"),
        (["collect", "--out", "{tmp}/plain/f", "--resume"], "no run to resume"),
        (["collect", "--out", "{tmp}/notes", "--overwrite"], "not a gradspec run directory"),
        (["collect", "--out", "{tmp}/x", "--stop-after", "0"], "--stop-after must be >= 1"),
        (["collect", "--out", "{tmp}/x", *LOWRANK, "--delta", "0.5"], "not below 1/n"),
        (["collect", "--out", "{tmp}/x", *LOWRANK, "--steps", "4", "--every", "4"], "stores step 0 only"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    (tmp_path / "plain").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    zarr.open_group(str(tmp_path / "other.zarr"), mode="w").attrs["x"] = 1
    res = invoke(*[a.format(tmp=tmp_path) for a in args])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], res.output
    assert "Traceback" not in res.output


def error_line(res) -> str:
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert res.exit_code != 0 and len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


def test_resume_refuses_flags_that_conflict_with_the_run_naming_each(tmp_path):
    out = tmp_path / "b"
    assert invoke("collect", "--out", out, "--steps", 8, "--stop-after", 5, *LOWRANK).exit_code == 0
    before = (out / "config.json").read_text()
    line = error_line(invoke("collect", "--out", out, "--resume", "--steps", 200, "--noise-multiplier", 5, "--task", "cnn",
                             "-t", "d=41", "--no-progress"))
    for part in ("--noise-multiplier (saved 1.0, given 5.0)", "--task (saved 'lowrank', given 'cnn')", "--task-option"):
        assert part in line
    assert (out / "config.json").read_text() == before
    assert GradientStore.open(out / "gradients.zarr").n_rows == 5
    # the run's own flags given again (a default-valued task option spelled out too) are fine
    res = invoke("collect", "--out", out, "--resume", *LOWRANK, "-t", "noise=0.1", "--steps", 8)
    assert res.exit_code == 0, res.output
    assert GradientStore.open(out / "gradients.zarr").status == "complete"


def test_resume_applies_the_flags_that_may_change(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert invoke("collect", "--out", a, "--steps", 12, *LOWRANK).exit_code == 0
    assert invoke("collect", "--out", b, "--steps", 8, *LOWRANK).exit_code == 0
    res = invoke("collect", "--out", b, "--resume", "--steps", 12, "--eval-every", 3, "--no-progress")
    assert res.exit_code == 0, res.output
    assert "steps    12" in res.output
    np.testing.assert_array_equal(GradientStore.open(a / "gradients.zarr").read(),
                                  GradientStore.open(b / "gradients.zarr").read())
    evals = [json.loads(x)["step"] for x in (b / "metrics.jsonl").read_text().splitlines() if "eval_loss" in x]
    assert evals == [5, 8, 9, 12]  # every 5 before the resume, every 3 after
    assert json.loads((b / "config.json").read_text())["eval_every"] == 3


def test_resume_past_a_target_epsilon_needs_the_explicit_flag(tmp_path):
    out = tmp_path / "e"
    assert invoke("collect", "--out", out, "--steps", 8, "--epsilon", 2, *LOWRANK).exit_code == 0
    line = error_line(invoke("collect", "--out", out, "--resume", "--steps", 12, "--no-progress"))
    assert "calibrated for epsilon = 2 over 8 steps" in line and "--allow-larger-epsilon" in line
    res = invoke("collect", "--out", out, "--resume", "--steps", 12, "--no-progress", "--allow-larger-epsilon")
    assert res.exit_code == 0, res.output
    store = GradientStore.open(out / "gradients.zarr")
    assert store.config["final_epsilon"] > 2.0
    assert f"epsilon = {store.config['final_epsilon']:.3f}" in res.output
    line = error_line(invoke("collect", "--out", tmp_path / "x", "--steps", 8, "--allow-larger-epsilon", *LOWRANK))
    assert "applies to --resume" in line


def test_resume_of_a_python_built_task_says_how_to_resume_it(tmp_path):
    from gradspec.collect import CollectConfig, collect
    from tests.collect._tiny import tiny_task

    collect(CollectConfig(steps=4, batch_size=8, eval_every=0), out=tmp_path / "api", task=tiny_task(),
            stop_after=2)
    line = error_line(invoke("collect", "--out", tmp_path / "api", "--resume", "--no-progress"))
    assert "built in Python" in line and "task=your_task" in line


def test_existing_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    assert invoke("collect", "--out", out, "--steps", 4, *LOWRANK).exit_code == 0
    before = GradientStore.open(out / "gradients.zarr").read()
    res = invoke("collect", "--out", out, "--steps", 4, *LOWRANK)
    assert res.exit_code != 0 and "--overwrite" in res.output
    np.testing.assert_array_equal(GradientStore.open(out / "gradients.zarr").read(), before)


def test_task_seed_fixes_the_data_while_the_seed_varies(tmp_path):
    """--task-seed seeds the task alone: the default (= --seed) gives the same rows, another does not."""
    def rows(name, *seeds):
        res = invoke("collect", "--out", tmp_path / name, "--steps", 4, *seeds, *LOWRANK)
        assert res.exit_code == 0, res.output
        return GradientStore.open(tmp_path / name / "gradients.zarr")

    a = rows("a", "--seed", 1, "--task-seed", 7)
    assert (a.config["collect"]["seed"], a.config["collect"]["task_seed"]) == (1, 7)
    same = rows("same", "--seed", 7, "--task-seed", 7)
    np.testing.assert_array_equal(same.read(), rows("default", "--seed", 7).read())
    # same batches and noise (seed 1), other task (7 vs 1): other rows
    assert not np.array_equal(a.read(), rows("own", "--seed", 1).read())


def test_task_help_names_every_registered_task():
    from cli._options import TASKS
    from gradspec.tasks import available_tasks

    assert available_tasks() == TASKS


def test_resume_verifies_the_store_before_training_a_step(tmp_path):
    """Issue 25: a committed chunk deleted, then `collect --resume` trained all remaining steps
    and only then exited "damaged". The resume now checks first: one line, nothing trained."""
    out = tmp_path / "run"
    assert invoke("collect", "--out", out, "--steps", 16, "--stop-after", 8, *LOWRANK).exit_code == 0
    chunk = out / "gradients.zarr" / "grads" / "c" / "0" / "0"
    assert chunk.is_file()
    chunk.unlink()
    metrics = (out / "metrics.jsonl").read_text()
    res = invoke("collect", "--out", out, "--resume")
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and "damaged" in lines[0] and "--overwrite" in lines[0], res.output
    assert (out / "metrics.jsonl").read_text() == metrics  # not one step trained
