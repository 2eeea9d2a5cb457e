"""Dense kernels of the streamed passes: symmetric rank-w updates.

The Gram G = Σ P·Pᵀ is symmetric, so only its upper block triangle needs
computing: with the rows of a panel cut into b blocks, the update is
b(b+1)/2 GEMMs instead of b², i.e. (b+1)/(2b) of the flops of one full GEMM
(BLAS ``syrk`` does the same; torch has none, and numpy's ``a @ a.T`` uses
OpenBLAS's, which is slower here than MKL's GEMM on blocks of ~500 rows).
On a 2-core Xeon (AVX-512, MKL) the blocked float64 update runs at 1.2–1.4× the
rate of one full GEMM; on CUDA a full GEMM is used (compute is not the bottleneck).
In float32 the blocked update is *slower* than one full GEMM (measured 2.4×
slower at r=1000, w=8192 on the shared 2-core machine: each block product
needs its own float32 temporary added to float64), so float32 panels use one
full GEMM whose float32 result is added to the float64 accumulator in place.
"""

from __future__ import annotations

import numpy as np
import torch

#: Rows per block of the triangular update (measured best for r = 300…2000 on MKL, AVX-512).
BLOCK_ROWS = 200


def block_edges(
    n: int, device: torch.device, block_rows: int = BLOCK_ROWS, dtype: torch.dtype = torch.float64
) -> list[int]:
    """Row-block edges for a symmetric update of an n×n matrix ([0, n]: one full GEMM).

    ``dtype``: the dtype of the panels multiplied; float32 panels use one full GEMM.
    """
    nb = 1 if device.type != "cpu" or dtype != torch.float64 else max(1, round(n / block_rows))
    return [int(e) for e in np.linspace(0, n, nb + 1).round()]


def sym_update(g: torch.Tensor, a: torch.Tensor, edges: list[int]) -> None:
    """g += a·aᵀ on the upper block triangle of g (float64, n×n); a is n×w.

    With a float64 ``a`` the products accumulate in place (``addmm_``); with a
    float32 ``a`` each block product runs in float32 (or TF32) and is added to
    g in float64. With one block the whole of g is updated. Call
    :func:`sym_finish` once at the end.
    """
    exact = a.dtype == g.dtype
    for i in range(len(edges) - 1):
        ai = a[edges[i] : edges[i + 1]]
        for j in range(i, len(edges) - 1):
            gij = g[edges[i] : edges[i + 1], edges[j] : edges[j + 1]]
            aj = a[edges[j] : edges[j + 1]]
            if exact:
                gij.addmm_(ai, aj.T)
            else:
                gij.add_(ai @ aj.T)  # float32 product, added in float64 (type promotion)


def sym_finish(g: torch.Tensor, edges: list[int]) -> np.ndarray:
    """The full symmetric matrix (numpy float64) from what :func:`sym_update` accumulated."""
    out = g.detach().cpu().numpy()
    upper = np.zeros_like(out, dtype=bool)
    diag = np.zeros_like(upper)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        upper[a:b, a:] = True
        diag[a:b, a:b] = True
    full = np.where(upper, out, out.T)
    # Diagonal blocks were computed whole: average them with their transposes.
    full = np.where(diag, (full + full.T) / 2, full)
    return np.ascontiguousarray(full)
