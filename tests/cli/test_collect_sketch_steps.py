"""`gradspec collect --sketch M` without `--per-example` (issue 37 §3): each step's mean clipped
gradient, the paper's row, sketched, on the CNN task (Conv2d, Linear, biases), against the
unsketched per-step run of the same seed; `gradspec info` says why the stored width is below
the one asked for; an M at or above p is refused in one line, nothing written."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from gradspec.sketch import SketchPlan, sketch_rows
from gradspec.store import GradientStore

runner = CliRunner()

CNN = ["--task", "cnn", "-t", "n_train=200", "--batch-size", "6", "--sampling", "shuffle", "--eval-every", "0",
       "--no-progress", "--noise-multiplier", "1.0", "-C", "0.5", "--steps", "3"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # the two runs sum in one order, so that they take the same steps bit for bit
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("steps")
    for name, extra in (("exact", []), ("sketch", ["--sketch", "1024", "--sketch-blocks", "4"])):
        res = invoke("collect", "--out", root / name, *CNN, *extra)
        assert res.exit_code == 0, res.output
    return root


def test_rows_are_the_sketch_of_the_exact_per_step_rows(runs):
    exact, sketched = (GradientStore.open(runs / n / "gradients.zarr") for n in ("exact", "sketch"))
    assert not sketched.per_example and exact.n_rows == sketched.n_rows == 3
    sk = sketched.sketch
    assert sk["p"] == exact.p == 26_010 and sk["requested_M"] == 1024 and sketched.p == sk["M"] <= 1024
    plan = SketchPlan.from_dict(sk)
    want = sketch_rows(plan, torch.from_numpy(exact.read())).numpy()
    # the recording sketches in float32: ~1e-6 of the largest value (another plan differs by O(1))
    np.testing.assert_allclose(sketched.read(), want, rtol=1e-5, atol=2e-6 * np.abs(want).max())
    np.testing.assert_array_equal(sketched.row_meta()["loss"], exact.row_meta()["loss"])
    # the stored width, and why it is below the asked one, in the store and in one info line
    res = invoke("info", runs / "sketch" / "gradients.zarr")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("sketch "))
    assert f"M = {sk['M']:,} columns" in lines[i] and "of p = 26,010 unsketched" in lines[i]
    if sk["M"] < 1024:  # (the plan's rules decide; 1,010 when this was written)
        assert sk["width_note"].startswith(f"asked 1,024, stored {sk['M']:,} because ")
        assert lines[i + 1].strip() == sk["width_note"] and "exactly (counted in M)" in lines[i + 1]
    else:
        assert "width_note" not in sk and lines[i + 1].startswith("layout ")
    res = invoke("pca", runs / "sketch" / "gradients.zarr", "--k", 2, "--out", runs / "spectrum.zarr")
    assert res.exit_code == 0 and "sketch: M=" in res.output, res.output


@pytest.mark.parametrize("m", [26_010, 100_000, 2**40])
def test_an_m_at_or_above_p_is_refused_in_one_line_and_nothing_is_written(tmp_path, m):
    res = invoke("collect", "--out", tmp_path / "run", *CNN, "--sketch", m)
    assert res.exit_code != 0 and "is not below p = 26,010" in res.output and "--sketch 26009 or less" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "run").exists()



LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20", "--no-progress",
           "--steps", "2", "--eval-every", "0"]


@pytest.mark.parametrize(("common", "bad", "advice", "fixes"), [
    (CNN, ["--sketch", "30"], "give --sketch >= 64 or --sketch-blocks 3 or fewer",
     [["--sketch", "64"], ["--sketch", "30", "--sketch-blocks", "3"]]),
    # the lowrank task's one 40-column weight: the advice was "--sketch >= 40", refused as not below p
    (LOWRANK, ["--sketch", "39", "--sketch-blocks", "40"], "give --sketch-blocks 39 or fewer",
     [["--sketch", "39", "--sketch-blocks", "39"]]),
])
def test_too_few_columns_for_the_blocks_is_refused_with_advice_that_works(tmp_path, common, bad, advice, fixes):
    res = invoke("collect", "--out", tmp_path / "run", *common, *bad)
    assert res.exit_code != 0 and "columns per block" in res.output and advice in res.output, res.output
    for n, fix in enumerate(fixes):  # each piece of advice, taken, runs
        res = invoke("collect", "--out", tmp_path / f"ok{n}", *common, *fix)
        assert res.exit_code == 0, res.output
