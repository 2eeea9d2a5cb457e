"""A finished run's retrain.json is what a resumed sweep reuses and its summary lists: it
carries the SHA-256 of its values (a flipped bit of ε went straight into summary.json with exit
code 0), and it and a training-only run's run.json are read only as regular files (a FIFO at
either name blocked the sweep or the resume forever)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil

import pytest

from gradspec.optim import read_result, sweep
from gradspec.train import TrainConfig
from gradspec.train._checkpoint import saved_run_config

from .._waits import returns_within

CFG = TrainConfig(task="lowrank", task_options=dict(n=120, n_eval=60, d=16, r=3), steps=3, batch_size=24,
                  noise_multiplier=1.0, optimizer="sgd", lr=0.3, eval_every=0, log_every=4, checkpoint_every=4,
                  accounting="rdp", microbatch=None)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "s"
    sweep(config=CFG, algorithms=["dp-sgd"], out=out, train_metrics=False)
    return out


@pytest.fixture
def swept(finished, tmp_path):
    out = tmp_path / "s"
    shutil.copytree(finished, out)
    return out, next(p for p in out.iterdir() if p.is_dir())




def test_a_flipped_bit_in_a_finished_runs_epsilon_is_refused_not_reused(swept):
    out, run = swept
    path = run / "retrain.json"
    eps = read_result(run).epsilon
    raw = bytearray(path.read_bytes())
    digit = re.search(rb'"epsilon": ([0-9])', bytes(raw))
    raw[digit.start(1)] ^= 0x01  # one bit of its first digit
    path.write_bytes(bytes(raw))
    assert json.loads(path.read_text())["epsilon"] != eps
    with pytest.raises(ValueError, match="do not match the digest") as err:
        read_result(run)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="do not match the digest"):
        sweep(config=CFG, algorithms=["dp-sgd"], out=out, train_metrics=False)


def test_a_result_written_before_the_digest_is_reused_with_a_warning(swept, caplog):
    out, run = swept
    path = run / "retrain.json"
    saved = json.loads(path.read_text())
    saved.pop("digest")
    path.write_text(json.dumps(saved))
    with caplog.at_level(logging.WARNING, logger="gradspec.optim._result"):
        rows = sweep(config=CFG, algorithms=["dp-sgd"], out=out, train_metrics=False)
    assert rows[0]["epsilon"] == saved["epsilon"] and "cannot be verified" in caplog.text


def test_a_fifo_at_another_runs_result_is_left_out_of_the_summary_not_waited_on(swept, caplog):
    out, _ = swept
    (out / "other").mkdir()
    os.mkfifo(out / "other" / "retrain.json")  # no writer: a blocking open waits forever
    with caplog.at_level(logging.WARNING, logger="gradspec.optim._summary"):
        kind, _ = returns_within(lambda: sweep(config=CFG, algorithms=["dp-sgd"], out=out, train_metrics=False))
    assert kind == "ok" and "not a regular file" in caplog.text
    assert len(json.loads((out / "summary.json").read_text())) == 1


def test_a_fifo_in_place_of_run_json_is_refused_not_waited_on(swept):
    _, run = swept
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    kind, err = returns_within(lambda: saved_run_config(run))
    assert kind == "raised" and isinstance(err, ValueError) and "not a regular file" in str(err), err
