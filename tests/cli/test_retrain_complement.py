"""`gradspec retrain -a complement`: training with the top-k subspace of a spectrum store
projected out (Song, Ahn & Yun 2025's control), through the CLI on the lowrank task, whose
gradients span exactly r = 3 dimensions: the complement of their top-3 learns nothing, the
top-3 itself learns as full training does."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

import gradspec
from cli.main import app
from gradspec.collect import collect
from gradspec.tasks import make_task
from tests.optim._cases import LOWRANK, config

runner = CliRunner()
TASK = ["--task", "lowrank", *(a for k, v in LOWRANK.items() for a in ("-t", f"{k}={v}"))]
COMMON = [*TASK, "--batch-size", "24", "--lr", "0.5", "--no-progress", "--no-train-metrics"]


@pytest.fixture(scope="module")
def spectrum(tmp_path_factory):
    """collect (noise-free) -> pca k = 3, as the README's retraining step does."""
    root = tmp_path_factory.mktemp("spectrum")
    collect(config(noise_multiplier=0.0, steps=6, checkpoint_every=6), out=root / "run")
    gradspec.pca(source=root / "run" / "gradients.zarr", k=3, out=root / "spectrum.zarr")
    return root / "spectrum.zarr"


def test_a_sweep_beside_the_subspace_learns_nothing_in_the_complement_of_all_gradients(tmp_path, spectrum):
    out = tmp_path / "sweep"
    res = runner.invoke(app, ["retrain", "--sweep", "-a", "subspace", "-a", "complement", "--ranks", "3",
                              "--noise-multipliers", "0", "--projector", str(spectrum), "--steps", "30",
                              "--eval-every", "30", "--no-plot", "--out", str(out), *COMMON])
    assert res.exit_code == 0, res.output
    # k = 3 is H's rank (the lowrank task's gradients span r = 3 dimensions): the complement keeps
    # none of them, so the run says so (issue 34 §6: it trained on noise alone without a word)
    assert "-a complement with k = 3 removes every direction of the gradients" in res.output
    rows = {r["algorithm"]: r for r in csv.DictReader((out / "summary.csv").read_text().splitlines())}
    assert set(rows) == {"subspace", "complement"} and rows["complement"]["rank"] == "3"
    task = make_task("lowrank", seed=0, **LOWRANK)
    start = task.eval.tensors["targets"].square().mean().item() / 2  # loss at w = 0
    assert float(rows["complement"]["eval_loss"]) == pytest.approx(start, rel=1e-4)
    assert float(rows["subspace"]["eval_loss"]) < 0.2 * start
    saved = json.loads((out / "complement-k3-seed0-nm0" / "retrain.json").read_text())
    assert saved["hooks"]["name"] == "complement"
    assert saved["hooks"]["projector"]["kind"] == "fixed"
    assert saved["hooks"]["projector"]["source"] == str(spectrum)


def test_one_private_run_reports_its_epsilon_and_the_subspace_caveat(tmp_path, spectrum):
    res = runner.invoke(app, ["retrain", "-a", "complement", "--rank", "2", "--projector", str(spectrum),
                              "--steps", "3", "--noise-multiplier", "1.0", "--out", str(tmp_path / "one"),
                              *COMMON])
    assert res.exit_code == 0, res.output
    assert "(complement, k = 2, 3 steps)" in res.output
    assert "removes every direction" not in res.output  # k = 2 < 3 keeps one of H's directions
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("privacy")]
    assert "NOT a DP guarantee" in line  # V came from the same private training data


def test_options_of_the_subspace_noise_are_refused_for_the_complement(tmp_path, spectrum):
    res = runner.invoke(app, ["retrain", "-a", "complement", "--rank", "2", "--projector", str(spectrum),
                              "--noise-in", "subspace", "--steps", "2", "--out", str(tmp_path / "x"), *COMMON])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "--noise-in applies to subspace, not to complement" in res.stderr
    help_text = runner.invoke(app, ["retrain", "--help"]).output
    assert "complement" in help_text


def test_a_spectrum_of_another_task_without_task_is_refused_before_any_model_is_built(tmp_path, spectrum,
                                                                                       monkeypatch):
    """retrain's default task is text: without --task, a lowrank spectrum was refused only after
    MiniLM was built, by a layout mismatch ("the basis has 1,000 rows but the run trains
    22,713,218 parameters"). Now the first line names the spectrum's task; no task is built."""
    import gradspec.tasks

    def no_task(*args, **kwargs):
        raise AssertionError("a task was built")

    monkeypatch.setattr(gradspec.tasks, "make_task", no_task)
    res = runner.invoke(app, ["retrain", "-a", "subspace", "--rank", "2", "--projector", str(spectrum),
                              "--steps", "2", "--out", str(tmp_path / "x"), "--no-progress"])
    assert res.exit_code != 0 and "Traceback" not in res.output, res.output
    assert ("is a spectrum of task 'lowrank' (the run its rows came from), but retrain trains --task text when "
            "--task is not given: pass --task lowrank with the run's -t options") in res.output
    assert not (tmp_path / "x").exists()
