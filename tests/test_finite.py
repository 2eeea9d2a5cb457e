"""`all_finite` answers as `torch.isfinite(t).all()` does, including where the one sum it
tries first overflows or cancels."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradspec._finite import all_finite

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _expected(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", [0, 4_999, 9_999])
def test_one_value_that_is_not_finite_is_found(dtype, bad, where):
    t = torch.randn(10_000).to(dtype)
    assert all_finite(t)
    t[where] = bad
    assert not all_finite(t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_opposite_infinities_and_nan_beside_inf_are_found(dtype):
    t = torch.zeros(100, dtype=dtype)
    t[3], t[70] = math.inf, -math.inf  # the sum is NaN
    assert not all_finite(t)
    t[70] = math.nan
    assert not all_finite(t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_finite_values_whose_sum_overflows_are_finite(dtype):
    big = torch.finfo(dtype).max
    t = torch.full((1_000,), big, dtype=dtype)
    assert not bool(torch.isfinite(t.sum()))  # the sum alone would call them not finite
    assert all_finite(t)
    t[500] = -math.inf
    assert not all_finite(t)


def test_empty_integer_and_boolean_tensors_are_finite():
    assert all_finite(torch.zeros(0))
    assert all_finite(torch.zeros(0, 5, dtype=torch.float16))
    assert all_finite(torch.arange(10))
    assert all_finite(torch.ones(3, dtype=torch.bool))


def test_a_non_contiguous_view_and_a_2d_block():
    t = torch.randn(64, 300)
    assert all_finite(t[:, ::3])
    t[10, 33] = math.nan
    assert not all_finite(t[:, ::3])  # column 33 is in the view
    assert all_finite(t[:, 1::3])  # ... and not in this one


_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([3.4e38, -3.4e38, 1e-45, 0.0, -0.0]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, min_size=1, max_size=200), st.sampled_from(DTYPES))
def test_it_always_agrees_with_the_elementwise_check(values, dtype):
    t = torch.tensor(values, dtype=torch.float32).to(dtype)
    assert all_finite(t) == _expected(t)
