"""The r-side steps the iterative methods share: a random start and Rayleigh–Ritz.

Orthogonal iteration (``orthogonal``) and block Krylov (``krylov``) both work
on A = H·Hᵀ through an orthonormal basis Q (r×b) and its product Z = A·Q from
one streamed pass; both extract Ritz pairs the same way.
"""

from __future__ import annotations

import numpy as np

from gradspec.linalg._result import sort_desc


def random_start(r: int, b: int, seed: int) -> np.ndarray:
    """An orthonormal r×b Gaussian start (the same for the same seed)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((r, b)))
    return q


def rayleigh_ritz(
    q: np.ndarray, z: np.ndarray, n: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ritz pairs of A on span(Q) from Z = A·Q: M = QᵀZ = W·Θ·Wᵀ, Ritz vectors Q·W.

    Args:
        q: orthonormal basis (r×b).
        z: A·Q (r×b).
        n: keep the top n Ritz vectors (None: all b).

    Returns:
        (θ descending, all b; W; the top-n Ritz vectors Q·W_n; A·Q·W_n = Z·W_n; their
        relative residuals ‖A·y_i − θ_i·y_i‖/θ_i).
    """
    m = q.T @ z
    theta, w = sort_desc(*np.linalg.eigh((m + m.T) / 2))
    wn = w[:, :n]
    u, zw = q @ wn, z @ wn
    top = theta[: wn.shape[1]]
    safe = np.where(top > 0, top, 1.0)
    resid = np.linalg.norm(zw - u * top, axis=0) / safe
    return theta, w, u, zw, resid
