"""What the per-example engines share: the batch and callback types, parameter selection
and layout, and the engine's common setup (checked microbatch, ordered names, layout) and
its once-per-run batch-of-one check.

The engines are :class:`~gradspec.train.PerExampleGradients` (rows, ``vmap``/``hooks``)
and :class:`~gradspec.train.GhostClipping` (norms and the clipped sum, ``ghost``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gradspec._layout import ParamLayout, match_names

Batch = dict[str, Tensor]
ForwardFn = Callable[[Callable[..., Tensor], Batch], Tensor]
LossFn = Callable[[Tensor, Batch], Tensor]


def select_parameters(model: nn.Module, patterns: str | Sequence[str]) -> list[str]:
    """Names of the parameters matching ``patterns``, in ``named_parameters`` order.

    Args:
        model: the module.
        patterns: shell globs (``*.query.weight``) or ``re:<regex>``, see ``match_names``.

    Returns:
        The matching names (at least one).

    Raises:
        ValueError: when no parameter matches; the message lists some that exist.
    """
    names = [n for n, _ in model.named_parameters()]
    chosen = match_names(names, patterns)
    if not chosen:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ValueError(
            f"no parameter of {type(model).__name__} matches {patterns!r}; "
            f"its parameters are: {shown or '(none)'}"
        )
    return chosen


def layout_for(model: nn.Module, names: Sequence[str]) -> ParamLayout:
    """The layout of ``names`` (ordered as in ``model.named_parameters()``)."""
    return ParamLayout.from_shapes((n, tuple(p.shape)) for n, p in _ordered(model, names))


def _ordered(model: nn.Module, names: Sequence[str]) -> list[tuple[str, nn.Parameter]]:
    wanted = list(names)
    if len(set(wanted)) != len(wanted):
        raise ValueError("parameter names must be unique")
    params = dict(model.named_parameters())
    missing = [n for n in wanted if n not in params]
    if missing:
        raise ValueError(
            f"{type(model).__name__} has no parameter {missing[0]!r}; "
            "pick names with select_parameters(model, patterns)"
        )
    keep = set(wanted)
    return [(n, p) for n, p in params.items() if n in keep]


def _arm_probe(engine: Any, probe_batch: Batch | None, check: bool) -> None:
    """Arm an engine's once-per-run batch-of-one check, running it now on ``probe_batch`` if given.

    Shared by :class:`PerExampleGradients` and ``GhostClipping``: ``engine._unprobed`` says
    the check is still due (the first batch of two or more examples then runs it).
    """
    engine._unprobed = bool(check)
    if probe_batch is not None and engine._unprobed:
        if _batch_size(probe_batch) < 2:
            raise ValueError("probe_batch needs at least 2 examples")
        engine._probe(probe_batch)


def _batch_size(batch: Batch) -> int:
    if not batch:
        raise ValueError("a batch needs at least one tensor")
    sizes = {k: v.shape[0] for k, v in batch.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"all tensors of a batch need the same first dimension, got {sizes}")
    return next(iter(sizes.values()))


def _rtol(dtype: torch.dtype) -> float:
    """Relative tolerance of a comparison of gradients computed in ``dtype``."""
    return {torch.float64: 1e-7, torch.float32: 1e-3}.get(dtype, 5e-2)


class EngineBase:
    """The setup every per-example engine shares (one place for its checks)."""

    model: nn.Module
    forward: ForwardFn
    loss: LossFn
    microbatch: int | None
    names: list[str]
    layout: ParamLayout

    def _bind(self, model: nn.Module, forward: ForwardFn, loss: LossFn, names: Sequence[str],
              microbatch: int | None) -> list[tuple[str, nn.Parameter]]:
        """Check and keep the engine's model, callbacks, microbatch and selected parameters
        (in ``named_parameters`` order); returns the ordered (name, parameter) pairs."""
        if microbatch is not None and microbatch < 1:
            raise ValueError(f"microbatch must be a positive number of examples, got {microbatch}")
        self.model, self.forward, self.loss, self.microbatch = model, forward, loss, microbatch
        ordered = _ordered(model, names)
        self.names = [n for n, _ in ordered]
        self.layout = layout_for(model, self.names)
        return ordered

    @property
    def p(self) -> int:
        """Columns of a row."""
        return self.layout.p
