"""The collect progress bar draws its last line once, at the run's average rate (issue 25: it
drew it twice, 1.50 s/step from the smoothed rate of the last update, then 1.51 step/s)."""

from __future__ import annotations

import re

import pytest
import tqdm.auto
from typer.testing import CliRunner

from cli.main import app

LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=20", "-t", "r=3", "--batch-size", "20"]


class _EveryUpdate(tqdm.auto.tqdm):
    """A bar that draws at every update (tqdm skips draws within 0.1 s; a tiny run is faster)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "mininterval": 0, "miniters": 1})


@pytest.mark.parametrize("steps", [1, 5])
def test_the_last_line_of_the_bar_is_drawn_once(tmp_path, monkeypatch, steps):
    monkeypatch.setattr(tqdm.auto, "tqdm", _EveryUpdate)
    res = CliRunner().invoke(app, ["collect", "--out", str(tmp_path / "run"), "--steps", str(steps), *LOWRANK])
    assert res.exit_code == 0, res.output
    draws = [d for d in re.split(r"[\r\n]", res.stderr) if d.startswith("collect:")]
    final = [d for d in draws if f"{steps}/{steps} [" in d]
    assert len(final) == 1, draws
    assert re.search(r"(step/s|s/step)", final[0])
    assert [d for d in draws if f" {steps - 1}/{steps} [" in d] or steps == 1  # earlier steps are drawn
