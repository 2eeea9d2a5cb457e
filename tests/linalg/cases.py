"""Matrices with known spectra for the spectral engine's tests (seeded; readable ids).

Each case builds H = U·diag(s)·Vᵀ in float64 with random orthonormal U, V, so
its singular values are known exactly; k sits at a gap so that the top-k
subspace is well defined (principal angles are meaningful).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Case:
    id: str
    r: int
    p: int
    k: int
    spectrum: str
    seed: int = 0

    def singular_values(self) -> np.ndarray:
        n = min(self.r, self.p)
        i = np.arange(1, n + 1, dtype=np.float64)
        if self.spectrum == "power":  # σ_i = i^-0.6, the decay Li et al. 2022 report
            return 10.0 * i**-0.6
        if self.spectrum == "steep":
            return 10.0 * i**-1.5
        if self.spectrum == "lowrank":  # exact rank 8
            return np.where(i <= 8, 10.0 / i, 0.0)
        if self.spectrum == "clustered":  # clusters of equal σ; k = 6 ends a cluster
            s = np.full(n, 0.5) * 0.9 ** np.arange(n)
            s[:3], s[3:6] = 8.0, 4.0
            return s
        raise ValueError(self.spectrum)

    def matrix(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        n = min(self.r, self.p)
        u, _ = np.linalg.qr(rng.standard_normal((self.r, n)))
        v, _ = np.linalg.qr(rng.standard_normal((self.p, n)))
        return (u * self.singular_values()) @ v.T


CASES = [
    Case("power-r<p", r=60, p=900, k=10, spectrum="power"),
    Case("power-r>p", r=240, p=70, k=10, spectrum="power", seed=1),
    Case("steep-r<p", r=80, p=600, k=12, spectrum="steep", seed=2),
    Case("lowrank-r<p", r=50, p=400, k=8, spectrum="lowrank", seed=3),
    Case("clustered-r<p", r=40, p=500, k=6, spectrum="clustered", seed=4),
]


def max_principal_angle(a: np.ndarray, b: np.ndarray) -> float:
    """Largest principal angle (radians) between the column spaces of a and b."""
    qa, _ = np.linalg.qr(a)
    qb, _ = np.linalg.qr(b)
    s = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.arccos(np.clip(s.min(), -1.0, 1.0)))
