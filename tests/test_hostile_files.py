"""Files from someone else never run code: every reader of a pickle-capable format refuses a
payload with a one-line error and executes nothing (issue 25).

The payload is a real pickle whose ``__reduce__`` would create a marker file; each test
checks the marker is never created and the error is one line.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from gradspec.optim import load_side_information, make_algorithm, retrain
from gradspec.train._checkpoint import CHECKPOINT_FORMAT, load_checkpoint

from .optim._cases import config, lowrank_task


class _Payload:
    """Unpickling this runs ``os.system`` (creating a marker file): what a hostile file holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile(path: Path, marker: Path, **extra) -> Path:
    torch.save({"format": CHECKPOINT_FORMAT, **extra, "payload": _Payload(marker)}, path)
    return path


def _one_line(message: str) -> None:
    assert message and "\n" not in message.strip() and "Traceback" not in message, message


def test_a_hostile_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    with pytest.raises(ValueError) as err:
        load_checkpoint(_hostile(tmp_path / "checkpoint.pt", marker), required=("step",))
    assert not marker.exists()
    _one_line(str(err.value))
    assert "could run code" in str(err.value) and "--overwrite" in str(err.value)


LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "5", "--checkpoint-every", "4",
           "--no-progress"]


def test_collect_resume_of_a_run_with_a_hostile_checkpoint_runs_nothing(tmp_path):
    """`gradspec collect --resume --out <folder>` with a planted checkpoint.pt: exit 1, one line."""
    out, marker = tmp_path / "run", tmp_path / "marker"
    runner = CliRunner()
    first = runner.invoke(app, ["collect", "--out", str(out), "--steps", "8", "--stop-after", "4", *LOWRANK])
    assert first.exit_code == 0, first.output
    good = torch.load(out / "checkpoint.pt", weights_only=True)
    _hostile(out / "checkpoint.pt", marker, **{k: v for k, v in good.items() if k != "format"})
    res = runner.invoke(app, ["collect", "--out", str(out), "--resume"])
    assert res.exit_code != 0 and not marker.exists()
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "could run code" in lines[0], res.output


@pytest.mark.parametrize("algorithm, options", [
    ("dp-sgd", {}), ("pdp-sgd", {"rank": 2}), ("rpdp-sgd", {"rank": 2}),
    ("noisy-adagrad", {"rank": 2}), ("adadps", {}), ("dp-adam", {}),
])
def test_every_algorithms_checkpoint_loads_without_pickles(tmp_path, algorithm, options):
    """What the trainer and every optimizer hook save is tensors and plain values only, so
    resuming never needs the unrestricted unpickler."""
    retrain(config=config(steps=3), algorithm=make_algorithm(algorithm, **options), out=tmp_path,
            task=lowrank_task())
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["format"] == CHECKPOINT_FORMAT and state["step"] == 3
    loaded = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded.keys() == state.keys() and loaded["hooks"].keys() == state["hooks"].keys()


def test_a_hostile_side_information_file_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    pt = tmp_path / "side.pt"
    torch.save(_Payload(marker), pt)
    obj = tmp_path / "side.npy"
    np.save(obj, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    wrong = tmp_path / "dict.pt"
    torch.save({"a": torch.ones(3)}, wrong)
    text = tmp_path / "side.txt"
    text.write_text("1 2 x")
    for path, why in ((pt, "could run code"), (obj, "allow_pickle"), (wrong, "not a tensor"),
                      (text, "x")):
        with pytest.raises(ValueError) as err:
            load_side_information(path, p=3)
        _one_line(str(err.value))
        assert why in str(err.value) and str(path) in str(err.value), str(err.value)
    assert not marker.exists()
    good = tmp_path / "good.pt"
    torch.save(torch.tensor([1.0, 2.0, 3.0]), good)
    assert load_side_information(good, p=3).tolist() == [1.0, 2.0, 3.0]
