"""The end of a replay (`gradspec.train.replay`, see ``_replay``): the Rayleigh–Ritz step of the
exact rows on the sketched spectrum's U, and the spectrum store it writes."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)


#: What ``residual_h`` of a replayed spectrum is, without and with the measuring replay.
RESIDUAL_BOUND = ("bound, not measured: ||(I - U_K U_K^T) H||_F / sigma_i (from ||H||_F^2 and trace(A^T A)), "
                  "all of the rows' mass outside the K replayed directions; 0 with K = r (replay a pca --k r "
                  "spectrum), loose otherwise; --check measures ||H v_i - sigma_i u_i|| with one more replay")
RESIDUAL_MEASURED = ("measured: ||H v_i - sigma_i u_i|| / sigma_i of the stored V, H·V from one more replay of "
                     "the run (float64)")


@dataclass
class ReplayResult:
    """What a replay wrote and measured.

    ``sigma``: the replayed σ (of U_Kᵀ·H, exact rows); ``sigma_sketch``: the sketched spectrum's.
    ``raw``: Hᵀ·U_K·Σ_K⁻¹ (p × K, float64) when asked for (``keep_raw``), the issue's formula
    before orthonormalisation. ``residual_h``: ‖H·v_i − σ_i·u_i‖/σ_i as stored, measured when
    ``measured`` (a replay with ``check``, ``check_passes`` more of them), else its bound.
    """

    out: Path
    k: int
    sigma: np.ndarray
    sigma_sketch: np.ndarray
    steps: int
    rows_checked: int
    rows_exact: int
    max_relative_difference: float
    passes: int
    seconds: float
    orthogonality: float
    record: dict[str, Any] = field(default_factory=dict)
    raw: np.ndarray | None = field(default=None, repr=False)
    residual_h: np.ndarray | None = field(default=None, repr=False)
    measured: bool = False
    check_passes: int = 0


class Parts:
    """Aᵀ's column chunks (K × chunk each): in memory for one chunk, else in a file beside ``out``."""

    def __init__(self, tmp: Path, p: int, K: int, n: int) -> None:  # noqa: N803
        self.p, self.K, self.tmp = p, K, tmp
        self.whole: Any = None if n == 1 else np.lib.format.open_memmap(
            tmp / "accumulators.npy", mode="w+", dtype=np.float64, shape=(K, p))

    def put(self, a: int, acc: np.ndarray) -> None:
        if self.whole is None and a == 0 and acc.shape == (self.K, self.p):
            self.whole = acc  # the one chunk: kept as it is, no copy
        else:
            self.whole[:, a:a + acc.shape[1]] = acc

    def blocks(self, rows: int = 2**16):
        for a in range(0, self.p, rows):
            yield a, np.asarray(self.whole[:, a:a + rows]).T  # (chunk, K): rows of A = Hᵀ·U_K


