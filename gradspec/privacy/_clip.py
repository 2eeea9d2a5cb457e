"""Flat (all-parameter) clipping of per-example gradients, the first half of DP-SGD.

`clip_factors` is the one clipping formula of gradspec: ``C / max(||g|| + eps, C)``.
With ``eps = 0`` (the default, and what the trainer's DP step and its stored rows use)
that is the exact ``min(1, C / ||g||)``: rows with norm <= C (zero rows included, so no
guard is needed) are left untouched and longer rows get norm C up to rounding. With
``eps = 1e-6`` it is Opacus's ``min(1, C / (||g|| + 1e-6))``, which shrinks rows just
below C a little; `PerExampleGradients.clipped_sum` uses that (``OPACUS_CLIP_EPS``).
Norms are computed in float32 at least, also for half-precision gradients.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

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
    if grads.ndim != 2:
        raise ValueError(f"grads must be 2-d (batch, parameters), got shape {tuple(grads.shape)}")
    norm_dtype = torch.promote_types(grads.dtype, torch.float32)
    norms = torch.linalg.vector_norm(grads, dim=1, dtype=norm_dtype)
    factors = clip_factors(norms, max_norm)
    return ClipResult(grads * factors[:, None].to(grads.dtype), norms, factors)


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
