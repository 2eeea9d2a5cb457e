"""Float64 norms of float rows and columns: the norms clipping, recording and the passes use.

A row's norm accumulated in float64 is what gradspec's clipping bounds (every stored clipped
row has float64 norm <= C) and what it records (``meta/norms``). Squares of float32 (or
float16) numbers are exact in float64, so the only rounding is the float64 sum.

On the CPU these run as one numpy ``einsum`` in float64 (it converts in buffered pieces, no
float64 copy of the input): torch's ``vector_norm(..., dtype=torch.float64)`` takes a slow
upcasting path there. Measured on a 2-core EPYC (torch 2.13 CPU, 32 rows × 1,060,170 float32
columns, the Opacus recording benchmark's widest batch): torch 299 ms CPU, einsum 48 ms; a
float32 norm, for scale, 17 ms. bfloat16 rows (numpy has no such dtype) are widened to float32
(exactly) a tile of 2^20 entries at a time into one reused buffer and summed the same way:
torch's upcasting path made a float64 copy of the whole input, 5.8 GB for 32 rows of whole
MiniLM (22.7M columns), the peak of a per-example bfloat16 collection (15.9 GiB RSS). Non-CPU
tensors use torch.
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


#: Entries of a bfloat16 tile widened to float32 at a time (4 MiB).
_TILE = 1 << 20


def _bf16_sq64(x: Tensor, dim: int) -> np.ndarray | None:
    """Σ x² over ``dim`` of a CPU bfloat16 2-D tensor in float64, through float32 tiles of
    ``_TILE`` entries (no copy of x); None for any other tensor."""
    if x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.ndim != 2:
        return None
    x = x.detach()
    b, p = x.shape
    buf = torch.empty(min(_TILE, max(1, x.numel())), dtype=torch.float32)
    if dim == 1:  # each row, in contiguous pieces of it
        out = np.zeros(b, dtype=np.float64)
        for i in range(b):
            row = x[i]
            for j in range(0, p, _TILE):
                seg = row[j : j + _TILE]
                t = buf[: seg.numel()]
                t.copy_(seg)
                a = t.numpy()
                out[i] += np.einsum("i,i->", a, a, dtype=np.float64)
        return out
    out = np.zeros(p, dtype=np.float64)
    cols = min(p, _TILE)
    rows = max(1, _TILE // max(1, cols))
    for j in range(0, p, cols):  # each column, a tile of rows and columns at a time
        for i in range(0, b, rows):
            blk = x[i : i + rows, j : j + cols]
            t = buf[: blk.numel()].view(blk.shape)
            t.copy_(blk)
            a = t.numpy()
            out[j : j + blk.shape[1]] += np.einsum("ij,ij->j", a, a, dtype=np.float64)
    return out


def sq_norms64(x: Tensor, dim: int) -> Tensor:
    """Σ x² over ``dim`` (0: each column's, 1: each row's) of a 2-D tensor, summed in float64.

    Returns a float64 tensor on ``x``'s device.
    """
    if dim not in (0, 1):
        raise ValueError(f"dim must be 0 or 1, got {dim}")
    a = _numpy_view(x)
    if a is not None:
        return torch.from_numpy(np.einsum("ij,ij->j" if dim == 0 else "ij,ij->i", a, a, dtype=np.float64))
    sq = _bf16_sq64(x, dim)
    if sq is not None:
        return torch.from_numpy(sq)
    return torch.linalg.vector_norm(x, dim=dim, dtype=torch.float64) ** 2


def row_norms64(x: Tensor) -> Tensor:
    """Each row's norm of a 2-D tensor (b, p), accumulated in float64: (b,) float64.

    A norm is finite exactly when its row is (float32 squares summed in float64 cannot
    overflow), so this one pass is also the rows' finiteness check.
    """
    a = _numpy_view(x)
    if a is not None:
        return torch.from_numpy(np.sqrt(np.einsum("ij,ij->i", a, a, dtype=np.float64)))
    sq = _bf16_sq64(x, 1)
    if sq is not None:
        return torch.from_numpy(np.sqrt(sq))
    return torch.linalg.vector_norm(x, dim=1, dtype=torch.float64)
