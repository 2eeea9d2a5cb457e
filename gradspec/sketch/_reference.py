"""The dense float64 reference of a sketch plan: materialised rows in, sketched rows out.

Used by the tests to check the fast path (`gradspec.train.GhostClipping` with a sketch)
exactly, and by anyone who wants to sketch rows they already have: the result equals the
stored row of the same per-example gradient (up to float32 rounding in the store).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gradspec.sketch._factors import block_factors, check_dense, dense_left, kron_apply, mixing
from gradspec.sketch._plan import SketchPlan


def sketch_rows(plan: SketchPlan, rows: Tensor) -> Tensor:
    """``Y = rows @ Phi^T`` in float64 (B, M) for the plan's linear map Phi (M x p).

    Args:
        plan: the plan.
        rows: (B, p) unsketched rows in the plan's parameter order (the layout's).

    Returns:
        (B, M) float64 sketched rows, columns as the plan lays them out.
    """
    rows = torch.as_tensor(rows).to(torch.float64)
    if rows.ndim != 2 or rows.shape[1] != plan.p:
        raise ValueError(f"rows must have shape (B, {plan.p}), got {tuple(rows.shape)}")
    b = rows.shape[0]
    out = torch.zeros(b, plan.M, dtype=torch.float64)
    for spec in plan.params:
        g = rows[:, spec.offset : spec.offset + spec.numel]
        if spec.kind == "exact":
            a, z = spec.columns[0]
            out[:, a:z] = g
            continue
        check_dense(spec)
        mix = mixing(plan, spec)
        x = g.reshape(b, *spec.matrix) if mix is None else mix(g.reshape(b, *spec.matrix))
        for j in range(plan.n_blocks):
            a, z = spec.columns[j]
            if spec.kind == "dense":
                out[:, a:z] = g @ block_factors(plan, spec, j).dense.T
            else:
                out[:, a:z] = kron_apply(dense_left(plan, spec, j), block_factors(plan, spec, j).right, x)
    return out


def sketch_matrix(plan: SketchPlan) -> Tensor:
    """The plan's map Phi as a dense (M, p) float64 matrix (small plans only: tests)."""
    return sketch_rows(plan, torch.eye(plan.p, dtype=torch.float64)).T.contiguous()
