"""Case-table fixtures for the spectral engine (the `device` fixture is in tests/conftest.py)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.linalg.cases import CASES, Case


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request) -> Case:
    return request.param


@functools.cache
def _dense(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    h = case.matrix()
    u, s, vt = np.linalg.svd(h, full_matrices=False)
    for a in (h, u, s, vt):
        a.flags.writeable = False
    return h, u, s, vt


@pytest.fixture
def dense(case: Case) -> tuple[Case, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(case, H, U, σ, Vᵀ) with the numpy float64 reference SVD (computed once per case, read-only)."""
    return (case, *_dense(case))
