"""Device resolution, shared by the trainer and the spectral engine.

One accepted set of names: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` and ``"auto"`` (CUDA
when available, else CPU), or a ``torch.device`` of those. (The spectral engine's
CUDA transfer machinery stays in `gradspec.linalg`.)
"""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device = "cpu") -> torch.device:
    """``"cpu"`` | ``"cuda"`` | ``"cuda:N"`` | ``"auto"`` (CUDA when available) -> a torch device.

    Raises:
        ValueError: for another name, or a CUDA device when CUDA is not available.
    """
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {name!r} requested but CUDA is not available; use --device cpu or auto"
            )
        return torch.device(name)
    if name != "cpu":
        raise ValueError(f"unknown device {name!r}; choose cpu, cuda, cuda:N or auto")
    return torch.device("cpu")
