"""Shared fixtures: seeded RNGs, devices (CPU always, CUDA when present), a killed run."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
import torch

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
