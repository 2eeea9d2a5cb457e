"""What a task is: a model, its data and its loss, in a form every trainer can use.

A task's data are in-memory tensors (``TensorData``); a batch is a dict of
tensors whose first dimension is the batch. The model is called through
``forward(call, batch)``, where ``call(*args, **kwargs)`` invokes the model, so
the same task serves a plain call and ``torch.func.functional_call`` (per-example
gradients with ``vmap``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

Batch = dict[str, Tensor]


@dataclass
class TensorData:
    """An in-memory dataset: named tensors sharing their first dimension."""

    tensors: dict[str, Tensor]

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"all tensors of a dataset need the same first dimension, got {sizes}")

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def batch(self, index: Tensor | Sequence[int] | slice) -> Batch:
        """The examples at ``index`` as a batch."""
        if not isinstance(index, slice):
            index = torch.as_tensor(index, dtype=torch.long)
        return {k: v[index] for k, v in self.tensors.items()}


def cross_entropy_loss(outputs: Tensor, batch: Batch) -> Tensor:
    """Per-example cross-entropy of logits against ``batch['labels']``."""
    return nn.functional.cross_entropy(outputs, batch["labels"], reduction="none")


def accuracy(outputs: Tensor, batch: Batch) -> dict[str, float]:
    """Mean classification accuracy of logits against ``batch['labels']``."""
    return {"accuracy": (outputs.argmax(-1) == batch["labels"]).float().mean().item()}


@dataclass
class Task:
    """A model with its data, loss and metrics.

    Attributes:
        name: registry name (or a user's label).
        model: the module; its selected parameters are trained and collected.
        train: training data.
        eval: held-out data for evaluation.
        forward: ``forward(call, batch) -> outputs`` where ``call`` invokes the model.
        loss: ``loss(outputs, batch) -> per-example losses`` of shape (B,).
        metrics: ``metrics(outputs, batch) -> {name: value}`` averaged over the batch.
        params: name patterns (globs, or ``re:`` regexes) of the parameters to train
            and collect; all others are frozen.
        config: what built the task, recorded in the store.
    """

    name: str
    model: nn.Module
    train: TensorData
    eval: TensorData
    forward: Callable[[Callable[..., Tensor], Batch], Tensor]
    loss: Callable[[Tensor, Batch], Tensor] = cross_entropy_loss
    metrics: Callable[[Tensor, Batch], dict[str, float]] = accuracy
    params: tuple[str, ...] = ("*",)
    config: dict = field(default_factory=dict)
