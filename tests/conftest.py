"""Shared fixtures: seeded RNGs, devices (CPU always, CUDA when present)."""

from __future__ import annotations

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
