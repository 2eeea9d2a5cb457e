"""Sweeps: seeds that should differ do, stale runs are not reused, the CLI refuses ignored options."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from gradspec.optim import retrain, sweep
from gradspec.optim._result import _digest as result_digest

from ._cases import config, lowrank_task


def _hooks(run_dir) -> dict:
    return json.loads((run_dir / "retrain.json").read_text())["hooks"]


def test_the_random_projector_follows_the_run_seed(tmp_path):
    """Before, every run used seed 0 (library) or the CLI's --seed: the "seeds" of a sweep
    shared one random subspace and one set of public examples."""
    sweep(config=config(steps=2), algorithms=["rpdp-sgd", "pdp-sgd"], ranks=[2], seeds=[0, 1],
          noise_multipliers=[1.0], out=tmp_path, task_factory=lambda s: lowrank_task(seed=s))
    seeds = [_hooks(tmp_path / f"rpdp-sgd-k2-seed{s}-nm1")["projector"]["seed"] for s in (0, 1)]
    assert seeds == [0, 1]
    public = [_hooks(tmp_path / f"pdp-sgd-k2-seed{s}-nm1")["projector"] for s in (0, 1)]
    assert [p["seed"] for p in public] == [0, 1]
    # an explicit seed is kept: the same subspace for every run seed
    fixed = tmp_path / "fixed"
    sweep(config=config(steps=2), algorithms=[("rpdp-sgd", {"seed": 7})], ranks=[2], seeds=[0, 1],
          out=fixed, task_factory=lambda s: lowrank_task(seed=s))
    assert {_hooks(d)["projector"]["seed"] for d in fixed.iterdir() if d.is_dir()} == {7}
    res = retrain(config=config(steps=2, seed=5), algorithm="rpdp-sgd", options={"rank": 2},
                  out=tmp_path / "one", task=lowrank_task(seed=5))
    assert res.options["seed"] == 5 and res.hooks["projector"]["seed"] == 5


def test_a_finished_run_with_other_settings_is_not_reused(tmp_path):
    sweep(config=config(steps=2), algorithms=["dp-sgd"], seeds=[0], out=tmp_path,
          task_factory=lambda s: lowrank_task(seed=s))
    again = sweep(config=config(steps=2), algorithms=["dp-sgd"], seeds=[0], out=tmp_path)
    assert len(again) == 1  # same settings: reused
    with pytest.raises(ValueError, match=r"other settings \(lr: 0.3 -> 0.1\).*overwrite"):
        sweep(config=config(steps=2, lr=0.1), algorithms=["dp-sgd"], seeds=[0], out=tmp_path)
    sweep(config=config(steps=2), algorithms=[("adadps", {"public_size": 10})], seeds=[0],
          out=tmp_path / "b", task_factory=lambda s: lowrank_task(seed=s))
    with pytest.raises(ValueError, match="options"):
        sweep(config=config(steps=2), algorithms=[("adadps", {"public_size": 20})], seeds=[0],
              out=tmp_path / "b")


def test_a_run_finished_under_the_old_sigma_name_is_reused(tmp_path):
    """Runs were named ``...-sigma<z>`` while sigma meant the noise multiplier; they are now
    ``...-nm<z>``. A sweep resumed over an old directory reuses the old run, not reruns it."""
    first = sweep(config=config(steps=2), algorithms=["dp-sgd"], seeds=[0], noise_multipliers=[1.0],
                  out=tmp_path, task_factory=lambda s: lowrank_task(seed=s))
    assert first[0]["out"] == str(tmp_path / "dp-sgd-seed0-nm1")
    old = tmp_path / "dp-sgd-seed0-sigma1"
    (tmp_path / "dp-sgd-seed0-nm1").rename(old)  # as an old sweep left it
    saved = json.loads((old / "retrain.json").read_text())
    saved.update(out=str(old), metrics=str(old / "metrics.jsonl"))
    saved["digest"] = result_digest(saved)
    (old / "retrain.json").write_text(json.dumps(saved))
    again = sweep(config=config(steps=2), algorithms=["dp-sgd"], seeds=[0], noise_multipliers=[1.0],
                  out=tmp_path, task_factory=lambda s: pytest.fail("the finished run was rerun"))
    assert again[0]["out"] == str(tmp_path / "dp-sgd-seed0-sigma1")
    assert again[0]["epsilon"] == first[0]["epsilon"] and not (tmp_path / "dp-sgd-seed0-nm1").exists()
    with pytest.raises(ValueError, match=r"other settings \(lr: 0.3 -> 0.1\)"):  # still checked
        sweep(config=config(steps=2, lr=0.1), algorithms=["dp-sgd"], seeds=[0], noise_multipliers=[1.0],
              out=tmp_path)


def test_cli_sigma_still_works_as_a_deprecated_alias(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(_app(), ["retrain-command", "--out", str(out), *LOWRANK_ARGS,
                                         "-a", "dp-sgd", "--sigma", "0.7"])
    assert result.exit_code == 0, result.output
    assert "warning: --sigma is deprecated, use --noise-multiplier" in result.stderr
    assert "noise multiplier = 0.7" in result.stdout and "sigma" not in result.stdout.replace(str(out), "")
    assert json.loads((out / "retrain.json").read_text())["noise_multiplier"] == 0.7


def test_an_algorithm_listed_twice_gets_one_run_directory_per_entry(tmp_path):
    """Before, both entries wrote the same directory and the second reused the first's result."""
    rows = sweep(config=config(steps=2), out=tmp_path, ranks=[2], seeds=[0],
                 algorithms=[("pdp-sgd", {"period": 1}), ("pdp-sgd", {"period": 2})],
                 task_factory=lambda s: lowrank_task(seed=s))
    outs = {r["out"] for r in rows}
    assert len(outs) == 2
    periods = sorted(json.loads((tmp_path / o.split("/")[-1] / "retrain.json").read_text())
                     ["hooks"]["projector"]["period"] for o in outs)
    assert periods == [1, 2]


