"""A run directory has one writer at a time, and --overwrite never clears what is not a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.collect import collect, is_run_dir
from gradspec.store import GradientStore
from gradspec.store._lock import LOCK_NAME, DirectoryBusyError, RunLock
from gradspec.train import StepHooks

from ._tiny import tiny_task
from .test_collect import cfg

ROOT = str(Path(__file__).parent.parent.parent)

# A long run (killed by the test): collect into argv[1] once the file argv[2] exists.
LONG_RUN = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[3])
    from gradspec.collect import collect
    from tests.collect.test_collect import cfg
    from tests.collect._tiny import tiny_task
    task = tiny_task()
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.005)
    collect(cfg(steps=100_000, checkpoint_every=3, log_every=1), out=sys.argv[1], task=task, overwrite=True)
    """
)


def start_long_run(out: Path, go: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LONG_RUN, str(out), str(go), ROOT],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.communicate()[1][-2000:]}")
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.02)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()


def test_lock_is_exclusive_reentrant_per_thread_and_names_its_owner(tmp_path):
    lock = RunLock(tmp_path / "d", what="run directory")
    with lock:
        owner = json.loads((tmp_path / "d" / LOCK_NAME).read_text())
        assert owner["pid"] == os.getpid() and owner["host"] and owner["started"]
        with RunLock(tmp_path / "d"):  # the same thread may lock again (a writer calling a writer)
            pass
        assert lock.held
        errors = []

        def other_thread():
            try:
                RunLock(tmp_path / "d").acquire()
            except DirectoryBusyError as exc:
                errors.append(exc)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert len(errors) == 1 and f"pid {os.getpid()}" in str(errors[0])
    assert not lock.held and (tmp_path / "d" / LOCK_NAME).read_text() == ""
    with RunLock(tmp_path / "d"):  # free again
        pass


def test_a_second_writer_fails_fast_naming_the_owner_and_a_killed_owner_leaves_no_stale_lock(tmp_path):
    out, go = tmp_path / "run", tmp_path / "go"
    go.touch()
    proc = start_long_run(out, go)
    try:
        wait_for(out / "checkpoint.pt", proc)
        config_before = (out / "config.json").read_text()
        rows_before = GradientStore.open(out / "gradients.zarr").n_rows

        t0 = time.monotonic()
        with pytest.raises(DirectoryBusyError, match=rf"in use by pid {proc.pid}\b"):
            collect(cfg(steps=4), out=out, task=tiny_task(), overwrite=True)
        assert time.monotonic() - t0 < 5  # refused at once, not after waiting
        with pytest.raises(DirectoryBusyError, match=rf"pid {proc.pid}\b"):
            collect(out=out, task=tiny_task(), resume=True)
        res = CliRunner().invoke(app, ["collect", "--out", str(out), "--overwrite", "--steps", "4",
                                       "--no-progress"])
        errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
        assert res.exit_code != 0 and len(errors) == 1 and f"pid {proc.pid}" in errors[0], res.output
        # the refused writers changed nothing
        assert (out / "config.json").read_text() == config_before
        assert GradientStore.open(out / "gradients.zarr").n_rows >= rows_before
        assert proc.poll() is None
    finally:
        kill(proc)

    assert json.loads((out / LOCK_NAME).read_text())["pid"] == proc.pid  # left behind by SIGKILL...
    res = collect(cfg(steps=4), out=out, task=tiny_task(), overwrite=True)  # ...but not stale
    assert res.steps == 4
    store = GradientStore.open(res.store)
    assert store.status == "complete" and store.row_meta()["step"].max() < 4
    steps = [json.loads(x)["step"] for x in res.metrics.read_text().splitlines()]
    assert max(steps) == 4  # nothing of the killed 100,000-step run is left in the metrics


def test_two_writers_started_together_one_runs_the_other_is_refused(tmp_path):
    out, go = tmp_path / "run", tmp_path / "go"
    procs = [start_long_run(out, go) for _ in range(2)]
    try:
        time.sleep(0.5)  # both are waiting at the start line
        go.touch()
        deadline = time.monotonic() + 120
        while all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "neither writer was refused"
            time.sleep(0.02)
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        err = loser.communicate()[1]
        assert loser.returncode != 0 and "DirectoryBusyError" in err, err[-2000:]
        assert f"in use by pid {winner.pid}" in err
        assert "An array exists" not in err
        assert winner.poll() is None  # the owner runs on
        wait_for(out / "checkpoint.pt", winner)
    finally:
        for p in procs:
            kill(p)
    assert GradientStore.open(out / "gradients.zarr").n_rows >= 0


def test_overwrite_never_clears_a_directory_that_is_not_a_run(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text('{"editor": "vim"}')
    (home / "checkpoint.pt").write_text("someone else's model")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="not a gradspec run directory"):
            collect(cfg(steps=2), out=home, task=tiny_task(), overwrite=overwrite)
    assert sorted(p.name for p in home.iterdir()) == ["checkpoint.pt", "config.json"]  # no lock file either
    assert (home / "config.json").read_text() == '{"editor": "vim"}'

    other = tmp_path / "other"
    other.mkdir()
    (other / "checkpoint.pt").write_text("precious")  # no config.json: not a run, even without --overwrite
    with pytest.raises(FileExistsError, match=r"holds checkpoint\.pt"):
        collect(cfg(steps=2), out=other, task=tiny_task())
    assert (other / "checkpoint.pt").read_text() == "precious"

    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match="is a file"):
        collect(cfg(steps=2), out=tmp_path / "afile", task=tiny_task())


def test_overwrite_replaces_only_the_runs_own_files(tmp_path):
    out = tmp_path / "run"
    collect(cfg(steps=4), out=out, task=tiny_task())
    (out / "spectrum.zarr").mkdir()
    (out / "notes.txt").write_text("keep")
    (out / "retrain.json").write_text("{}")  # a stale result of the old run
    assert is_run_dir(out)
    res = collect(cfg(steps=2, lr=0.1), out=out, task=tiny_task(), overwrite=True)
    assert res.steps == 2 and GradientStore.open(res.store).row_meta()["step"].tolist() == [0, 1]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [LOCK_NAME, "checkpoint.pt", "config.json", "gradients.zarr", "metrics.jsonl", "notes.txt",
         "spectrum.zarr"])
    # bad settings are refused before anything of the old run is removed
    before = GradientStore.open(res.store).read()
    with pytest.raises(ValueError, match="delta"):
        collect(cfg(steps=2, delta=0.5), out=out, task=tiny_task(), overwrite=True)
    np.testing.assert_array_equal(GradientStore.open(res.store).read(), before)


class _Probe(StepHooks):
    """Tries, from another thread, to lock the run directory during a step."""

    def __init__(self, out: Path) -> None:
        self.out, self.refused = out, []

    def on_step_start(self, step, run) -> None:
        def attempt():
            try:
                RunLock(self.out).acquire().release()
            except DirectoryBusyError as exc:
                self.refused.append(str(exc))

        t = threading.Thread(target=attempt)
        t.start()
        t.join()


def test_a_training_only_run_holds_the_lock_too(tmp_path):
    probe = _Probe(tmp_path / "r")
    collect(cfg(steps=3), out=tmp_path / "r", task=tiny_task(), hooks=probe, write_store=False)
    assert len(probe.refused) == 3
    with RunLock(tmp_path / "r"):  # released at the end
        pass
