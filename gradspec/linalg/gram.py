"""Exact top-k SVD through the r×r Gram matrix: the floor of the problem.

Pass 1 accumulates G = H·Hᵀ in float64 (r²·p flops counted symmetric, by the
Gram kernel measured fastest on the machine, see ``_kernels``; for float32 data
by default from float32 panel products, see ``_precision``); ``eigh`` gives
G = U·Λ·Uᵀ, σ_i = √λ_i; pass 2 streams V = Hᵀ·U_k·Σ_k⁻¹ (2·r·p·k flops)
column block by column block to the output and, with float32 products,
refines σ_i to the Rayleigh quotient ‖Hᵀu_i‖ (``_result.finalize``). Two reads
of H in all.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import scipy.linalg

from gradspec.linalg._result import PcaResult, finalize, sort_desc

logger = logging.getLogger(__name__)


def gram_svd(
    op: Any, k: int, consumer: Any = None
) -> tuple[np.ndarray, np.ndarray, dict[str, float], np.ndarray]:
    """-> (U r×k, σ k, timings, the Gram) from one pass over H and an r×r eigendecomposition.

    ``consumer``: the Gram pass's consumer instead of the plain one (a sketched store's
    ``SketchGram``, which keeps each sketch block's Gram too)."""
    t0 = time.perf_counter()
    g = op.gram() if consumer is None else op.fused([consumer])[0]
    t1 = time.perf_counter()
    r = g.shape[0]
    lam, w = scipy.linalg.eigh(g, subset_by_index=[r - k, r - 1], driver="evr", check_finite=False)
    lam, w = sort_desc(lam, w)
    t2 = time.perf_counter()
    logger.info("gram: %d×%d Gram in %.1fs, eigh in %.1fs", r, r, t1 - t0, t2 - t1)
    return w, np.sqrt(np.maximum(lam, 0.0)), {"gram": t1 - t0, "eigh": t2 - t1}, g


def gram_pca(
    op: Any, *, k: int, sink: Any = None, verify: bool | str = True, out_dtype: Any = np.float32,
    sketch: Any = None,
) -> PcaResult:
    """Exact top-k singular triplets of H (two passes).

    Args:
        op: a ``GradientOperator`` (or the Dask operator).
        k: number of singular triplets.
        sink: ``sink(offset, rows)`` receiving V's rows as they stream (None: keep V in memory).
        verify: the accuracy check of the V pass: ``"cheap"`` (or True: Gaussian probes of
            H·V, the Gram's eigen-residual, rounding terms), ``"full"`` (the products H·V and
            VᵀV, a second GEMM the size of V's) or ``"none"`` (or False); see ``_verify``.
        out_dtype: dtype V is written in.
        sketch: the ``SketchSelection`` of a sketched store (``gradspec.sketch``): the Gram
            pass keeps each sketch block's Gram (``_sketch.SketchGram``), and the accuracy
            report gets a ``sketch`` section (``gradspec.sketch.error_report``: intervals for
            σ, bounds on the subspace angles).

    Returns:
        PcaResult with σ descending, U (r×k), V (p×k or None when streamed), and the Gram
        matrix H·Hᵀ it was computed from (``gram``).
    """
    consumer = None
    if sketch is not None:
        from gradspec.linalg._sketch import SketchGram

        consumer = SketchGram(op, sketch)
    u, sigma, timings, g = gram_svd(op, k) if consumer is None else gram_svd(op, k, consumer)
    result = finalize(
        op,
        u,
        sigma,
        method="gram",
        sink=sink,
        out_dtype=out_dtype,
        verify=verify,
        params={"k": k},
        timings=timings,
        gram=g,
    )
    result.gram = g
    if consumer is not None:
        from gradspec.linalg._sketch import sketch_report

        t0 = time.perf_counter()
        result.check["sketch"] = sketch_report(consumer, op, result.k)
        result.params["right_vectors"] = "sketch space"
        result.timings["sketch_error"] = time.perf_counter() - t0
    return result