def write(case: Any, parts: Parts, out: Path, check: Any, *, passes: int, chunk: int, t0: float,
           keep_raw: bool, replayed: float = 0.0,
           measure: Callable[[np.ndarray], tuple[np.ndarray, int]] | None = None) -> ReplayResult:
    """The Rayleigh–Ritz step (module note) and the spectrum store at ``out``.

    ``measure``: given V as written (p × k float32), H·V (n_rows × k, float64) from more replays,
    and how many: then ‖H·v_i − σ_i·u_i‖ is measured, not bounded.
    """
    from gradspec.linalg import PcaResult, sign_fix
    from gradspec.store import SpectrumStore, resolved_path

    K, p, k = case.K, case.p, case.k
    gram = np.zeros((K, K))
    for _, blk in parts.blocks():
        gram += blk.T @ blk
    lam, w = np.linalg.eigh(gram)
    order = np.argsort(lam)[::-1]
    lam, w = np.maximum(lam[order], 0.0), w[:, order]
    s = np.sqrt(lam)
    r = int(case.used.sum())
    floor = s[0] * math.sqrt(max(r, 1) * np.finfo(np.float64).eps) * 10 if s.size else 0.0
    kept = int(min(k, (s > floor).sum()))
    if kept < 1:
        raise ValueError("the replayed rows are zero on the spectrum's directions: nothing to write")
    reason = None if kept == k else (f"sigma_{kept + 1} of the replayed rows is below the float64 floor "
                                     f"{floor:.3g} (their numerical rank on span(U_K))")
    u_out = case.u @ w[:, :kept]  # U's rows in the spectrum's order (its source_rows)
    fixed = sign_fix(u_out)
    signs = np.sign(np.sum(fixed * u_out, axis=0))
    signs[signs == 0] = 1.0
    u_out = fixed
    t = (w[:, :kept] / s[:kept]) * signs  # V = A·W·Λ^-½, signs matched to U's
    stage = out.with_name(f".{out.name}.partial-{os.getpid()}")
    src = dict(case.spectrum.source)
    record = {
        "sketched_spectrum": resolved_path(case.spectrum.path),
        "sketched_store": resolved_path(case.store.path),
        "K": K, "k_requested": k, "k": kept, "p": p,
        "sigma_sketch": [float(x) for x in case.sigma_sketch],
        "steps": int(case.run_config.get("steps") or 0),
        "rows_replayed": check.rows, "rows_used": r,
        "passes": passes, "column_chunk": chunk,
        "verification": {
            "compared": "each replayed step's exact row, sketched with the store's plan and rounded to the "
                        "store's dtype, against the stored sketched row",
            "rows_checked": check.rows, "rows_bit_exact": check.exact,
            "max_relative_difference": check.worst, "worst_step": check.worst_step,
            "tolerance": case.tolerance, "store_dtype": str(case.store.dtype),
            "metadata": "spectrum's config and rows digests; run directory config.json; rebuilt p, "
                        "parameters, steps, n_train, sample rate, sketch plan",
        },
        "orthonormalisation": "Rayleigh-Ritz of the exact rows on span(U_K): A = H^T U_K accumulated in "
                              "float64; eigh(A^T A) = W L W^T; sigma = L^1/2, V = A W L^-1/2, U = U_K W "
                              "(H^T u_i = sigma_i v_i); span(V) = span(H^T U_K Sigma_K^-1), whose Sigma^-1 "
                              "scaling changes no span",
        "row_norms": "row_sq_norms: ||h_i||^2 of the exact replayed rows (the sketched store holds only "
                     "sketched rows); with K = r, U and sigma are the exact SVD of H and gradspec decay forms "
                     "the rows' G_k from U, sigma and these",
        "device": str(case.config.device), "torch": torch.__version__,
        "seconds_replay": round(replayed, 3),  # the checks, the run's steps, the accumulation
    }
    src.update(col_ranges=[[0, p]], layout=case.layout, shape=[r, p], params=None, replay=record)
    params = {"k": kept, "k_requested": k, "method": "replay", "rank_rtol": None, "right_vectors": "parameter space",
              "reason": "replay of the seeded run: V = H^T U Sigma^-1 from its exact per-step rows",
              "k_reason": reason, "v_dtype": "float32", "center": False}
    rows = np.asarray(case.spectrum.source_rows, dtype=np.int64)  # U's row order
    created = SpectrumStore.create(stage, r=r, p=p, k=kept, method="replay", params=params, source=src,
                                   source_rows=rows,
                                   v_dtype="float32", overwrite=True)
    try:
        raw = np.zeros((p, K)) if keep_raw else None
        err2 = np.zeros(kept)
        vtv = np.zeros((kept, kept))
        kept_v = None if measure is None else np.lib.format.open_memmap(
            parts.tmp / "v.npy", mode="w+", dtype=np.float32, shape=(p, kept))
        with created.v_sink() as sink:
            for a, blk in parts.blocks():
                v64 = blk @ t
                v32 = v64.astype(np.float32)
                err2 += ((v64 - v32) ** 2).sum(0)
                vtv += v32.T.astype(np.float64) @ v32
                sink(a, v32)
                if kept_v is not None:
                    kept_v[a:a + v32.shape[0]] = v32
                if raw is not None:
                    raw[a:a + blk.shape[0]] = blk / case.sigma_sketch
        ortho = float(np.abs(vtv - np.eye(kept)).max())
        sigma = s[:kept]
        frob2 = check.frob2
        # H·v_i − σ_i·u_i = (I − P)·H·v_i with P = U_K·U_Kᵀ (P·H·v_i = σ_i·u_i): at most
        # ‖(I − P)·H‖_F = (‖H‖_F² − trace(AᵀA))^½, 0 when U_K spans every row (K = r).
        outside = math.sqrt(max(frob2 - float(np.trace(gram)), 0.0))
        bound = outside / sigma
        measured = hv = None
        if measure is not None:  # of the stored V: H·v_s,i − σ_i·u_i, both in float64
            parts.whole = None  # A is spent: the check's replays hold V's rows instead
            t1 = time.perf_counter()
            hv, more = measure(kept_v)
            hv = hv[rows]  # U's row order
            measured = np.linalg.norm(hv - u_out * sigma, axis=0) / sigma
            record["check_replay"] = {"passes": more, "seconds": round(time.perf_counter() - t1, 3),
                                      "residual_h_bound": [float(x) for x in bound]}
        result = PcaResult(
            sigma=sigma, U=u_out, V=None, method="replay", frob2=frob2,
            residual_h=bound if measured is None else measured, residual_ht=np.sqrt(err2),
            reconstruction_error=math.sqrt(max(0.0, 1.0 - float((sigma**2).sum()) / frob2)) if frob2 > 0 else 0.0,
            params=params, source=src, passes=passes, timings={"replay": replayed, "total": time.perf_counter() - t0},
            row_sq_norms=check.sq_norms[rows], hv=hv,
            check={"check": "replay" if measured is None else "replay+measured", "confidence": 1.0,
                   "residual_h_check": (RESIDUAL_BOUND if measured is None else RESIDUAL_MEASURED),
                   "check_text": "H·v_i - sigma_i·u_i " + (RESIDUAL_BOUND if measured is None else RESIDUAL_MEASURED),
                   "residual_ht_check": "measured: the rounding of V (formed in float64) to float32; "
                                        "H^T u_i = sigma_i v_i exactly (Rayleigh-Ritz)",
                   "orthogonality_v": ortho, "orthogonality_u": float(np.abs(u_out.T @ u_out - np.eye(kept)).max())},
        )
        created.finish(result)
        final = created.move_to(out)
    except BaseException:
        with contextlib.suppress(Exception):
            created.discard()
        raise
    logger.info("replay: %d rows checked (%d bit for bit, worst %.2g), %d directions -> %s", check.rows,
                check.exact, check.worst, kept, final.path)
    return ReplayResult(out=out, k=kept, sigma=sigma, sigma_sketch=case.sigma_sketch, steps=record["steps"],
                        rows_checked=check.rows, rows_exact=check.exact, max_relative_difference=check.worst,
                        passes=passes, seconds=time.perf_counter() - t0, orthogonality=ortho, record=record,
                        raw=raw, residual_h=np.asarray(result.residual_h), measured=measured is not None,
                        check_passes=int(record.get("check_replay", {}).get("passes", 0)))
