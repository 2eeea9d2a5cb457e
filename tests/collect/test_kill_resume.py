"""SIGKILL a real collect run, then resume it: the store equals an uninterrupted run's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from gradspec.collect import collect
from gradspec.store import GradientStore

from ._tiny import tiny_task
from .test_collect import cfg, metrics_without_time

HERE = Path(__file__).parent

SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from gradspec.collect import collect
    from tests.collect.test_collect import cfg
    from tests.collect._tiny import tiny_task
    collect(cfg(steps=40, checkpoint_every=3, mode="per-example"), out=sys.argv[1], task=tiny_task())
    """
)


def test_sigkill_then_resume(tmp_path):
    out = tmp_path / "run"
    root = str(HERE.parent.parent)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out), root])
    ckpt = out / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not ckpt.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.15)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.exists(), "the run was killed before its first checkpoint"
    killed = GradientStore.open(out / "gradients.zarr")
    assert killed.status == "writing"
    n_killed = killed.n_rows
    np.testing.assert_array_equal(np.isfinite(killed.read()), True)

    # The killed run's lock file still names it, but the kernel dropped the lock with the process.
    assert f'"pid": {proc.pid}' in (out / ".gradspec.lock").read_text()
    done = collect(out=out, task=tiny_task(), resume=True)
    ref = collect(cfg(steps=40, checkpoint_every=3, mode="per-example"), out=tmp_path / "ref", task=tiny_task())
    a, b = GradientStore.open(ref.store), GradientStore.open(done.store)
    assert b.n_rows == a.n_rows >= n_killed
    np.testing.assert_array_equal(a.read(), b.read())
    np.testing.assert_array_equal(a.row_meta()["example_index"], b.row_meta()["example_index"])
    assert metrics_without_time(ref.metrics) == metrics_without_time(done.metrics)
