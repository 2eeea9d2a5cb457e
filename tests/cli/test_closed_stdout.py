"""A reader that closes stdout early (`gradspec info STORE | head -4`): every command stops
quietly, exit 141 (as a tool killed by SIGPIPE), never ``error: Broken pipe`` (issue 25)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from cli.main import CLOSED_STDOUT_EXIT


def _run_with_stdout_closed(*args: str) -> subprocess.CompletedProcess:
    """Run gradspec with its stdout a pipe whose reader has already gone."""
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # closed before the command writes anything: it starts in seconds
    stderr = proc.stderr.read()
    proc.wait(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from gradspec.store import META_FIELDS, GradientStore, ParamLayout

    path = tmp_path_factory.mktemp("closed") / "grads.zarr"
    s = GradientStore.create(path, layout=ParamLayout.from_shapes([("w", (4, 5))]))
    meta = {name: np.zeros(6, dtype=dt) for name, dt in META_FIELDS.items()}
    s.append(np.ones((6, 20), np.float32), meta)
    s.set_status("complete")
    return path


@pytest.mark.parametrize(
    "args",
    [["info", "{store}"], ["info", "--json", "{store}"],
     ["account", "--q", "0.01", "--steps", "10", "--noise-multiplier", "1", "--delta", "1e-5", "--method", "rdp"]],
    ids=["info", "info-json", "account"],
)
def test_a_closed_stdout_ends_the_command_quietly(store, args):
    res = _run_with_stdout_closed(*[a.format(store=store) for a in args])
    assert res.returncode == CLOSED_STDOUT_EXIT, res.stderr
    assert res.stderr == ""


def test_an_open_stdout_is_unaffected(store):
    res = subprocess.run([sys.executable, "-m", "cli.main", "info", str(store)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "gradients store" in res.stdout and res.stderr == ""
