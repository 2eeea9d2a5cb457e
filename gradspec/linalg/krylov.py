"""Randomized block Krylov SVD (Musco & Musco, NeurIPS 2015), streamed.

Block Krylov on the r-side operator A = H·Hᵀ from a Gaussian start Ω (r×b):
K = [Ω, AΩ, …, A^q Ω], orthonormalised block by block (with one
re-orthogonalisation against the earlier blocks, dropping directions that
vanish), then Rayleigh–Ritz: M = Kᵀ·A·K = W·Θ·Wᵀ, U = K·W_k, σ = √θ.
Each block costs one streamed pass Z_j = H·(Hᵀ·Q_j); the products A·K are kept
(r×L, L = (q+1)·b), so M needs no extra pass. q + 1 passes plus one for V.
Gap-independent: after q ≈ log(p)/√ε iterations, σ_i are (1+ε)-accurate
(Musco & Musco 2015, Thm. 1). Use when r is too large for an r×r Gram.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from gradspec.linalg._result import PcaResult, finalize, sort_desc
from gradspec.linalg.orthogonal import block_size

logger = logging.getLogger(__name__)


def _orth_against(y: np.ndarray, basis: list[np.ndarray], drop: float) -> np.ndarray:
    scale = np.linalg.norm(y, axis=0).max() if y.size else 0.0
    for _ in range(2):
        for qb in basis:
            y = y - qb @ (qb.T @ y)
    if scale == 0.0:
        return y[:, :0]
    uu, s, _ = np.linalg.svd(y, full_matrices=False)
    return uu[:, s > drop * scale]


def krylov_pca(
    op: Any,
    *,
    k: int,
    iters: int = 4,
    oversample: int = 10,
    seed: int = 0,
    sink: Any = None,
    verify: bool = True,
    out_dtype: Any = np.float32,
) -> PcaResult:
    """Top-k singular triplets of H by randomized block Krylov iteration.

    Args:
        op: a ``GradientOperator``.
        k: number of singular triplets.
        iters: Krylov depth q (q + 1 passes over H).
        oversample: block size b = k + oversample.
        seed: seed of the Gaussian start.
        sink, verify, out_dtype: as in ``gram_pca``.
    """
    if iters < 0:
        raise ValueError(f"iters must be >= 0, got {iters}")
    r, p = op.shape
    b = block_size(k, oversample, r, p)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    q0, _ = np.linalg.qr(rng.standard_normal((r, b)))
    basis, products = [q0], []
    history = []
    for j in range(iters + 1):
        z = op.hht(basis[j])
        products.append(z)
        history.append({"iteration": j + 1, "basis": int(sum(x.shape[1] for x in basis))})
        if j == iters or sum(x.shape[1] for x in basis) >= r:
            break
        nxt = _orth_against(z, basis, 1e-10)
        if nxt.shape[1] == 0:
            logger.info("krylov: the Krylov space became invariant after %d blocks (exact)", j + 1)
            break
        basis.append(nxt)
    kb = np.concatenate(basis[: len(products)], axis=1)
    akb = np.concatenate(products, axis=1)
    m = kb.T @ akb
    theta, w = sort_desc(*np.linalg.eigh((m + m.T) / 2))
    kk = min(k, theta.size)
    if kk < k:
        raise ValueError(
            f"the Krylov space has only {kk} directions for k={k}; lower --k or use --method gram"
        )
    u = kb @ w[:, :k]
    safe = np.where(theta[:k] > 0, theta[:k], 1.0)
    resid = np.linalg.norm(akb @ w[:, :k] - u * theta[:k], axis=0) / safe
    logger.info(
        "krylov: %d passes, basis %d, max Ritz residual %.2e",
        len(products),
        kb.shape[1],
        resid.max(),
    )
    params = {
        "k": k,
        "iters": iters,
        "oversample": oversample,
        "seed": seed,
        "basis": int(kb.shape[1]),
    }
    return finalize(
        op,
        u,
        np.sqrt(np.maximum(theta[:k], 0.0)),
        method="krylov",
        sink=sink,
        out_dtype=out_dtype,
        verify=verify,
        params=params,
        history=history,
        est_residual=resid,
        timings={"iterate": time.perf_counter() - t0},
    )
