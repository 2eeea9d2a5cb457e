"""Reference solver: scipy ``svds`` (ARPACK implicitly restarted Lanczos) on the operator.

Every Lanczos step is a full pass over H, so this is for checking the other
methods on small problems, not for production (Li et al. 2022, fn. 5: Lanczos
is not guaranteed to return the *top* eigenvalues; orthogonal iteration is).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gradspec.linalg._result import PcaResult, finalize, sort_desc


def lanczos_pca(
    op: Any,
    *,
    k: int,
    tol: float | None = None,
    seed: int = 0,
    sink: Any = None,
    verify: bool | str = True,
    out_dtype: Any = np.float32,
) -> PcaResult:
    """Top-k singular triplets of H with ``scipy.sparse.linalg.svds`` (needs k < min(r, p))."""
    from scipy.sparse.linalg import svds

    r, p = op.shape
    if k >= min(r, p):
        raise ValueError(
            f"lanczos (scipy svds) needs k < min(r, p) = {min(r, p)}; use --method gram for k={k}"
        )
    t0 = time.perf_counter()
    v0 = np.random.default_rng(seed).standard_normal(min(r, p))
    u, s, _ = svds(op.to_scipy(), k=k, tol=tol or 0.0, v0=v0, solver="arpack")
    s, u = sort_desc(s, u)
    params = {"k": k, "tol": tol, "seed": seed, "solver": "arpack"}
    return finalize(
        op,
        u,
        s,
        method="lanczos",
        sink=sink,
        out_dtype=out_dtype,
        verify=verify,
        seed=seed,
        params=params,
        timings={"svds": time.perf_counter() - t0},
    )
