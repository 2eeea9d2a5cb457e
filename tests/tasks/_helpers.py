"""Per-example gradients of a task, by vmap and by a batch-of-one reference loop."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from gradspec._layout import match_names
from gradspec.tasks import Batch, Task


def trainable_names(task: Task) -> list[str]:
    return match_names([n for n, _ in task.model.named_parameters()], list(task.params))


def vmap_grads(task: Task, batch: Batch) -> dict[str, Tensor]:
    """Per-example gradients with ``vmap(grad(functional_call))``, one example at a time."""
    model = task.model.eval()
    names = set(trainable_names(task))
    params = {n: p.detach() for n, p in model.named_parameters() if n in names}
    consts = {n: p.detach() for n, p in model.named_parameters() if n not in names}
    consts.update(dict(model.named_buffers()))

    def loss_of_one(params: dict[str, Tensor], example: Batch) -> Tensor:
        one = {k: v.unsqueeze(0) for k, v in example.items()}

        def call(*args, **kwargs):
            return functional_call(model, (params, consts), args, kwargs)

        return task.loss(task.forward(call, one), one)[0]

    return vmap(grad(loss_of_one), in_dims=(None, 0))(params, batch)


def loop_grads(task: Task, batch: Batch) -> dict[str, Tensor]:
    """The reference: autograd on each example as a batch of one."""
    model = task.model.eval()
    names = trainable_names(task)
    params = [model.get_parameter(n) for n in names]
    n = next(iter(batch.values())).shape[0]
    rows: list[tuple[Tensor, ...]] = []
    for i in range(n):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        loss = task.loss(task.forward(model, one), one)
        assert loss.shape == (1,)
        rows.append(torch.autograd.grad(loss[0], params))
    return {name: torch.stack([r[j] for r in rows]) for j, name in enumerate(names)}


def flat(grads: dict[str, Tensor]) -> Tensor:
    """Per-example gradients as an (n, p) matrix."""
    return torch.cat([g.flatten(1) for g in grads.values()], dim=1)
