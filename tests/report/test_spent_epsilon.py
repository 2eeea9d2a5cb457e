"""The privacy a run stopped early has spent: the accountant's at the step it stopped, not the
last `--log-every` record (found by review: stopped after 12 steps the CLI said ε = 2.664 and
the page 2.472, "spent by step 10"; stopped after 9, "not recorded yet")."""

from __future__ import annotations

import pytest

from gradspec.privacy import compute_epsilon
from gradspec.report._read import read_run
from gradspec.report._view import _epsilon
from gradspec.store import GradientStore

from .conftest import TRAIN, ok


@pytest.mark.parametrize("stop", [9, 12])
def test_a_stopped_run_reports_what_it_spent_where_it_stopped(tmp_path, stop):
    run = tmp_path / "run"
    ok("collect", "--out", run, "--steps", 24, "--stop-after", stop, "--epsilon", 2, "--log-every", 5,
       "--eval-every", 0, *TRAIN)
    cfg = GradientStore.open(run / "gradients.zarr").config
    want = compute_epsilon(noise_multiplier=cfg["noise_multiplier"], sample_rate=20 / 200, steps=stop,
                           delta=cfg["delta"])
    eps, note = _epsilon(read_run(run))
    assert eps == pytest.approx(want, rel=1e-9) and f"step {stop}" in note
    ok("collect", "--out", run, "--resume", "--steps", 24, "--no-progress")  # finished: its final epsilon
    eps, note = _epsilon(read_run(run))
    assert note == "" and eps == GradientStore.open(run / "gradients.zarr").config["final_epsilon"]
