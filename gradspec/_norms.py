"""Float64 norms of float rows and columns: the norms clipping, recording and the passes use.

A row's norm accumulated in float64 is what gradspec's clipping bounds (every stored clipped
row has float64 norm <= C) and what it records (``meta/norms``). Squares of float32 (or
float16) numbers are exact in float64, so the only rounding is the float64 sum.

On the CPU these run as one numpy ``einsum`` in float64 (it converts in buffered pieces, no
float64 copy of the input): torch's ``vector_norm(..., dtype=torch.float64)`` takes a slow
upcasting path there. Measured on a 2-core EPYC (torch 2.13 CPU, 32 rows × 1,060,170 float32
columns, the Opacus recording benchmark's widest batch): torch 299 ms CPU, einsum 48 ms; a
float32 norm, for scale, 17 ms. bfloat16 (numpy has no such dtype) and non-CPU tensors use
torch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def _numpy_view(x: Tensor) -> np.ndarray | None:
    """x as a numpy array without a copy, where einsum can take it; None otherwise."""
    if x.device.type != "cpu" or x.dtype not in _NUMPY_DTYPES or x.ndim != 2:
        return None
    return x.detach().resolve_conj().resolve_neg().numpy()


def sq_norms64(x: Tensor, dim: int) -> Tensor:
    """Σ x² over ``dim`` (0: each column's, 1: each row's) of a 2-D tensor, summed in float64.

    Returns a float64 tensor on ``x``'s device.
    """
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 or 1, got {dim}")
    a = _numpy_view(x)
    if a is not None:
        return torch.from_numpy(np.einsum("ij,ij->j" if dim == 0 else "ij,ij->i", a, a, dtype=np.float64))
    return torch.linalg.vector_norm(x, dim=dim, dtype=torch.float64) ** 2


def row_norms64(x: Tensor) -> Tensor:
    """Each row's norm of a 2-D tensor (b, p), accumulated in float64: (b,) float64.

    A norm is finite exactly when its row is (float32 squares summed in float64 cannot
    overflow), so this one pass is also the rows' finiteness check.
    """
    a = _numpy_view(x)
    if a is not None:
        return torch.from_numpy(np.sqrt(np.einsum("ij,ij->i", a, a, dtype=np.float64)))
    return torch.linalg.vector_norm(x, dim=1, dtype=torch.float64)
