"""Shared fixtures: seeded RNGs, devices (CPU always, CUDA when present), a killed run."""

from __future__ import annotations

import contextlib
import os

# Under pytest-xdist (scripts/test.sh runs one worker per core) each worker computes on one
# thread: two workers of two BLAS/OpenMP threads each on two cores would only contend.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def killed_after(monkeypatch):
    """``with killed_after(n): ...``: every training step after the n-th raises
    KeyboardInterrupt, as a kill at that point would stop the process (what was
    checkpointed stays, the steps after it are lost)."""

    @contextlib.contextmanager
    def patch(steps: int):
        from gradspec.train._run import _Run

        real, calls = _Run.train_step, {"n": 0}

        def step(self, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] > steps:
                raise KeyboardInterrupt("killed")
            return real(self, *args, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(_Run, "train_step", step)
            yield

    return patch


def group_of(nodeid: str) -> str:
    """The work unit a test runs in under pytest-xdist: its module, so that the module's fixtures
    are made once; all of tests/report is one unit, as its tests share session fixtures (small
    real runs, a browser)."""
    module = nodeid.split("::", 1)[0]
    return "tests/report" if module.startswith("tests/report/") else module


def pytest_xdist_make_scheduler(config, log):
    """``-n N --dist loadscope`` (scripts/test.sh) or ``loadgroup``: the units of :func:`group_of`.

    xdist's own ``loadgroup`` reads a group from each test's node id, which its worker hook
    rewrites; on pytest 9 a node id is derived, so the rewrite is lost and no group ever formed
    (every module fixture, the docs site and the report's runs were built on both workers). The
    scheduler hook is xdist's public way to choose the units. Other --dist modes are xdist's."""
    if config.getvalue("dist") not in ("loadscope", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _reset_cli_logging():
    """The CLI configures the 'gradspec' logger for its process; undo that between tests."""
    import logging

    yield
    for name in ("gradspec", "transformers", "opacus"):
        log = logging.getLogger(name)
        log.handlers[:] = []
        log.propagate = True
        log.setLevel(logging.NOTSET)
