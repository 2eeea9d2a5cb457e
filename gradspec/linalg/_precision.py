"""Precisions of the spectral engine, and moving its blocks between host and device
(device names are resolved by ``gradspec._device``, shared with the trainer).

Precision policy (what each ``precision`` does to a block product):

- ``"auto"`` (the default): ``"float32"`` when H's source holds float32 numbers
  (every gradient store; float32 arrays), ``"float64"`` when it holds float64
  ones. Chosen by measurement (``docs/bench_pca.txt``): on σᵢ ∝ i^-0.6 test
  matrices of r = 1000…2000 rows the float32 path below reaches max σ relative
  errors of ~5e-9 against a dense float64 reference, under the 1e-8 the
  issue-14 goal asks for, at about half the cost of float64 products.
- ``"float64"``: each float32 panel of H is cast to float64 before multiplying.
  Products of float32 numbers are exact in float64, so the Gram H·Hᵀ is the
  Gram of the stored matrix to ~1e-16 relative (σ errors ~1e-13). V is formed
  in float64 and rounded once to its stored dtype. Cost: float64 GEMM runs at
  about half the float32 rate on AVX-512 CPUs and ~1/7 of TF32 on an H100.
- ``"float32"``: panel products in float32 (BLAS accumulation inside a panel of
  ≤ 8192 columns), accumulated across panels in float64. The Gram's own σ error
  is ~2e-8 (r=1000, p=250k, i^-0.6) and grows as ~1e-6·σ_1²/σ_i² in the worst
  case; one refinement step in the V pass removes most of it: σᵢ is replaced by
  the Rayleigh quotient ‖Hᵀuᵢ‖ (uᵢ unit), whose squared norm is accumulated
  in float64 from the float32 V (see ``_result.finalize``). The residuals of V
  are measured with float32 products accumulated in float64.
- ``"tf32"``: float32 with TF32 tensor-core matmuls (CUDA only), ~1e-3·σ_1²/σ_i²;
  for exploration only — the accuracy report (residuals) says how far it went.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "float64", "float32", "tf32")


def effective_precision(precision: str, source_dtype: object) -> str:
    """``"auto"`` -> ``"float32"`` for float32 data, ``"float64"`` otherwise; others unchanged."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    if precision != "auto":
        return precision
    return "float32" if np.dtype(source_dtype) == np.float32 else "float64"


def resolve_precision(precision: str, device: torch.device) -> tuple[torch.dtype, bool]:
    """-> (dtype of block products, whether TF32 matmuls are allowed)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    if precision in ("auto", "float64"):
        return torch.float64, False
    if precision == "tf32":
        if device.type != "cuda":
            raise ValueError("precision 'tf32' needs a CUDA device; use float32 or float64 on CPU")
        return torch.float32, True
    return torch.float32, False


def to_device(
    block: np.ndarray | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A host block -> a tensor on ``device`` in ``dtype`` (default: the block's own).

    On CUDA the block travels in its own (narrower) dtype through pinned memory,
    asynchronously, and is cast on the device.
    """
    if isinstance(block, np.ndarray):
        if device.type != "cpu":
            block = np.ascontiguousarray(block)  # one contiguous pinned copy per panel
        with warnings.catch_warnings():
            # Read-only blocks (memory maps, zarr buffers) are only ever read here.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(block)
    else:
        t = block
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory().to(device, non_blocking=True)
    return t if dtype is None else t.to(device=device, dtype=dtype)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


#: Dtypes a source may hold that are widened before any product (float32 holds them exactly).
NARROW = (torch.float16, torch.bfloat16)


def cast_into(flat: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Copy ``src`` (r×w: bfloat16/float16 panels, or float32 ones for float64 products) into
    the reused 1-D buffer ``flat`` (at least r·w elements, the target dtype), converting as it
    copies: no temporary the size of the panel is made. Returns the r×w C-contiguous view of
    ``flat`` that holds the copy.

    One ``copy_`` for the whole panel: copying in tiles of rows (1 MiB each, once meant to
    stay in L2) ran one OpenMP parallel region per tile, and on a machine whose cores other
    jobs share every region's barrier waits for a descheduled thread. Measured on a 2-core
    EPYC at load 4 (1,500 × 8,192 float32 → float64): tiles 34.8 ms wall / 43.9 ms CPU, one
    copy 21.3 / 18.7; profiled inside a loaded pca, the tiled copies took 22.6 s of a 57 s
    V pass.
    """
    r, w = src.shape
    out = flat[: r * w].view(r, w)
    out.copy_(src)
    return out
