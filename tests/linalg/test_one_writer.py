"""One writer per spectrum store (issue 25: two `pca --overwrite` on one --out both exited 0 and
printed their results, but the store held only the second's)."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import gradspec
from gradspec.store import DirectoryBusyError, RunLock, SpectrumStore, update_attrs


def test_a_second_pca_on_the_same_out_is_refused_while_the_first_writes(tmp_path):
    h = np.random.default_rng(0).standard_normal((20, 300))
    out = tmp_path / "s.zarr"
    held, done = threading.Event(), threading.Event()

    def first_writer():  # what a pca in progress holds: the lock beside its store
        with RunLock(tmp_path, name=".s.zarr.lock"):
            held.set()
            done.wait(30)

    t = threading.Thread(target=first_writer)
    t.start()
    try:
        assert held.wait(30)
        # the store by its path (was: "spectrum store 's.zarr' '<its folder>' is in use")
        with pytest.raises(DirectoryBusyError, match=f"^the spectrum store {re.escape(repr(str(out)))} is in use by pid"):
            gradspec.pca(source=h, k=3, out=out, overwrite=True)
        assert not out.exists()  # nothing written
    finally:
        done.set()
        t.join()
    gradspec.pca(source=h, k=3, out=out)  # the lock is released with the first writer
    again = gradspec.pca(source=h, k=3, out=out, overwrite=True, seed=1)  # and by each pca
    assert SpectrumStore.open(out).status == "complete" and again.sigma.shape == (3,)


def test_a_refused_out_inside_the_gradient_store_leaves_no_lock_file_in_it(tmp_path):
    """Issue 34 §6: `pca G --out G/sub.zarr` was refused, but left `.sub.zarr.lock` inside G."""
    from gradspec.store import META_FIELDS, GradientStore, ParamLayout

    g = tmp_path / "g.zarr"
    store = GradientStore.create(g, layout=ParamLayout.from_shapes([("w", (300,))]))
    store.write_rows(0, np.random.default_rng(0).standard_normal((20, 300)).astype(np.float32),
                     {f: np.arange(20) for f in META_FIELDS})
    store.commit(20)
    before = sorted(p.name for p in g.iterdir())
    with pytest.raises(ValueError, match="is or contains the gradient store being read"):
        gradspec.pca(source=g, k=3, out=g / "sub.zarr")
    assert sorted(p.name for p in g.iterdir()) == before


def test_info_says_when_a_running_stores_writer_is_gone(tmp_path):
    """Issue 25: a store whose pca was killed showed `[running]` with no hint."""
    import socket

    import zarr
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path / "s.zarr"
    SpectrumStore.create(out, r=10, p=30, k=2, method="orthogonal")
    res = CliRunner().invoke(app, ["info", str(out)])
    assert "[running]" in res.output and "gone" not in res.output  # its writer (this process) lives
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    pid = child.pid  # a process that has exited: no such process now
    update_attrs(zarr.open_group(str(out), mode="r+"), {"gradspec.owner": {"host": socket.gethostname(), "pid": pid}})
    res = CliRunner().invoke(app, ["info", str(out)])
    assert f"writer   gone: the pca that wrote it (pid {pid}" in res.output and "--resume" in res.output
