"""The one place DP noise is drawn."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def gaussian_noise(
    shape_or_like: Sequence[int] | torch.Size | Tensor,
    std: float,
    *,
    generator: torch.Generator | None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Draw N(0, std^2) noise: the Gaussian mechanism's noise for DP-SGD.

    Every DP noise draw in gradspec goes through this function (as Opacus's
    ``_generate_noise``), so the randomness of a run is one explicit generator.
    For DP-SGD, ``std = noise_multiplier * max_grad_norm``.

    Args:
        shape_or_like: a shape, or a tensor whose shape (and, when ``device``
            is None, device) the noise takes. Its dtype is not taken: noise is
            drawn in ``dtype`` (float32 by default, also for half-precision
            gradients, whose noise should be drawn at full precision).
        std: standard deviation, finite and >= 0 (0 gives zeros).
        generator: the torch.Generator to draw from, on ``device``; None uses
            torch's global generator (not reproducible across runs: prefer one).
        device: where to draw; default the generator's device for a shape, the
            tensor's device for a tensor.
        dtype: a floating dtype.

    Returns:
        A tensor of the requested shape.

    Raises:
        ValueError: for a bad std, a non-floating dtype, or a generator on another device.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> gaussian_noise((3,), 1.0, generator=g).shape
        torch.Size([3])
    """
    if (
        isinstance(std, bool)
        or not isinstance(std, int | float)
        or not math.isfinite(std)
        or std < 0
    ):
        raise ValueError(f"noise std must be a finite number >= 0, got {std!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"noise dtype must be a floating dtype, got {dtype}")
    if isinstance(shape_or_like, Tensor):
        shape = tuple(shape_or_like.shape)
        if device is None:
            device = shape_or_like.device
    else:
        shape = tuple(int(s) for s in shape_or_like)
        if any(s < 0 for s in shape):
            raise ValueError(f"noise shape must be non-negative, got {shape}")
    if device is None:
        device = generator.device if generator is not None else torch.device("cpu")
    device = torch.device(device)
    if generator is not None and generator.device.type != device.type:
        raise ValueError(
            f"the noise generator is on {generator.device} but the noise is drawn on {device}; "
            f"create it with torch.Generator({str(device)!r})"
        )
    noise = torch.empty(shape, device=device, dtype=dtype)
    if std == 0:
        return noise.zero_()
    return noise.normal_(0.0, float(std), generator=generator)
