"""Checks of the accounting inputs (noise multiplier, sample rate, delta), and the default delta.

Each ``check_*`` returns the value as a float or raises ``TypeError``/``ValueError``
saying what was wrong and what would be right.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def _check_int(value: Any, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def _check_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r}")
    return float(value)


def check_noise_multiplier(value: Any) -> float:
    """A finite noise multiplier >= 0 (0 means no noise: non-private)."""
    sigma = _check_float(value, "noise_multiplier")
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"noise_multiplier must be finite and >= 0 (0 = non-private), got {sigma}")
    return sigma


def check_sample_rate(value: Any) -> float:
    q = _check_float(value, "sample_rate")
    if not 0 < q <= 1:
        raise ValueError(f"sample_rate must be in (0, 1] (batch size / dataset size), got {q}")
    return q


def check_delta(value: Any) -> float:
    delta = _check_float(value, "delta")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), e.g. n ** -1.1 for n examples; got {delta}")
    return delta



def default_delta(n: int) -> float:
    """The default delta for a training set of ``n`` examples: ``n ** -1.1``.

    Slightly below 1/n, as in Li et al. (2022, "Large language models can be
    strong differentially private learners").

    Raises:
        ValueError: if ``n`` is not an integer >= 2.
    """
    n = _check_int(n, "n (the training-set size)", minimum=2)
    return float(n) ** -1.1

