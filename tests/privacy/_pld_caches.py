"""The PLD caches emptied around each test of a module that imports this fixture: a test sees
what a fresh process computes, whatever ran before it."""

from __future__ import annotations

import pytest

from gradspec.privacy import _compose, _pld


@pytest.fixture(autouse=True)
def _fresh_caches():
    _pld.clear_cache()
    _compose._epsilon.cache_clear()
    yield
    _pld.clear_cache()
    _compose._epsilon.cache_clear()
