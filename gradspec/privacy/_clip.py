"""Flat (all-parameter) clipping of per-example gradients, the first half of DP-SGD.

`clip_factors` is the one clipping formula of gradspec: ``C / max(||g|| + eps, C)``.
With ``eps = 0`` (the default, and what the trainer's DP step and its stored rows use)
that is the exact ``min(1, C / ||g||)``: rows with norm <= C (zero rows included, so no
guard is needed) are left untouched and longer rows get norm C up to rounding. With
``eps = 1e-6`` it is Opacus's ``min(1, C / (||g|| + 1e-6))``, which shrinks rows just
below C a little; `PerExampleGradients.clipped_sum` uses that (``OPACUS_CLIP_EPS``).
Norms are accumulated in float64, whatever the rows' dtype, and `clip_rows` guarantees the
bound every DP statement rests on exactly: the float64 norm of each clipped row, *as stored*
in the rows' dtype (or the dtype a store will cast it to), is <= C. Rounding the product
``g * factor`` to float32/float16/bfloat16 can push a row at norm C above it by a few units
in the last place; such rows are scaled down again (by the smallest margin that works) until
the stored values meet the bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from gradspec._norms import row_norms64

#: Opacus's guard added to a norm before dividing by it (``clip_factors(..., eps=...)``).
OPACUS_CLIP_EPS = 1e-6


class ClipResult(NamedTuple):
    """Output of `clip_per_example`."""

    grads: Tensor  # (B, p) clipped gradients, dtype of the input
    norms: Tensor  # (B,) pre-clip L2 norms
    factors: Tensor  # (B,) scale factors min(1, C / norm), in (0, 1]


def _check_max_norm(max_norm: float) -> float:
    if isinstance(max_norm, bool) or not isinstance(max_norm, int | float):
        raise TypeError(f"max_norm must be a number, got {max_norm!r}")
    if not (math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"max_norm (the clipping norm C) must be finite and > 0, got {max_norm}")
    return float(max_norm)


def clip_factors(norms: Tensor, max_norm: float, *, eps: float = 0.0) -> Tensor:
    """Per-example scale factors ``C / max(norm + eps, C)`` (1 for zero norms).

    For callers that compute norms themselves, e.g. over microbatches. ``eps = 0`` is
    the exact ``min(1, C / norm)``; ``eps = OPACUS_CLIP_EPS`` is Opacus's formula.

    Args:
        norms: (B,) per-example L2 norms, >= 0.
        max_norm: the clipping norm C > 0.
        eps: added to each norm before dividing by it (>= 0; default 0).

    Returns:
        (B,) factors in (0, 1], same dtype and device as ``norms``.
    """
    c = _check_max_norm(max_norm)
    if not torch.is_floating_point(norms):
        raise TypeError(f"norms must be a floating tensor, got {norms.dtype}")
    if not eps:
        return c / norms.clamp(min=c)
    return c / (norms + eps).clamp(min=c)


def _unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


def bound_rows_(rows: Tensor, max_norm: float, *, dtype: torch.dtype | None = None,
                norms: Tensor | None = None) -> Tensor:
    """Make every row's float64 norm, as stored in ``dtype``, at most C (in place when possible).

    Rows already under C are returned unchanged (bit for bit). A row whose stored values
    exceed C (rounding of an already clipped row) is scaled by ``C / norm * (1 - m)`` and
    re-rounded, with the margin m growing 4x a pass until it holds (a few u at most, u the unit
    roundoff of ``dtype``).

    Rows of the dtype they are stored in are scaled in place, one row at a time, in their own
    dtype (the float64 factor rounded to it: the result is then within (1 + 2u) of the scaled
    row, which the re-check and the margin absorb; m starts at u); no row is copied. A
    1,060,170-wide batch of 32 Opacus rows took 1,012 ms a step when every row over C was
    copied, widened to float64, scaled and narrowed back. Rows converted to a narrower
    ``dtype`` are scaled from the rows given, then rounded once: float32 CPU rows row by row in
    float32 tiles (``_rescale_rows_float32``), others in float64, the offending rows together in
    passes of at most 256 MiB; m starts at u/√p, what one rounding moves a norm by (at u, every
    clipped row of a bfloat16 store lost 0.4% of its norm).

    Args:
        rows: (B, p) rows (already clipped, or any rows: the result is bounded either way).
        max_norm: the clipping norm C > 0.
        dtype: the dtype the rows are stored in (default: ``rows.dtype``); the result has it.
        norms: the rows' float64 norms (``gradspec._norms.row_norms64``) where the caller has
            them (rows already of ``dtype``), so that they are not computed twice.

    Returns:
        (B, p) rows in ``dtype`` with ``row_norms64(row) <= C`` for every row.
    """
    c = _check_max_norm(max_norm)
    if not torch.is_floating_point(rows):
        raise TypeError(f"rows must be floating point, got {rows.dtype}")
    in_place = dtype is None or rows.dtype == dtype
    out = rows if in_place else rows.to(dtype)
    if norms is None or not in_place:
        norms = row_norms64(out)
    u = _unit_roundoff(out.dtype)
    every = torch.nonzero(norms > c).flatten()
    if in_place:
        for i in every.tolist():
            over, margin = float(norms[i]), u
            while over > c:
                if margin > 256 * u:
                    raise RuntimeError(f"row {i} cannot be brought under C = {c} (norm {over})")
                out[i].mul_((c / over) * (1.0 - margin))
                over = float(row_norms64(out[i : i + 1])[0])
                margin *= 4
        return out
    # Converted rows are scaled from the rows given (each is rounded once more, not twice) by
    # min(1, C / ‖row‖)·(1 − m). One rounding moves a norm by about u/√p relative, so m starts
    # there and grows 4x a pass: starting at u shrank every clipped bfloat16 row by 0.4%.
    first = u / math.sqrt(max(1, out.shape[1]))
    if rows.dtype == torch.float32 and rows.device.type == "cpu" and rows.dim() == 2:
        _rescale_rows_float32(out, rows, every, norms, c, first, u)
        return out
    per = max(1, (1 << 25) // max(1, out.shape[1]))  # rows a pass holds in float64: <= 256 MiB
    for start in range(0, every.numel(), per):
        idx = every[start : start + per]
        src = rows[idx].double()
        scale = (c / row_norms64(src)).clamp(max=1.0)
        over, margin = norms[idx], first  # each row over C takes the margins m, 4m, 16m, ... (vectorised)
        while idx.numel():
            if margin > 256 * u:
                raise RuntimeError(f"row {int(idx[0])} cannot be brought under C = {c} (norm {float(over[0])})")
            fixed = (src * (scale * (1.0 - margin))[:, None]).to(out.dtype)
            out[idx] = fixed
            over = row_norms64(fixed)
            still = over > c
            idx, over, src, scale = idx[still], over[still], src[still], scale[still]
            margin *= 4
    return out


#: Entries a float32 row is scaled and rounded in at a time (4 MiB: the tile stays in cache).
_TILE = 1 << 20


def _rescale_rows_float32(out: Tensor, rows: Tensor, every: Tensor, norms: Tensor, c: float, first: float,
                          u: float) -> None:
    """``bound_rows_``'s narrow branch for float32 CPU rows: each row over C is written again as
    round(row · min(1, C/‖row‖)·(1 − m)), the product in float32 a tile at a time into one reused
    buffer, m growing 4x until its float64 norm as stored is at most C.

    The float64 branch copied each such row to float64 and rounded float64 to 16 bits: 45% of a
    whole-MiniLM per-example bfloat16 collection. A float32 product errs by at most 2⁻²⁴ of an
    entry, far below one 16-bit rounding (2⁻⁹ for bfloat16), and the check is on the stored values."""
    width = rows.shape[1]
    buf = torch.empty(min(_TILE, max(1, width)), dtype=torch.float32)
    for i in every.tolist():
        src, dst = rows[i], out[i]
        scale = min(1.0, c / float(row_norms64(rows[i : i + 1])[0]))
        over, margin = float(norms[i]), first
        while over > c:
            if margin > 256 * u:
                raise RuntimeError(f"row {i} cannot be brought under C = {c} (norm {over})")
            factor = scale * (1.0 - margin)
            for j in range(0, width, _TILE):
                seg = src[j : j + _TILE]
                t = buf[: seg.numel()]
                torch.mul(seg, factor, out=t)
                dst[j : j + _TILE].copy_(t)
            over = float(row_norms64(out[i : i + 1])[0])
            margin *= 4


def clip_rows(grads: Tensor, max_norm: float, *, dtype: torch.dtype | None = None,
              eps: float = 0.0, in_place: bool = False) -> ClipResult:
    """Clip each row to norm at most C, exactly: ``clip_per_example`` with the rows' dtype
    (or ``dtype``) given, norms accumulated in float64 and the bound checked on the stored values.

    Args:
        grads: (B, p) per-example gradients.
        max_norm: the clipping norm C > 0.
        dtype: the dtype of the clipped rows (default: ``grads.dtype``).
        eps: as in :func:`clip_factors` (Opacus's formula with ``OPACUS_CLIP_EPS``).
        in_place: scale ``grads`` itself (the caller owns it and needs the unclipped rows no
            more; ``dtype`` must be its own): at whole-model width a microbatch's clipped copy
            is another (B, p) float32 block, 0.73 GB for 8 rows of MiniLM.

    Returns:
        ClipResult(grads (B, p) in ``dtype`` with float64 norms <= C, norms (B,) float64
        pre-clip norms, factors (B,) float64).
    """
    if grads.ndim != 2:
        raise ValueError(f"grads must be 2-d (batch, parameters), got shape {tuple(grads.shape)}")
    norms = row_norms64(grads)
    factors = clip_factors(norms, max_norm, eps=eps)
    target = grads.dtype if dtype is None else dtype
    if in_place and target != grads.dtype:
        raise ValueError(f"clip_rows in place keeps the rows' dtype ({grads.dtype}), not {target}")
    if bool((factors == 1).all()):
        clipped = grads if in_place else grads.to(target)
    elif in_place:
        clipped = grads.mul_(factors[:, None].to(grads.dtype))
    else:
        clipped = (grads * factors[:, None].to(grads.dtype)).to(target)
    return ClipResult(bound_rows_(clipped, max_norm), norms, factors)


def clip_per_example(grads: Tensor, max_norm: float) -> ClipResult:
    """Clip each row of ``grads`` to L2 norm at most ``max_norm``.

    Args:
        grads: (B, p) per-example gradients, flattened over all parameters.
        max_norm: the clipping norm C > 0.

    Returns:
        ClipResult(grads=g_i * min(1, C/||g_i||), norms=||g_i||, factors).

    Raises:
        ValueError: if ``grads`` is not 2-d or C is not a positive finite number.

    Example:
        >>> r = clip_per_example(torch.tensor([[3.0, 4.0], [0.3, 0.4]]), 1.0)
        >>> r.grads.norm(dim=1).tolist(), r.norms.tolist()
        ([1.0, 0.5], [5.0, 0.5])
    """
    return clip_rows(grads, max_norm)


def per_parameter_norms(grads: Tensor, spans: Sequence[tuple[int, int]]) -> Tensor:
    """Each row's L2 norm over each column span (a parameter's part of a flat row), in float64.

    ``||g_i||^2`` is the sum of the squares over the spans when they tile the row (up to
    rounding; the clip factor uses `clip_rows`'s own norm of the whole row).

    Args:
        grads: (B, p) per-example gradients.
        spans: ``(start, stop)`` column ranges, e.g. ``(spec.offset, spec.stop)`` of a layout.

    Returns:
        (B, len(spans)) float64 norms, on ``grads``'s device.
    """
    if grads.ndim != 2:
        raise ValueError(f"grads must be 2-d (batch, parameters), got shape {tuple(grads.shape)}")
    if not spans:
        return torch.zeros(grads.shape[0], 0, dtype=torch.float64, device=grads.device)
    return torch.stack([row_norms64(grads[:, a:b]) for a, b in spans], dim=1)


def norm_stats(norms: Tensor, max_norm: float) -> dict[str, float]:
    """Summary of pre-clip norms: mean, max, and the fraction of rows clipped (norm > C)."""
    c = _check_max_norm(max_norm)
    if norms.numel() == 0:
        raise ValueError("norm_stats needs at least one norm, got none")
    norms = norms.detach().double()
    return {
        "mean": float(norms.mean()),
        "max": float(norms.max()),
        "frac_clipped": float((norms > c).double().mean()),
    }
