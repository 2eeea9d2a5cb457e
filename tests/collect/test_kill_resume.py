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
import pytest

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


KILL_AT_SECOND_CHECKPOINT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[2])
    import gradspec.train._loop as loop
    from gradspec.collect import collect
    from tests.collect.test_collect import cfg
    from tests.collect._tiny import tiny_task
    real, calls = loop.save_checkpoint, []
    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 and sys.argv[3] == "before":
            os._exit(9)  # killed before the checkpoint is written
        out = real(*args, **kwargs)
        if len(calls) == 2:
            os._exit(9)  # killed right after it
        return out
    loop.save_checkpoint = dying
    collect(cfg(steps=12, checkpoint_every=3, mode="per-example"), out=sys.argv[1], task=tiny_task())
    """
)


@pytest.mark.parametrize("when", ["before", "after"])
def test_killed_around_a_checkpoint_resumes(tmp_path, when):
    """A kill just before or just after the trainer writes a checkpoint leaves a run that
    resumes to the uninterrupted run's rows. (The writer used to save the checkpoint before
    advancing the committed count: a kill right after the save left a checkpoint ahead of the
    committed rows, and the resume refused.)"""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", KILL_AT_SECOND_CHECKPOINT, str(out),
                           str(HERE.parent.parent), when], timeout=300)
    assert proc.returncode == 9
    done = collect(out=out, task=tiny_task(), resume=True)
    ref = collect(cfg(steps=12, checkpoint_every=3, mode="per-example"), out=tmp_path / "ref",
                  task=tiny_task())
    a, b = GradientStore.open(ref.store), GradientStore.open(done.store)
    assert b.n_rows == a.n_rows
    np.testing.assert_array_equal(a.read(), b.read())
    assert metrics_without_time(ref.metrics) == metrics_without_time(done.metrics)
