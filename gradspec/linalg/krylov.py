"""Randomized block Krylov SVD (Musco & Musco, NeurIPS 2015), streamed.

Block Krylov on the r-side operator A = H·Hᵀ from a Gaussian start Ω (r×b):
K = [Ω, AΩ, …, A^q Ω], orthonormalised block by block (with one
re-orthogonalisation against the earlier blocks, dropping directions that
vanish), then Rayleigh–Ritz: M = Kᵀ·A·K = W·Θ·Wᵀ, U = K·W_k, σ = √θ.
Each block costs one streamed pass Z_j = H·(Hᵀ·Q_j); the products A·K are kept
(r×L, L = (q+1)·b), so M needs no extra pass. q + 1 passes plus one for V.
Gap-independent: after q ≈ log(p)/√ε iterations, σ_i are (1+ε)-accurate
(Musco & Musco 2015, Thm. 1). Use when r is too large for an r×r Gram.
The basis and its products after each pass (``KrylovState``, r×L floats) let
an interrupted run resume at its last completed pass.
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
from gradspec.linalg.orthogonal import block_size

logger = logging.getLogger(__name__)


@dataclass
class KrylovState:
    """The Krylov basis blocks and their products A·Q_j after ``iteration`` passes."""

    iteration: int
    basis: list[np.ndarray]
    products: list[np.ndarray]
    done: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "basis": np.concatenate(self.basis, axis=1),
            "products": np.concatenate(self.products, axis=1),
            "sizes": [int(b.shape[1]) for b in self.basis],
            "done": self.done,
            "history": list(self.history),
        }

    @classmethod
    def load_state_dict(cls, d: dict[str, Any], *, r: int) -> KrylovState:
        """Rebuild a state, checking it belongs to a run with ``r`` rows."""
        try:
            kb = np.asarray(d["basis"], dtype=np.float64)
            akb = np.asarray(d["products"], dtype=np.float64)
            sizes = [int(x) for x in d["sizes"]]
            it = int(d["iteration"])
        except (KeyError, TypeError, ValueError) as exc:
            what = f"no {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0][:80]
            raise ValueError(f"saved Krylov state is damaged ({what}); start afresh with --overwrite") from None
        if (kb.ndim != 2 or akb.ndim != 2 or kb.shape[0] != r or akb.shape[0] != r or kb.shape[1] != sum(sizes)
                or any(b < 1 for b in sizes) or not 1 <= it <= len(sizes)):
            raise ValueError(
                f"saved Krylov state does not fit this run ({r} rows); resume with the same rows, "
                "or start afresh with --overwrite"
            )
        if not (np.all(np.isfinite(kb)) and np.all(np.isfinite(akb))):
            raise ValueError("saved Krylov state is corrupt (non-finite); start afresh with --overwrite")
        edges = np.cumsum([0, *sizes])
        basis = [kb[:, a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]
        if akb.shape[1] != sum(sizes[:it]):
            raise ValueError("saved Krylov state is inconsistent; start afresh with --overwrite")
        products = [akb[:, a:b] for a, b in zip(edges[:it], edges[1 : it + 1], strict=True)]
        return cls(it, basis, products, bool(d.get("done", False)), list(d.get("history", [])))


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
    state: KrylovState | None = None,
    on_iteration: Callable[[KrylovState], None] | None = None,
    sink: Any = None,
    verify: bool | str = True,
    out_dtype: Any = np.float32,
) -> PcaResult:
    """Top-k singular triplets of H by randomized block Krylov iteration.

    Args:
        op: a ``GradientOperator``.
        k: number of singular triplets.
        iters: Krylov depth q >= 1 (q + 1 passes over H).
        oversample: block size b = k + oversample.
        seed: seed of the Gaussian start.
        state: a saved ``KrylovState`` to resume from.
        on_iteration: called with the state after each completed pass (checkpointing).
        sink: as in ``gram_pca``.
        verify: as in ``gram_pca``.
        out_dtype: as in ``gram_pca``.
    """
    if iters < 1:
        # Depth 0 would be Rayleigh-Ritz on the random start itself: sigma off by any factor.
        raise ValueError(f"iters must be >= 1 (the Krylov depth), got {iters}")
    r, p = op.shape
    b = block_size(k, oversample, r, p)
    t0 = time.perf_counter()
    if state is None:
        state = KrylovState(0, [random_start(r, b, seed)], [])
    basis, products, history = state.basis, state.products, state.history
    done = state.done
    for j in range(len(products), iters + 1):
        if done:
            break
        z = op.hht(basis[j])
        products.append(z)
        history.append({"iteration": j + 1, "basis": int(sum(x.shape[1] for x in basis))})
        logger.info("krylov: pass %d/%d done, basis %d", j + 1, iters + 1, history[-1]["basis"])
        if j == iters or sum(x.shape[1] for x in basis) >= r:
            done = True
        else:
            nxt = _orth_against(z, basis, 1e-10)
            if nxt.shape[1] == 0:
                logger.info("krylov: the Krylov space became invariant after %d blocks (exact)", j + 1)
                done = True
            else:
                basis.append(nxt)
        if on_iteration is not None:
            on_iteration(KrylovState(j + 1, basis, products, done, history))
    kb = np.concatenate(basis[: len(products)], axis=1)
    akb = np.concatenate(products, axis=1)
    if kb.shape[1] < k:
        raise ValueError(
            f"the Krylov space has only {kb.shape[1]} directions for k={k}; lower --k or use --method gram"
        )
    theta, _, u, _, resid = rayleigh_ritz(kb, akb, k)
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
        seed=seed,
        params=params,
        history=history,
        est_residual=resid,
        timings={"iterate": time.perf_counter() - t0},
    )
