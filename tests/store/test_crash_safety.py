"""SIGKILL a process that is writing a store, at random moments, then reopen it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from gradspec.store import GradientStore

P = 150_000

WRITER = textwrap.dedent(
    f"""
    import sys, numpy as np
    from gradspec.store import BackgroundWriter, GradientStore, ParamLayout, META_FIELDS
    path = sys.argv[1]
    lay = ParamLayout.from_shapes([("w", ({P},))])
    store = GradientStore.create(path, layout=lay, rows_per_chunk=4, cols_per_chunk=40_000)
    w = BackgroundWriter(store, max_queue=4)
    rng = np.random.default_rng(int(sys.argv[2]))
    row = 0
    while True:
        b = int(rng.integers(1, 7))
        rows = (np.arange(row, row + b, dtype=np.float32)[:, None] + np.zeros({P}, np.float32))
        w.put(rows, {{k: np.arange(row, row + b) for k in META_FIELDS}})
        row += b
        if rng.random() < 0.5:
            w.commit(wait=True)
            print("committed", store.n_rows, flush=True)
            if rng.random() < 0.3:
                store.finalize()  # shrink to the committed rows (as closing does); writing grows again
    """
)


@pytest.mark.parametrize("trial", range(4))
def test_sigkill_leaves_exactly_the_committed_rows(tmp_path, trial):
    path = tmp_path / "g.zarr"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(trial)],
        stdout=subprocess.PIPE, text=True,
    )
    committed = 0
    deadline = time.monotonic() + 60
    # Let it commit a few times, then kill it at a random moment of its writing.
    while committed < 3 + trial and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        committed = int(line.split()[1])
    time.sleep(np.random.default_rng(trial).uniform(0.0, 0.3))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    rest = proc.stdout.read().split()
    last_reported = int(rest[-1]) if rest else committed
    assert committed >= 3 + trial, "the writer did not get going"

    store = GradientStore.open(path)
    n = store.n_rows
    assert n >= last_reported  # nothing reported committed is lost
    data = store.read()
    assert store.verify()["ok"]
    # every visible row is whole: row i is filled with the value i
    np.testing.assert_array_equal(data, np.arange(n, dtype=np.float32)[:, None] + np.zeros(P, np.float32))
    np.testing.assert_array_equal(store.row_meta()["step"], np.arange(n))

    # and the store can be resumed: appending continues after the committed rows
    w = GradientStore.open(path, mode="r+")
    from gradspec.store import META_FIELDS

    w.append(np.full((2, P), -1, np.float32), {k: np.zeros(2) for k in META_FIELDS})
    again = GradientStore.open(path)
    assert again.n_rows == n + 2
    np.testing.assert_array_equal(again.read(rows=slice(n, n + 2)), -1)
