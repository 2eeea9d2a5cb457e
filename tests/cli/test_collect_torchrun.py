"""`torchrun --nproc_per_node 2 --no-python gradspec collect ...` (the README's command), 2 gloo
processes on the CPU, against `gradspec collect` in one process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import GradientStore

OPTIONS = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20", "--steps", "10",
           "--epsilon", "2", "--lr", "0.05", "--optimizer", "sgd", "--checkpoint-every", "4", "--no-progress"]


@pytest.mark.slow
def test_torchrun_gradspec_collect_equals_one_process(tmp_path):
    gradspec = shutil.which("gradspec")
    if gradspec is None:
        pytest.skip("the gradspec console script is not on PATH")
    out = tmp_path / "two"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--no-python",
         gradspec, "collect", "--out", str(out), *OPTIONS],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("store ") == 1  # rank 0 reports; rank 1 says nothing
    assert "(10 rows)" in proc.stdout and "epsilon = 1.999" in proc.stdout
    assert proc.stderr.count("per-example backend") == 1  # rank 1 logs warnings only

    one = CliRunner().invoke(app, ["collect", "--out", str(tmp_path / "one"), *OPTIONS])
    assert one.exit_code == 0, one.output
    a, b = GradientStore.open(tmp_path / "one" / "gradients.zarr"), GradientStore.open(out / "gradients.zarr")
    assert b.status == "complete" and b.layout.to_list() == a.layout.to_list()
    np.testing.assert_array_equal(b.row_meta()["batch_size"], a.row_meta()["batch_size"])
    np.testing.assert_allclose(b.read(), a.read(), atol=1e-6, rtol=1e-5)  # see tests/train/test_distributed.py
    for key in ("final_epsilon", "noise_multiplier", "sample_rate"):
        assert b.config[key] == a.config[key]
    info = CliRunner().invoke(app, ["info", str(out / "gradients.zarr")])
    assert info.exit_code == 0 and "on 2 processes" in info.output, info.output


@pytest.mark.gpu
@pytest.mark.slow
def test_torchrun_on_two_gpus_equals_one_gpu(tmp_path):
    """NCCL on 2 GPUs (skipped with fewer). Unverified on the machine this was written on (no GPU)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    gradspec = shutil.which("gradspec")
    if gradspec is None:
        pytest.skip("the gradspec console script is not on PATH")
    options = [*OPTIONS, "--device", "cuda"]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--no-python",
         gradspec, "collect", "--out", str(tmp_path / "two"), *options],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(nccl" in proc.stderr or "cuda:nccl" in proc.stderr
    one = CliRunner().invoke(app, ["collect", "--out", str(tmp_path / "one"), *options])
    assert one.exit_code == 0, one.output
    a, b = (GradientStore.open(tmp_path / d / "gradients.zarr") for d in ("one", "two"))
    np.testing.assert_array_equal(b.row_meta()["batch_size"], a.row_meta()["batch_size"])
    np.testing.assert_allclose(b.read(), a.read(), atol=1e-5, rtol=1e-4)  # GPU reductions: a looser rounding
    assert b.config["final_epsilon"] == a.config["final_epsilon"]
