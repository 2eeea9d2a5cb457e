"""What a training run produced (`TrainResult`), the versions it ran with, and the
evaluation on a task's held-out split."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from gradspec.tasks import Task


@dataclass(frozen=True)
class TrainResult:
    """What a training run (`train`, `collect`) produced; ``store`` is None when it wrote none.

    A distributed run's ranks each return one: the writer's (``rank`` 0) names the store and
    its rows; the others' ``store`` is None and ``rows`` 0 (their steps, noise multiplier,
    sample rate and epsilon are the run's, the same on every rank).
    """

    out: Path
    store: Path | None
    metrics: Path
    rows: int
    steps: int
    noise_multiplier: float
    sample_rate: float
    delta: float
    epsilon: float
    final_metrics: dict[str, float]
    rank: int = 0
    world_size: int = 1
    #: the rate the accountant counted: ``sample_rate`` (B / n) under Poisson sampling,
    #: 1 / (n // B) for shuffled batches (one Gaussian mechanism a batch of an epoch); NaN: unknown
    accounted_sample_rate: float = float("nan")


#: The name of :class:`TrainResult` while the trainer lived in ``gradspec.collect``.
CollectResult = TrainResult


def package_versions() -> dict[str, str]:
    """Versions of gradspec, Python and the libraries a run depends on (saved with its data)."""
    out = {}
    for name in ("gradspec", "torch", "numpy", "zarr", "transformers", "dp-accounting", "opacus"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    out["python"] = sys.version.split()[0]
    return out


@torch.no_grad()
def evaluate(task: Task, model: torch.nn.Module, device: torch.device, batch_size: int = 256) -> dict[str, float]:
    """Mean loss and metrics of ``model`` on ``task.eval``."""
    n = len(task.eval)
    totals: dict[str, float] = {}
    for start in range(0, n, batch_size):
        batch = {k: v.to(device) for k, v in task.eval.batch(slice(start, start + batch_size)).items()}
        outputs = task.forward(model, batch)
        b = next(iter(batch.values())).shape[0]
        values = {"loss": task.loss(outputs, batch).mean().item(), **task.metrics(outputs, batch)}
        for k, v in values.items():
            totals[k] = totals.get(k, 0.0) + v * b
    return {f"eval_{k}": v / n for k, v in totals.items()}


