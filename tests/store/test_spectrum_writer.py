"""Who writes a spectrum store (issue 25): one writer at a time, through the store's own lock,
and a running store whose writer is gone is reported as such, a resumed run's writer included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zarr

from gradspec.store import DirectoryBusyError, SpectrumStore, update_attrs

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _running_store(path: Path, owner_pid: int) -> None:
    """A store as a pca leaves it when killed: status running, created by ``owner_pid``."""
    import socket

    SpectrumStore.create(path, r=10, p=30, k=2, method="orthogonal")
    update_attrs(zarr.open_group(str(path), mode="r+"),
                 {"gradspec.owner": {"host": socket.gethostname(), "pid": owner_pid}})


def test_the_lock_beside_the_store_admits_one_writer(tmp_path):
    out = tmp_path / "s.zarr"
    held, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def other_writer():
        try:
            with SpectrumStore.lock_for_writing(out):
                held.set()
                done.wait(30)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            held.set()

    t = threading.Thread(target=other_writer)
    t.start()
    try:
        assert held.wait(30) and not errors
        assert (tmp_path / ".s.zarr.lock").is_file() and not out.exists()  # beside, not inside
        with pytest.raises(DirectoryBusyError, match=r"the spectrum store '.*/s\.zarr' is in use by pid \d+"):
            SpectrumStore.lock_for_writing(out)
    finally:
        done.set()
        t.join()
    lock = SpectrumStore.lock_for_writing(out)  # free again once the first writer is done
    lock.release()
    assert SpectrumStore.lock_for_writing("memory://s.zarr") is None  # no lock file for a URL


def test_a_running_stores_writer_is_the_last_process_that_took_its_lock(tmp_path):
    """A killed pca, then a `pca --resume` that is killed too: while the resumed run lives
    its store is not reported as abandoned (its creator is gone, its writer is not); once
    it is killed, the report names the resumed run's pid."""
    out = tmp_path / "s.zarr"
    creator = _dead_pid()
    _running_store(out, creator)
    store = SpectrumStore.open(out)
    assert f"pid {creator}" in store.summary()["writer"] and store.replaceable() == "its pca process is gone"

    script = ("import sys; from gradspec.store import SpectrumStore; "
              "lock = SpectrumStore.lock_for_writing(sys.argv[1]); print('held', flush=True); "
              "sys.stdin.read()")
    resumed = subprocess.Popen([sys.executable, "-c", script, str(out)], cwd=ROOT,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert resumed.stdout.readline().strip() == "held"
        store = SpectrumStore.open(out)
        assert "writer" not in store.summary() and store.replaceable() is None
        with pytest.raises(FileExistsError, match="is writing it or was killed"):
            SpectrumStore.check_target(out, overwrite=False)  # a plain rerun does not replace it
    finally:
        resumed.send_signal(signal.SIGKILL)
        resumed.wait()
        resumed.stdin.close()
        resumed.stdout.close()
    summary = SpectrumStore.open(out).summary()
    assert summary["status"] == "running"
    assert f"gone: the pca that wrote it (pid {resumed.pid} on " in summary["writer"]
    assert "--resume" in summary["writer"]


def test_the_writer_this_process_is_keeps_its_store(tmp_path):
    """A store created here (no lock file) is this process's: never reported gone."""
    out = tmp_path / "s.zarr"
    SpectrumStore.create(out, r=10, p=30, k=2, method="orthogonal")
    store = SpectrumStore.open(out)
    assert "writer" not in store.summary() and store.replaceable() is None


@pytest.mark.parametrize("make", [
    pytest.param(lambda lock, victim: lock.symlink_to(victim), id="link-out-of-the-folder"),
    pytest.param(lambda lock, victim: os.mkfifo(lock), id="fifo"),
    pytest.param(lambda lock, victim: lock.write_text('{"pid": -1, "host": "' + __import__("socket")
                                                      .gethostname() + '"}'), id="pid-minus-one"),
    pytest.param(lambda lock, victim: lock.write_text("x" * 2**20), id="1-MiB-of-garbage"),
])
def test_a_hostile_lock_file_beside_a_store_is_no_writer(tmp_path, make):
    """Reading who writes a store reads the lock file as data: not through a link, not from
    a FIFO (no hang), not a pid that is no process; the store's own record decides."""
    out = tmp_path / "s.zarr"
    victim = tmp_path / "victim.json"
    victim.write_text('{"pid": 1, "host": "elsewhere"}')
    dead = _dead_pid()
    _running_store(out, dead)
    make(tmp_path / ".s.zarr.lock", victim)
    assert f"pid {dead}" in SpectrumStore.open(out).summary()["writer"]