def _app():
    from cli.retrain import retrain_command

    app = typer.Typer()
    app.command()(retrain_command)
    app.command("noop")(lambda: None)
    return app


LOWRANK_ARGS = ["--task", "lowrank", "-t", "n=120", "-t", "d=16", "-t", "n_eval=60", "--steps", "2",
                "--batch-size", "24", "--accounting", "rdp", "--no-progress"]


@pytest.mark.parametrize(("args", "message"), [
    (["-a", "dp-sgd", "--projector", "random"], "--projector applies to"),
    (["-a", "dp-sgd", "--rank", "4"], "--rank applies to"),
    (["-a", "pdp-sgd", "--rank", "2", "--rule", "adam"], "--rule applies to adadps"),
    (["-a", "adadps", "--period", "3"], "--period applies to"),
    (["-a", "dp-sgd", "--noise-multiplier", "1", "--epsilon", "2"], "--noise-multiplier or --epsilon, not both"),
    (["-a", "dp-sgd", "--noise-multiplier", "1", "--sigma", "1"], "(--sigma is its deprecated alias), not both"),
    (["-a", "dp-sgd", "--sweep", "--noise-multipliers", "1", "--sigmas", "2"], "--sigmas is its deprecated alias"),
    (["-a", "dp-sgd", "--epochs", "1"], "--steps or --epochs, not both"),
    (["-a", "dp-sgd", "--seeds", "0,1"], "--seeds is for --sweep"),
    (["-a", "rpdp-sgd", "--sweep", "--rank", "3"], "--ranks, not --rank"),
])
def test_cli_refuses_options_it_would_ignore(tmp_path, args, message):
    result = CliRunner().invoke(_app(), ["retrain-command", "--out", str(tmp_path / "x"),
                                         *LOWRANK_ARGS, *args])
    assert result.exit_code != 0 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1  # one readable line


def test_cli_run_reports_train_and_eval_and_public(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(_app(), ["retrain-command", "--out", str(out), *LOWRANK_ARGS,
                                         "-a", "pdp-sgd", "--rank", "2", "--public-size", "30",
                                         "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "train    train_loss" in result.output and "(n = 60)" in result.output
    saved = json.loads((out / "retrain.json").read_text())
    assert saved["hooks"]["projector"]["seed"] == 3 and len(saved["hooks"]["projector"]["public_ids"]) == 30
