"""Shared by the recorder tests: Opacus's warnings (secure RNG, full backward hooks) are
expected in tests and kept out of their output."""

from __future__ import annotations

import warnings

import pytest


@pytest.fixture(autouse=True)
def _quiet_opacus():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="opacus")
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
        warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook.*")
        yield
