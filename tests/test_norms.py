"""gradspec._norms: float64 norms of float rows/columns (the norms clipping bounds and records)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec._norms import row_norms64, sq_norms64


def _rows(dtype):
    x = np.random.default_rng(3).standard_normal((5, 20_001)) * np.array([1e-3, 1, 1e3, 7, 0.1])[:, None]
    return torch.from_numpy(x).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_row_and_column_norms_are_float64_sums_of_exact_squares(dtype):
    x = _rows(dtype)
    exact = x.to(torch.float64).numpy()  # every narrower float is a float64 number
    want_rows = np.sqrt(np.square(exact).sum(axis=1))
    got = row_norms64(x)
    assert got.dtype == torch.float64 and got.shape == (5,)
    np.testing.assert_allclose(got.numpy(), want_rows, rtol=1e-14, atol=0)
    np.testing.assert_allclose(sq_norms64(x, 1).numpy(), np.square(exact).sum(axis=1), rtol=1e-14, atol=0)
    np.testing.assert_allclose(sq_norms64(x, 0).numpy(), np.square(exact).sum(axis=0), rtol=1e-14, atol=0)


def test_a_float32_sum_would_be_caught():
    x = _rows(torch.float32)
    want = np.sqrt(np.square(x.numpy().astype(np.float64)).sum(axis=1))
    f32 = torch.linalg.vector_norm(x, dim=1).double().numpy()
    assert np.max(np.abs(f32 / want - 1)) > 1e-12  # the tolerance above separates the two


def test_a_norm_is_finite_exactly_when_its_row_is():
    x = _rows(torch.float32)
    x[1, 7] = float("nan")
    x[3, 0] = float("inf")
    x[4] = torch.finfo(torch.float32).max  # squares overflow float32, not float64
    finite = torch.isfinite(row_norms64(x)).tolist()
    assert finite == [True, False, True, False, True]


def test_views_and_tensors_that_need_grad():
    base = _rows(torch.float32)
    x = base[:, 100:5000].requires_grad_(False)  # a strided column slice
    want = np.sqrt(np.square(x.numpy().astype(np.float64)).sum(axis=1))
    np.testing.assert_allclose(row_norms64(x).numpy(), want, rtol=1e-14)
    y = base.clone().requires_grad_(True)
    assert row_norms64(y).requires_grad is False
    with pytest.raises(ValueError, match="dim must be 0 or 1"):
        sq_norms64(base, 2)


def test_bfloat16_rows_are_summed_in_float32_tiles_not_a_float64_copy(monkeypatch):
    """bfloat16 rows go through float32 tiles of _TILE entries (torch's float64 upcast of a whole
    batch of whole-model rows was the 15.9 GiB peak of a per-example collection): several tiles
    a row and several rows a column tile, a strided view, NaN and inf, the same float64 sums."""
    import gradspec._norms as norms

    monkeypatch.setattr(norms, "_TILE", 4096)

    def no_upcast(*a, **k):
        raise AssertionError("the bfloat16 path must not call torch's vector_norm")

    monkeypatch.setattr(torch.linalg, "vector_norm", no_upcast)
    x = _rows(torch.bfloat16)
    for v in (x, x[:, 100:15000], x[1:4]):
        exact = v.to(torch.float64).numpy()
        np.testing.assert_allclose(row_norms64(v).numpy(), np.sqrt(np.square(exact).sum(axis=1)), rtol=1e-14, atol=0)
        np.testing.assert_allclose(sq_norms64(v, 0).numpy(), np.square(exact).sum(axis=0), rtol=1e-14, atol=0)
    x[1, 7] = float("nan")
    x[3, 9000] = float("inf")
    assert torch.isfinite(row_norms64(x)).tolist() == [True, False, True, False, True]
