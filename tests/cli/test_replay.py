"""`gradspec replay` (issue 37 §4): collect --sketch (per-step rows) -> pca -> replay -> retrain
--projector, on the CNN task (Conv2d, Linear, biases); a run that does not replay bit for bit is
refused in one line naming the step, exit non-zero, nothing written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import zarr
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import SpectrumStore
from tests.store.test_checksums import rewrite_row

runner = CliRunner()

CNN = ["--task", "cnn", "-t", "n_train=200", "--batch-size", "6", "--sampling", "shuffle", "--eval-every", "0",
       "--no-progress", "--noise-multiplier", "1.0", "-C", "0.5", "--steps", "4"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # the replay sums in the collect run's order
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    res = invoke("collect", "--out", root / "sketch", *CNN, "--sketch", "1024", "--sketch-blocks", "4")
    assert res.exit_code == 0, res.output
    res = invoke("pca", root / "sketch" / "gradients.zarr", "--k", 3, "--out", root / "spec", "--no-progress")
    assert res.exit_code == 0, res.output
    return root


def test_replay_writes_a_spectrum_that_retrain_takes(run, tmp_path):
    res = invoke("replay", run / "sketch" / "gradients.zarr", "--spectrum", run / "spec", "--out", tmp_path / "v",
                 "--no-progress")
    assert res.exit_code == 0, res.output
    assert "replayed 4 steps: 4 rows checked against the store, 4 bit for bit" in res.output
    assert "V: 3 directions of p = 26010 in parameter space from K = 3" in res.output
    assert "residuals not measured: ||H v_i - sigma_i u_i|| / sigma_i <= " in res.output, res.output
    checked = invoke("replay", run / "sketch" / "gradients.zarr", "--spectrum", run / "spec", "--out",
                     tmp_path / "c", "--no-progress", "--check")
    assert checked.exit_code == 0 and "residuals measured (one more replay)" in checked.output, checked.output
    assert "2 replay(s)" in checked.output
    v = SpectrumStore.open(tmp_path / "v")
    assert v.status == "complete" and v.shape == (4, 26_010) and v.method == "replay"
    np.testing.assert_allclose(v.read_v().T.astype(np.float64) @ v.read_v(), np.eye(3), atol=1e-6)
    # an existing --out is kept without --overwrite
    again = invoke("replay", run / "sketch" / "gradients.zarr", "--spectrum", run / "spec", "--out", tmp_path / "v")
    assert again.exit_code != 0 and "--overwrite" in again.output
    train = ["--steps", "2", "--task", "cnn", "-t", "n_train=200", "--batch-size", "6", "--eval-every", "0",
             "--no-progress"]
    res = invoke("retrain", "-o", tmp_path / "rt", "-a", "subspace", "--projector", tmp_path / "v", "-k", 2, *train)
    assert res.exit_code == 0, res.output
    res = invoke("retrain", "-o", tmp_path / "rt2", "-a", "subspace", "--projector", run / "spec", "-k", 2, *train)
    assert res.exit_code != 0 and "gradspec replay STORE --spectrum SPECTRUM --out V" in res.output


def test_a_run_that_does_not_replay_is_refused_in_one_line(run, tmp_path):
    shutil.copytree(run / "sketch", tmp_path / "sketch")
    grads = zarr.open_group(tmp_path / "sketch" / "gradients.zarr", mode="r+")["grads"]
    row = grads[2]
    row[0] += 1e-2 * np.abs(row).max()
    rewrite_row(tmp_path / "sketch" / "gradients.zarr", 2, row)
    res = invoke("replay", tmp_path / "sketch" / "gradients.zarr", "--spectrum", run / "spec", "--out",
                 tmp_path / "v", "--no-progress")
    assert res.exit_code != 0 and "Traceback" not in res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.output
    assert errors[0].startswith("error: step 2 (row 2) does not replay: its recomputed sketch differs from the "
                                "stored row by "), errors[0]
    assert not (tmp_path / "v").exists()


def test_decay_of_a_replayed_spectrum(run, tmp_path):
    """K = r (pca --k 4 of the 4 steps): decay forms the own rows' G_k from the replayed spectrum;
    K = 3 < r: σ fitted, one warning line saying why there is no G_k and how to get it, exit 0;
    --heldout-rows of the sketched store: one error line (was, for each: "... has no parameter
    'conv1.weight' ...: it holds gradients of another model or parameter selection")."""
    store = run / "sketch" / "gradients.zarr"
    res = invoke("pca", store, "--k", 4, "--out", tmp_path / "spec4", "--no-progress")
    assert res.exit_code == 0, res.output
    for spec, out in ((tmp_path / "spec4", tmp_path / "v4"), (run / "spec", tmp_path / "v3")):
        res = invoke("replay", store, "--spectrum", spec, "--out", out, "--no-progress")
        assert res.exit_code == 0, res.output
    res = invoke("decay", tmp_path / "v4", "--out", tmp_path / "d4", "--every-rank", "--no-plots", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "G_k_collected: G_k (max) decays like" in res.output and "WARNING" not in res.output
    report = json.loads((tmp_path / "d4" / "report.json").read_text())
    assert report["sources"]["collected"]["measured"].startswith("from the replayed spectrum's U and sigma (K = r")
    assert report["rows"]["collected"]["G_k"]["ks"] == [0, 1, 2, 3, 4]
    res = invoke("decay", tmp_path / "v3", "--out", tmp_path / "d3", "--no-plots", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "spectrum_fit:" in res.output and "G_k_collected" not in res.output
    warned = [line for line in res.output.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1 and "G_k not computed on the replayed spectrum's own rows (sigma fitted only): the " \
        "replay used K = 3 of the r = 4 directions" in warned[0] and "gradspec pca SKETCHED --k 4" in warned[0], res.output
    res = invoke("decay", tmp_path / "v4", "--out", tmp_path / "dh", "--heldout-rows", "0:2", "--no-plots")
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert res.exit_code != 0 and len(errors) == 1 and "Traceback" not in res.output, res.output
    assert errors[0].startswith("error: --heldout-rows of a replayed spectrum need unsketched rows"), errors[0]
