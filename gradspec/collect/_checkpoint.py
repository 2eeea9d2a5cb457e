"""Training checkpoints: written atomically, validated when loaded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_FORMAT = 1


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    torch.save({"format": CHECKPOINT_FORMAT, **state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`; check its format and keys."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}: the run cannot be resumed; start it anew")
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not a gradspec checkpoint of format {CHECKPOINT_FORMAT}")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} lacks {missing}; it is damaged — start the run anew")
    return state
