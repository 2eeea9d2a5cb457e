"""Shared cases for the optimizer tests: a step context for driving hooks directly, and small configs."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from gradspec.tasks import make_task
from gradspec.train import CollectConfig, PerExampleGradients, StepContext, layout_for

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
             optimizer: str = "sgd", seed: int = 0, clip: float = 1.0, **fields) -> StepContext:
    """What a hook's ``setup(ctx)`` reads, without a trainer (Poisson sampling: the
    denominator is q n); ``fields`` replace the context's own (``params``, ``layout``)."""
    cfg = SimpleNamespace(sampling="poisson", batch_size=int(q * n), max_grad_norm=clip,
                          optimizer=optimizer, momentum=0.0, seed=seed)
    ctx = dict(layout=SimpleNamespace(p=p), device=torch.device("cpu"), noise_multiplier=sigma,
               sample_rate=q, n=n, denominator=q * n, config=cfg, task=task, params=(torch.zeros(p),))
    if task is not None:
        names = [nm for nm, _ in task.model.named_parameters()]
        ctx.update(per_example=PerExampleGradients(task.model, task.forward, task.loss, names),
                   layout=layout_for(task.model, names), model=task.model, names=tuple(names),
                   params=tuple(task.model.get_parameter(nm) for nm in names))
    return StepContext(**{**ctx, **fields})


def orthonormal(p: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(p, k, generator=g, dtype=torch.float64))
    return q


def subspace_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """sin of the largest principal angle between the column spans of a and b."""
    a, b = a.double(), b.double()
    return float(torch.linalg.matrix_norm(a @ a.T - b @ b.T, ord=2))
