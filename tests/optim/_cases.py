"""Shared cases for the optimizer tests: a fake run for driving hooks directly, and small configs."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from gradspec.tasks import make_task
from gradspec.train import CollectConfig, PerExampleGradients, layout_for

LOWRANK = dict(n=120, n_eval=60, d=16, r=3)


def lowrank_task(seed: int = 0, **kw):
    return make_task("lowrank", seed=seed, **{**LOWRANK, **kw})


def config(**kw) -> CollectConfig:
    base = dict(task="lowrank", task_options=LOWRANK, steps=8, batch_size=24, noise_multiplier=1.0,
                optimizer="sgd", lr=0.3, eval_every=0, log_every=4, checkpoint_every=4, accounting="rdp",
                microbatch=None)
    base.update(kw)
    return CollectConfig(**base)


def fake_run(p: int, *, sigma: float = 1.0, q: float = 0.25, n: int = 40, task=None,
             optimizer: str = "sgd", seed: int = 0, clip: float = 1.0):
    """What a hook's ``setup(run)`` reads, without a trainer."""
    cfg = SimpleNamespace(sampling="poisson", batch_size=int(q * n), max_grad_norm=clip,
                          optimizer=optimizer, momentum=0.0, seed=seed)
    run = SimpleNamespace(
        layout=SimpleNamespace(p=p), device=torch.device("cpu"), sigma=sigma, q=q, n=n,
        config=cfg, task=task, params=[torch.zeros(p)], step=0,
    )
    if task is not None:
        names = [nm for nm, _ in task.model.named_parameters()]
        run.grads = PerExampleGradients(task.model, task.forward, task.loss, names)
        run.layout = layout_for(task.model, names)
        run.params = [task.model.get_parameter(nm) for nm in names]
        run.model, run.names = task.model, names
    return run


def orthonormal(p: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(p, k, generator=g, dtype=torch.float64))
    return q


def subspace_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """sin of the largest principal angle between the column spans of a and b."""
    a, b = a.double(), b.double()
    return float(torch.linalg.matrix_norm(a @ a.T - b @ b.T, ord=2))
