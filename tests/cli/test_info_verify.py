"""`gradspec info` and `info --verify` on healthy and damaged stores; `pca` refuses a damaged one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import GradientStore
from tests.store.test_checksums import restamp_rows, rewrite_row

runner = CliRunner()

LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "0", "--checkpoint-every", "20",
           "--no-progress"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 40-step run: 40 rows in two row chunks of 32."""
    out = tmp_path_factory.mktemp("run")
    res = invoke("collect", "--out", out, "--steps", 40, *LOWRANK)
    assert res.exit_code == 0, res.output
    return out / "gradients.zarr"


@pytest.fixture
def store(run, tmp_path):
    """A private copy of the run's store, to damage."""
    import shutil

    path = tmp_path / "g.zarr"
    shutil.copytree(run, path)
    return path


def chunk(path, key):
    return os.path.join(path, *key.split("/"))


def rewrite(path, values):
    """Replace a chunk file with ``values`` and their valid crc32c (as zarr would write them)."""
    import google_crc32c

    raw = values.tobytes()
    with open(path, "wb") as f:
        f.write(raw + google_crc32c.value(raw).to_bytes(4, "little"))


def test_a_healthy_store(store):
    res = invoke("info", store)
    assert res.exit_code == 0 and "[complete]" in res.output and "DAMAGED" not in res.output
    res = invoke("info", store, "--verify", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "verify   10 chunks of committed rows read" in res.output and ": ok" in res.output


def test_a_deleted_chunk_is_reported_and_pca_refuses(store, tmp_path):
    os.remove(chunk(store, "grads/c/1/0"))
    res = invoke("info", store)
    assert res.exit_code == 1 and "[complete]" not in res.output and "[damaged]" in res.output
    assert "grads/c/1/0 (rows 32..39)" in res.output
    res = invoke("info", store, "--verify", "--no-progress")
    assert res.exit_code == 1 and "grads/c/1/0  rows 32..39  missing" in res.output
    as_json = invoke("info", store, "--verify", "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.output)["verify"]["damaged"] == [
        {"array": "grads", "chunk": "c/1/0", "rows": [32, 39], "problem": "missing"}
    ]
    # before: pca read the lost rows as zeros and exited 0 with a smaller sigma_1
    res = invoke("pca", store, "-k", 2, "--out", tmp_path / "spec.zarr", "--no-progress")
    assert res.exit_code != 0
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "grads/c/1/0" in errors[0] and "rows 32..39" in errors[0], res.output
    assert "Traceback" not in res.output


def test_a_truncated_chunk_and_non_finite_values(store):
    with open(chunk(store, "grads/c/0/0"), "r+b") as f:
        f.truncate(100)
    res = invoke("info", store, "--verify", "--no-progress")
    # 32 x 40 float32 and the chunk's 4-byte crc32c
    assert res.exit_code == 1 and "grads/c/0/0  rows 0..31  truncated: 100 bytes, expected 5124" in res.output
    # an inf written into a committed row with a valid checksum (bytes intact, value not: written
    # so by a writer, not changed on disk); a NaN loss would be the recorded "unknown" (see the
    # next test), an inf is never recorded
    loss = np.frombuffer(Path(chunk(store, "meta/loss/c/0")).read_bytes()[:-4], np.float32).copy()
    loss[5] = np.inf
    rewrite(chunk(store, "meta/loss/c/0"), loss)
    restamp_rows(store, ["meta/loss"])  # as a writer that stored it so (else "not this store's")
    res = invoke("info", store, "--verify", "--no-progress")
    assert "meta/loss: 1 NaN/inf values, in rows 5" in res.output
    # NaN in the gradient rows is damage
    vals = np.frombuffer(Path(chunk(store, "grads/c/1/0")).read_bytes()[:-4], np.float32).copy()
    vals[3] = np.nan  # rows 32..63, row-major
    # with the row checksums of a writer that stored it so (else the chunk is "not this store's")
    rewrite_row(store, 32, vals.reshape(32, -1)[0])
    res = invoke("info", store, "--verify", "--no-progress")
    assert res.exit_code == 1 and "grads: 1 NaN/inf values, in rows 32" in res.output


def test_a_recorder_store_without_losses_or_norms_verifies_ok(tmp_path):
    """NaN is how a recorder stores an unknown loss or unknown norm statistics: not damage."""
    import torch

    from gradspec.collect import GradientRecorder

    model = torch.nn.Linear(4, 2)
    with GradientRecorder(out=tmp_path / "run", model=model) as rec:
        for _ in range(3):
            model.zero_grad()
            model(torch.randn(5, 4)).sum().backward()
            rec.record_step(batch_size=5)
    meta = GradientStore.open(rec.path).row_meta()
    assert np.isnan(meta["loss"]).all() and np.isnan(meta["norm_mean"]).all()
    res = invoke("info", rec.path, "--verify", "--no-progress")
    assert res.exit_code == 0 and ": ok" in res.output, res.output


def test_a_float16_store_shows_what_the_conversion_lost(tmp_path):
    out = tmp_path / "run"
    res = invoke("collect", "--out", out, "--steps", 8, "--dtype", "float16", *LOWRANK)
    assert res.exit_code == 0, res.output
    res = invoke("info", out / "gradients.zarr")
    assert res.exit_code == 0 and "dtype    float16: " in res.output and "relative error" in res.output
    rep = GradientStore.open(out / "gradients.zarr").dtype_report
    assert rep["rows"] == 8 and rep["rel_error"] < 1e-3
