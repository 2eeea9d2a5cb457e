"""Orthogonal (subspace) iteration with a Rayleigh–Ritz step — Li et al. 2022, App. B.

The paper iterates on the p-side (V ← orth(HᵀH·V), all gradients in RAM,
column-wise Gram–Schmidt). We run the same iteration on the r-side, on
A = H·Hᵀ, which spans the same subspaces: each iteration is one streamed pass
Z = H·(Hᵀ·Q) and keeps only r×b matrices, never p×k. Rayleigh–Ritz on
(Q, Z): M = QᵀZ = W·Θ·Wᵀ gives Ritz values θ_i = σ_i² and vectors Q·W; the
next iterate is orth(Z·W). Convergence per iteration is logged through the
Ritz residuals ‖A·y_i − θ_i·y_i‖/θ_i of the top k, and the run stops early
when they fall below ``tol``. State after each completed iteration
(``OrthogonalState``) lets an interrupted run resume there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradspec.linalg._result import PcaResult, finalize
from gradspec.linalg._ritz import random_start, rayleigh_ritz

logger = logging.getLogger(__name__)


@dataclass
class OrthogonalState:
    """Where an orthogonal iteration stands after ``iteration`` completed iterations."""

    iteration: int
    q: np.ndarray  # next iterate (r×b)
    u: np.ndarray | None = None  # Ritz vectors of the last evaluated iterate (r×b)
    theta: np.ndarray | None = None  # their Ritz values (b)
    resid: np.ndarray | None = None
    converged: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "q": self.q,
            "u": self.u,
            "theta": self.theta,
            "resid": self.resid,
            "converged": self.converged,
            "history": list(self.history),
        }

    @classmethod
    def load_state_dict(cls, d: dict[str, Any], *, r: int, b: int) -> OrthogonalState:
        """Rebuild a state, checking it belongs to a run of the same shape."""
        q = np.asarray(d["q"], dtype=np.float64)
        if q.shape != (r, b):
            raise ValueError(
                f"saved orthogonal-iteration state has an iterate of shape {q.shape}, this run needs {(r, b)}; "
                "resume with the same rows, --k and oversampling, or start afresh with --overwrite"
            )
        if not np.all(np.isfinite(q)):
            raise ValueError(
                "saved orthogonal-iteration state is corrupt (non-finite); start afresh with --overwrite"
            )
        opt = {
            key: (None if d.get(key) is None else np.asarray(d[key], dtype=np.float64))
            for key in ("u", "theta", "resid")
        }
        return cls(
            iteration=int(d["iteration"]),
            q=q,
            converged=bool(d.get("converged", False)),
            history=list(d.get("history", [])),
            **opt,
        )


def block_size(k: int, oversample: int, r: int, p: int) -> int:
    return int(min(k + max(0, oversample), r, p))


def orthogonal_iteration(
    op: Any,
    *,
    k: int,
    iters: int = 10,
    tol: float | None = None,
    oversample: int = 10,
    seed: int = 0,
    state: OrthogonalState | None = None,
    on_iteration: Callable[[OrthogonalState], None] | None = None,
) -> OrthogonalState:
    """Run subspace iteration on H·Hᵀ until ``iters`` iterations or Ritz residuals < ``tol``."""
    r, p = op.shape
    b = block_size(k, oversample, r, p)
    if state is None:
        state = OrthogonalState(iteration=0, q=random_start(r, b, seed))
    while state.iteration < iters and not state.converged:
        t0 = time.perf_counter()
        q = state.q
        z = op.hht(q)
        theta, _, u, zw, resid = rayleigh_ritz(q, z)
        prev = state.theta
        change = (
            float(
                np.max(
                    np.abs(np.sqrt(np.maximum(theta[:k], 0)) - np.sqrt(np.maximum(prev[:k], 0)))
                    / np.sqrt(np.maximum(theta[:k], 1e-300))
                )
            )
            if prev is not None
            else None
        )
        qn, _ = np.linalg.qr(zw)
        it = state.iteration + 1
        entry = {
            "iteration": it,
            "max_residual": float(resid[:k].max()),
            "sigma_rel_change": change,
            "sigma_1": float(np.sqrt(max(theta[0], 0))),
            "seconds": time.perf_counter() - t0,
        }
        logger.info(
            "orthogonal: iteration %d/%d  max Ritz residual %.2e  max rel change of sigma %s",
            it,
            iters,
            entry["max_residual"],
            "-" if change is None else f"{change:.2e}",
        )
        conv = tol is not None and entry["max_residual"] < tol
        state = OrthogonalState(
            iteration=it,
            q=qn,
            u=u,
            theta=theta,
            resid=resid,
            converged=conv,
            history=[*state.history, entry],
        )
        if on_iteration is not None:
            on_iteration(state)
    return state


def orthogonal_pca(
    op: Any,
    *,
    k: int,
    iters: int = 10,
    tol: float | None = None,
    oversample: int = 10,
    seed: int = 0,
    state: OrthogonalState | None = None,
    on_iteration: Callable[[OrthogonalState], None] | None = None,
    sink: Any = None,
    verify: bool | str = True,
    out_dtype: Any = np.float32,
) -> PcaResult:
    """Top-k singular triplets of H by orthogonal iteration (``iters`` passes + one for V).

    Args:
        op: a ``GradientOperator``.
        k: number of singular triplets.
        iters: iterations (the paper's default is 10).
        tol: stop early when the top-k Ritz residuals ‖HHᵀy − θy‖/θ are below it.
        oversample: extra columns in the iterate (b = k + oversample).
        seed: seed of the random start.
        state: a saved ``OrthogonalState`` to resume from.
        on_iteration: called with the state after each completed iteration (checkpointing).
        sink: as in ``gram_pca``.
        verify: as in ``gram_pca``.
        out_dtype: as in ``gram_pca``.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    t0 = time.perf_counter()
    st = orthogonal_iteration(
        op,
        k=k,
        iters=iters,
        tol=tol,
        oversample=oversample,
        seed=seed,
        state=state,
        on_iteration=on_iteration,
    )
    if st.u is None or st.theta is None:
        raise ValueError(
            "the saved state has no completed iteration to finish from; rerun without --resume"
        )
    sigma = np.sqrt(np.maximum(st.theta[:k], 0.0))
    params = {
        "k": k,
        "iters": iters,
        "tol": tol,
        "oversample": oversample,
        "seed": seed,
        "iterations_done": st.iteration,
        "converged": st.converged,
    }
    return finalize(
        op,
        st.u[:, :k],
        sigma,
        method="orthogonal",
        sink=sink,
        out_dtype=out_dtype,
        verify=verify,
        seed=seed,
        params=params,
        history=st.history,
        est_residual=st.resid[:k] if st.resid is not None else None,
        timings={"iterate": time.perf_counter() - t0},
    )
