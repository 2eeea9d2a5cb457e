"""`gradspec retrain --out` into a folder that already holds a run: the refusal advises what
`retrain` supports (--overwrite, another --out), not --resume, which it lacks (issue 25)."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
RETRAIN = ["retrain", "--algorithm", "dp-sgd", "--task", "lowrank", "-t", "n=200", "-t", "d=20", "-t", "r=3",
           "--batch-size", "20", "--steps", "3", "--no-progress", "--no-train-metrics", "--no-plot"]


def test_retrain_into_a_run_advises_overwrite_not_resume(tmp_path):
    out = str(tmp_path / "run")
    assert runner.invoke(app, [*RETRAIN, "--out", out]).exit_code == 0
    before = (tmp_path / "run" / "retrain.json").read_text()
    res = runner.invoke(app, [*RETRAIN, "--out", out])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "already holds a run: pass --overwrite to replace it or choose another --out" in lines[0]
    assert "--resume" not in lines[0]
    assert (tmp_path / "run" / "retrain.json").read_text() == before
    # what it advises works
    assert runner.invoke(app, [*RETRAIN, "--out", out, "--overwrite"]).exit_code == 0
    assert "--resume" not in runner.invoke(app, ["retrain", "--help"]).output  # the flag it must not advise
