"""The result of a spectral run and the accuracy report shared by every method.

Every method produces orthonormal left vectors U (r×k) and σ; the final pass
streams V = Hᵀ·U·Σ⁻¹ (p×k) to a sink and, with ``verify`` (on by default),
measures in the same pass, with the V actually stored:

- ``residual_h``  ‖H·v_i − σ_i·u_i‖/σ_i  (= ‖HHᵀu_i − σ_i²u_i‖/σ_i²; bounds
  |σ_i² − σ²_true|/σ_i² by Bauer–Fike for the symmetric HHᵀ),
- ``residual_ht`` ‖Hᵀ·u_i − σ_i·v_i‖/σ_i (≈ the rounding of stored V, since V is
  formed from U),
- ``residuals``   the triplet residual √(residual_h² + residual_ht²),
- the reconstruction error ‖H − H·V·Vᵀ‖_F/‖H‖_F from H·V, VᵀV and ‖H‖_F²
  (= √(1 − Σσ²/‖H‖_F²) for exact singular vectors), without materialising H.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)


def sign_fix(u: np.ndarray) -> np.ndarray:
    """Flip columns so that the largest-|·| entry of each is positive (deterministic signs)."""
    if u.size == 0:
        return u
    idx = np.argmax(np.abs(u), axis=0)
    signs = np.sign(u[idx, np.arange(u.shape[1])])
    signs[signs == 0] = 1.0
    return u * signs


def sort_desc(theta: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(theta)[::-1]
    return theta[order], w[:, order]


def null_floor(sigma1: float, r: int) -> float:
    """σ below this are numerically zero for a Gram/Ritz computed in float64."""
    return float(sigma1) * float(np.sqrt(max(r, 1) * np.finfo(np.float64).eps)) * 10


@dataclass
class PcaResult:
    """Top-k singular triplets of H with their accuracy report.

    ``V`` is None when it was streamed to a spectrum store (read it there).
    """

    sigma: np.ndarray
    U: np.ndarray
    V: np.ndarray | None
    method: str
    frob2: float
    residual_h: np.ndarray
    residual_ht: np.ndarray
    reconstruction_error: float
    params: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    passes: int = 0
    rank: int | None = None

    @property
    def k(self) -> int:
        return int(self.sigma.shape[0])

    @property
    def residuals(self) -> np.ndarray:
        return np.sqrt(self.residual_h**2 + self.residual_ht**2)

    @property
    def explained_variance_ratio(self) -> np.ndarray:
        """σ_i²/‖H‖_F² per component."""
        return self.sigma**2 / self.frob2 if self.frob2 > 0 else np.zeros_like(self.sigma)

    @property
    def cumulative_explained_variance(self) -> np.ndarray:
        """Σ_{j≤i} σ_j²/‖H‖_F²: the explained-variance ratio of the top-i subspace, for each i ≤ k."""
        return np.cumsum(self.explained_variance_ratio)

    def accuracy(self) -> dict[str, Any]:
        res = self.residuals
        return {
            "max_residual": float(res.max()) if res.size else 0.0,
            "median_residual": float(np.median(res)) if res.size else 0.0,
            "reconstruction_error": float(self.reconstruction_error),
            "explained_variance": float(self.cumulative_explained_variance[-1])
            if res.size
            else 0.0,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "k": self.k,
            "shape": self.source.get("shape"),
            "sigma_top": [float(s) for s in self.sigma[:5]],
            "accuracy": self.accuracy(),
            "passes": self.passes,
            "timings": self.timings,
            "params": self.params,
        }


def finalize(
    op: Any,
    u: np.ndarray,
    sigma: np.ndarray,
    *,
    method: str,
    sink: Any = None,
    out_dtype: Any = np.float32,
    verify: bool = True,
    params: dict | None = None,
    history: list | None = None,
    est_residual: np.ndarray | None = None,
    timings: dict | None = None,
    gram: np.ndarray | None = None,
) -> PcaResult:
    """Sign-fix U, stream V = Hᵀ·U·Σ⁻¹ to ``sink`` (kept in memory if None), build the report."""
    import time

    from gradspec.linalg._operator import ArraySink

    r = op.shape[0]
    sigma = np.asarray(sigma, dtype=np.float64)
    u = sign_fix(np.asarray(u, dtype=np.float64))
    floor = null_floor(sigma[0], r) if sigma.size else 0.0
    rank = int((sigma > floor).sum())
    if rank < sigma.size:
        logger.warning(
            "H has numerical rank %d < k=%d: vectors beyond it are set to zero", rank, sigma.size
        )
        sigma = np.where(sigma > floor, sigma, 0.0)
        u[:, rank:] = 0.0
    keep = sink is None
    if keep:
        sink = ArraySink(op.shape[1], sigma.size, out_dtype)
    t0 = time.perf_counter()
    stats = op.project(u, sigma, sink, out_dtype=out_dtype, verify=verify, gram=gram)
    if hasattr(sink, "flush"):
        sink.flush()  # every row of V has landed before the report is made
    timings = dict(timings or {})
    timings["project"] = time.perf_counter() - t0
    frob2 = op.frob2
    safe = np.where(sigma > 0, sigma, 1.0)
    if stats is not None:
        res_h = np.linalg.norm(stats["hv"] - u * sigma, axis=0) / safe
        res_ht = np.sqrt(np.maximum(stats["rt2"], 0.0)) / safe
        a = stats["hv"].T @ stats["hv"]
        rec2 = frob2 - 2 * np.trace(a) + np.trace(a @ stats["vtv"])
    else:
        res_h = (
            np.asarray(est_residual, dtype=np.float64)
            if est_residual is not None
            else np.full(sigma.size, np.nan)
        )
        res_ht = np.zeros(sigma.size)
        rec2 = frob2 - float((sigma**2).sum())
    res_h[sigma == 0] = 0.0
    rec = float(np.sqrt(max(rec2, 0.0) / frob2)) if frob2 > 0 else 0.0
    return PcaResult(
        sigma=sigma,
        U=u,
        V=sink.array if keep else None,
        method=method,
        frob2=frob2,
        residual_h=res_h,
        residual_ht=res_ht,
        reconstruction_error=rec,
        params=dict(params or {}),
        history=list(history or []),
        timings=timings,
        source=op.describe(),
        passes=op.passes,
        rank=rank,
    )
