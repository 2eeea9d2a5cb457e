"""An interrupted sweep continues its unfinished run from the run's last checkpoint (a long
retraining killed at a session's end loses at most ``checkpoint_every`` steps) and ends
exactly as an uninterrupted sweep; an interrupted run asked for with other settings is
replaced, and a resume under another algorithm or options is refused."""

from __future__ import annotations

import json
import logging

import pytest

from gradspec.optim import retrain, sweep

from ._cases import config, lowrank_task

ALGORITHMS = {
    "dp-sgd": ("dp-sgd", {}),
    "noisy-adagrad": ("noisy-adagrad", {"rank": 3, "projector": "random", "diagonal": True,
                                        "precond_noise_multiplier": 5.0}),
    "dp-adam": ("dp-adam", {}),  # asked for with Adam, run with plain SGD (its own direction)
}
#: what each sweep is asked for beyond the common config
ASKED = {"dp-adam": {"optimizer": "adam", "momentum": 0.9}}


def _metrics(run_dir) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in open(run_dir / "metrics.jsonl")]


def _sweep(out, algorithm, **kw):
    return sweep(config=config(steps=12, checkpoint_every=5, **kw), algorithms=[algorithm], seeds=[0],
                 noise_multipliers=[1.0], out=out, task_factory=lambda s: lowrank_task(seed=s))


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_an_interrupted_run_continues_and_ends_as_an_uninterrupted_one(tmp_path, killed_after, caplog, name):
    asked = ASKED.get(name, {})
    reference = _sweep(tmp_path / "ref", ALGORITHMS[name], **asked)[0]
    with killed_after(8), pytest.raises(KeyboardInterrupt):  # checkpoint at step 5, steps 6-8 done and lost
        _sweep(tmp_path / "cut", ALGORITHMS[name], **asked)
    run_dir = tmp_path / "cut" / f"{name}-seed0-nm1"
    assert not (run_dir / "retrain.json").exists()
    with caplog.at_level(logging.INFO, logger="gradspec.optim._retrain"):
        again = _sweep(tmp_path / "cut", ALGORITHMS[name], **asked)[0]
    assert "continuing the interrupted run" in caplog.text
    for key in ("eval_loss", "epsilon", "steps", "train_loss"):
        assert again[key] == reference[key], key  # exact: the same steps, noise and sampling
    assert _metrics(run_dir) == _metrics(tmp_path / "ref" / f"{name}-seed0-nm1")


def test_an_interrupted_run_with_other_settings_is_replaced(tmp_path, killed_after, caplog):
    with killed_after(8), pytest.raises(KeyboardInterrupt):
        _sweep(tmp_path / "cut", ALGORITHMS["dp-sgd"])
    with caplog.at_level(logging.INFO, logger="gradspec.optim._retrain"):
        again = _sweep(tmp_path / "cut", ALGORITHMS["dp-sgd"], lr=0.1)[0]
    assert [r.levelno for r in caplog.records if "replacing the interrupted run (other settings (lr))"
            in r.getMessage()] == [logging.WARNING]
    fresh = _sweep(tmp_path / "fresh", ALGORITHMS["dp-sgd"], lr=0.1)[0]
    assert again["eval_loss"] == fresh["eval_loss"]


def test_a_resume_under_other_options_is_refused_in_one_line(tmp_path, killed_after):
    name, options = ALGORITHMS["noisy-adagrad"]
    cfg = config(steps=12, checkpoint_every=5)
    with killed_after(8), pytest.raises(KeyboardInterrupt):
        retrain(config=cfg, algorithm=name, options=options, out=tmp_path, task=lowrank_task())
    with pytest.raises(ValueError, match="started with other caller settings") as err:
        retrain(config=cfg, algorithm=name, options={**options, "precond_noise_multiplier": 4.0}, out=tmp_path,
                task=lowrank_task(), resume=True)
    assert "\n" not in str(err.value)
    done = retrain(config=cfg, algorithm=name, options=options, out=tmp_path, task=lowrank_task(), resume=True)
    assert done.steps == 12


def test_a_finished_run_is_reused_under_other_bookkeeping(tmp_path, caplog):
    first = _sweep(tmp_path, ALGORITHMS["dp-sgd"])[0]
    with caplog.at_level(logging.INFO, logger="gradspec.optim._retrain"):
        again = sweep(config=config(steps=12, checkpoint_every=7, writer_queue=3), algorithms=["dp-sgd"], seeds=[0],
                      noise_multipliers=[1.0], out=tmp_path)[0]
    assert "reusing finished run" in caplog.text and again["eval_loss"] == first["eval_loss"]


def test_an_interrupted_run_without_a_record_of_its_algorithm_is_replaced(tmp_path, killed_after, caplog):
    # runs started before gradspec recorded run_info cannot be told apart from another algorithm's
    with killed_after(8), pytest.raises(KeyboardInterrupt):
        _sweep(tmp_path / "cut", ALGORITHMS["dp-sgd"])
    run_json = tmp_path / "cut" / "dp-sgd-seed0-nm1" / "run.json"
    saved = json.loads(run_json.read_text())
    del saved["run_info"]
    run_json.write_text(json.dumps(saved))
    with caplog.at_level(logging.INFO, logger="gradspec.optim._retrain"):
        again = _sweep(tmp_path / "cut", ALGORITHMS["dp-sgd"])[0]
    assert "replacing the interrupted run (other settings (no record of its algorithm))" in caplog.text
    assert again["eval_loss"] == _sweep(tmp_path / "fresh", ALGORITHMS["dp-sgd"])[0]["eval_loss"]
