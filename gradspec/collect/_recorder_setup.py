"""What a recorder needs before its first row: the recorded parameters and their layout, the
store's name in a run directory, the run lock, the user's module inside Opacus wrappers, and
the torch dtype of each store dtype."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from gradspec.store import ParamLayout

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


def resolve_layout(model, params, layout) -> tuple[list[str], list[Tensor] | None, ParamLayout]:
    """The recorded parameters' names, tensors (None from a layout alone) and row layout, from
    exactly one of: ``model`` (with ``params`` patterns), a ``params`` mapping, a ``layout``."""
    if layout is not None:
        if model is not None or params is not None:
            raise ValueError("give the rows' layout by model (and params), by params alone, or by layout; not several")
        return layout.names, None, layout
    if isinstance(params, Mapping):
        if model is not None:
            raise ValueError("params as a name -> parameter mapping replaces model; pass one of them")
        named = list(params.items())
    elif model is not None:
        from gradspec.train import select_parameters

        inner = unwrap_model(model)
        if params is None:
            named = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
            if not named:
                raise ValueError(f"{type(inner).__name__} has no parameter with requires_grad; pass params=")
        else:
            chosen = set(select_parameters(inner, params))
            named = [(n, p) for n, p in inner.named_parameters() if n in chosen]
    else:
        raise ValueError("a GradientRecorder needs the recorded parameters: pass model=, params= or layout=")
    for name, p in named:
        if not isinstance(p, Tensor):
            raise ValueError(f"params[{name!r}] is a {type(p).__name__}, not a tensor")
    layout = ParamLayout.from_shapes((n, tuple(p.shape)) for n, p in named)
    return [n for n, _ in named], [p for _, p in named], layout

