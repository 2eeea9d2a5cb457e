"""What a recorder needs before its first row: the store's name in a run directory, the run
lock, the user's module inside Opacus wrappers, and the torch dtype of each store dtype."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

#: The torch dtype of each store dtype: the store casts float32 rows with torch's rounding.
STORE_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

STORE_NAME = "gradients.zarr"

def _acquire_run_lock(out: Path) -> Any:
    """Take the run directory's one-writer lock (:class:`gradspec.store.RunLock`), before anything is touched.

    Raises:
        DirectoryBusyError: another process (or thread) writes in ``out``.
    """
    from gradspec.store import RunLock

    return RunLock(out, what="run directory").acquire()


def _release_run_lock(lock: Any) -> None:
    if lock is not None:
        lock.release()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside Opacus wrappers (``GradSampleModule``), for parameter names."""
    while type(model).__module__.startswith("opacus.") and isinstance(getattr(model, "_module", None), nn.Module):
        model = model._module
    return model


