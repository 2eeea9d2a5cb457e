"""`gradspec retrain --out` into a folder that already holds a run: the refusal advises what
applies (issue 25) — --overwrite or another --out for a finished run, and --resume as well for
an interrupted one, which then continues it."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
RETRAIN = ["retrain", "--algorithm", "dp-sgd", "--task", "lowrank", "-t", "n=200", "-t", "d=20", "-t", "r=3",
           "--batch-size", "20", "--steps", "3", "--no-progress", "--no-train-metrics", "--no-plot"]


def test_retrain_into_a_finished_run_advises_overwrite_not_resume(tmp_path):
    out = str(tmp_path / "run")
    assert runner.invoke(app, [*RETRAIN, "--out", out]).exit_code == 0
    before = (tmp_path / "run" / "retrain.json").read_text()
    res = runner.invoke(app, [*RETRAIN, "--out", out])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "already holds a finished run: pass --overwrite to replace it or choose another --out" in lines[0]
    assert "--resume" not in lines[0]
    assert (tmp_path / "run" / "retrain.json").read_text() == before
    # what it advises works
    assert runner.invoke(app, [*RETRAIN, "--out", out, "--overwrite"]).exit_code == 0


def test_an_interrupted_run_is_continued_with_resume(tmp_path, killed_after):
    out = str(tmp_path / "run")
    longer = [*RETRAIN[:RETRAIN.index("--steps")], "--steps", "60", "--eval-every", "0", *RETRAIN[-3:]]
    with killed_after(55):  # the CLI checkpoints every 50 steps: resumes from step 50
        assert runner.invoke(app, [*longer, "--out", out]).exit_code != 0
    res = runner.invoke(app, [*longer, "--out", out])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "holds an interrupted run: pass --resume" in lines[0]
    res = runner.invoke(app, [*longer, "--out", out, "--resume"])
    assert res.exit_code == 0, res.output
    assert "60 steps" in res.output
    fresh = runner.invoke(app, [*longer, "--out", str(tmp_path / "fresh")])
    eval_line = [line for line in res.output.splitlines() if line.startswith("eval")]
    assert eval_line == [line for line in fresh.output.splitlines() if line.startswith("eval")]
    with_sweep = runner.invoke(app, [*longer, "--out", out, "--resume", "--sweep"])
    assert with_sweep.exit_code == 2 and "--resume is for one run" in with_sweep.stderr


def test_retrain_help_describes_backend_in_retrains_words():
    """Issue 34 §6: retrain's --backend help was collect's (--per-example --sketch, "recorded in the
    store"); retrain has neither a store nor those options."""
    res = CliRunner().invoke(app, ["retrain", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    start = text.index("--backend")
    backend = text[start : text.index("--", start + len("--backend ") + 20)]
    assert "adadps" in backend and "run.json" in backend, backend
    for collect_only in ("--sketch", "--per-example", "--mode", "store"):
        assert collect_only not in backend, backend
