"""What a Dask worker runs on one column block of H: the local engine, unchanged.

A block spans every selected row (the Dask operator rechunks so), so each
product of ``_passes`` is block-local: the worker wraps its block in a
:class:`~gradspec.linalg._operator.GradientOperator` and runs one fused pass
with the same consumer the local engine would use — the same precision policy
(``_precision``), the same panel widening, and the Gram kernel chosen by
measurement on *that worker's machine* (``_kernel_choice``, cached in the
worker's own cache directory). Partial results are float64 and summed across
blocks on the cluster (:func:`add_parts`); the rows of Hᵀ·Y or V a block
produces come back beside its sums.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradspec.linalg._kernel_choice import choose_gram_kernel
from gradspec.linalg._operator import GradientOperator
from gradspec.linalg._operator_base import ArraySink
from gradspec.linalg._passes import _Gram, _HHt, _Matmat, _Project, _Rmatmat

#: Pass kinds a block task runs, and what each one returns as its summed part.
KINDS = ("norms", "gram", "hht", "matmat", "rmatmat", "project")


def run_block(
    block: np.ndarray,
    kind: str,
    args: dict[str, Any],
    *,
    precision: str,
    kernel: str,
    center: bool,
    flops: float,
    need_norms: bool,
) -> dict[str, Any]:
    """One pass of ``kind`` over one column block (r×w) on a worker.

    Args:
        block: the block as read (float32 or float64; the store's narrow dtypes arrive widened
            to float32 by the reader).
        kind: one of :data:`KINDS`.
        args: the pass's operands: ``q`` (hht), ``x`` (matmat: this block's rows of X), ``y``
            (rmatmat), ``u``/``sigma``/``out_dtype``/``verify``/``omega``/``seed``/``col0`` (project;
            ``col0``: the block's first column in H).
        precision: the resolved precision (never ``"auto"``: the driver resolves it for all).
        kernel: the Gram kernel, or ``"auto"`` (the worker's measured choice).
        center: subtract each column's mean over the rows.
        flops: the whole pass's Gram flops (r²p), so every worker decides as the local engine
            would for the whole matrix whether measuring kernels is worth it.
        need_norms: also return the block's squared row norms (the driver's first pass).

    Returns:
        ``{"sum": the consumer's result (ndarray, dict of ndarrays or None), "norms": ndarray or
        None, "rows": the block's rows of a p×b result or None, "kernel": (name, why) or None,
        "flops": what the block's products counted (symmetric-counted, as the local pass log)}``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown pass kind {kind!r}")
    op = GradientOperator(block, precision=precision, kernel=kernel, center=center, prefetch=0)
    r, w = op.shape
    if not need_norms:
        op.row_sq_norms = np.zeros(r)  # not the first pass: no norms to take
    sink: ArraySink | None = None
    consumers: list[Any] = []
    if kind == "gram":
        op.kernel_choice = choose_gram_kernel(kernel, dtype=op.dtype, device=op.device, flops=flops,
                                              rows=r)
        consumers = [_Gram(op)]
    elif kind == "hht":
        consumers = [_HHt(op, args["q"])]
    elif kind == "matmat":
        consumers = [_Matmat(op, args["x"])]
    elif kind == "rmatmat":
        sink = ArraySink(w, args["y"].shape[1], np.float64)
        consumers = [_Rmatmat(op, args["y"], sink)]
    elif kind == "project":
        sink = ArraySink(w, args["u"].shape[1], args["out_dtype"])
        consumers = [_Project(op, args["u"], args["sigma"], sink, args["out_dtype"], args["verify"],
                              None, args.get("omega"), args.get("seed", 0), args.get("col0", 0))]
    out = op.fused(consumers)
    return {
        "sum": out[0] if out else None,
        "norms": op.row_sq_norms if need_norms else None,
        "rows": None if sink is None else sink.array,
        "kernel": op.kernel_choice,
        "flops": sum(c.flops(r, w) for c in consumers),
    }


def add_parts(a: Any, b: Any) -> Any:
    """The sum of two partial results: arrays, dicts of arrays (key by key) or None."""
    if a is None or b is None:
        return a if b is None else b
    if isinstance(a, dict):
        return {key: add_parts(a[key], b[key]) for key in a}
    return a + b


def pick(part: dict[str, Any], key: str) -> Any:
    """One field of a block task's result (a task of its own, so the rest stays on the worker)."""
    return part[key]


__all__ = ["KINDS", "add_parts", "pick", "run_block"]
