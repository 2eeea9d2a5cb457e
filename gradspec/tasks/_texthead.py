"""The text task's classification head: reseeding it, fitting it on the public split
(L2 logistic regression on frozen features; no private example), and freezing the rest."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gradspec.tasks._base import TensorData


def _reseed_head(model: nn.Module, seed: int, std: float) -> None:
    """Draw the final classifier matrix from ``seed`` with standard deviation ``std``."""
    head = getattr(model, "classifier", None)
    weight = getattr(head, "out_proj", head)
    weight = getattr(weight, "weight", None)
    if weight is None:
        raise ValueError("head_std needs a model whose head is `classifier` (BERT, RoBERTa, DistilBERT)")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=generator) * std)


def _head_linear(model: nn.Module) -> nn.Linear:
    head = getattr(model, "classifier", None)
    linear = getattr(head, "out_proj", head)
    if not isinstance(linear, nn.Linear):
        raise ValueError("fitting the head needs a model whose head is a Linear `classifier` "
                         "(or `classifier.out_proj`): BERT, RoBERTa, DistilBERT")
    return linear


def fit_head_on(model: nn.Module, forward: Callable[..., Tensor], data: TensorData, *,
                l2: float = 1e-2, batch_size: int = 64, max_iter: int = 200) -> dict[str, Any]:
    """Fit the final classifier to ``data`` by L2-regularised logistic regression; the body is fixed.

    The classifier's inputs are recorded once (model in eval mode, no gradients), then
    ``mean cross-entropy + l2/2 · ‖W‖²`` (bias not penalised) is minimised from zero by
    L-BFGS in float64 — a convex problem, so the result depends on the data and ``l2``
    only. Returns what was fitted (examples, training accuracy and loss, gradient norm).
    """
    linear = _head_linear(model)
    feats: list[Tensor] = []
    handle = linear.register_forward_hook(lambda _m, args, _out: feats.append(args[0].detach()))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(data), batch_size):
                batch = {k: v[i:i + batch_size] for k, v in data.tensors.items()}
                forward(model, batch)
    finally:
        handle.remove()
        model.train(was_training)
    x = torch.cat(feats).double()
    y = data.tensors["labels"].long()
    w = torch.zeros(linear.out_features, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(linear.out_features, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=max_iter, tolerance_grad=1e-10, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def objective() -> Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(x @ w.T + b, y) + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(objective)
    loss = objective()
    grad_norm = float(torch.cat([w.grad.flatten(), b.grad.flatten()]).norm())
    with torch.no_grad():
        linear.weight.copy_(w.detach().to(linear.weight.dtype))
        if linear.bias is not None:
            linear.bias.copy_(b.detach().to(linear.bias.dtype))
        acc = float(((x @ w.T + b).argmax(1) == y).double().mean())
    return {"init": "fitted on the public split", "examples": len(data), "l2": l2,
            "public_accuracy": acc, "objective": loss.item(), "grad_norm": grad_norm,
            "ids": "the task's public split"}


def _freeze_except(model: nn.Module, patterns: Sequence[str]) -> None:
    from gradspec.store import match_names

    names = [n for n, _ in model.named_parameters()]
    selected = set(match_names(names, list(patterns)))
    if not selected:
        raise ValueError(f"no parameter matches {list(patterns)}; names look like {names[:4]}")
    for name, param in model.named_parameters():
        param.requires_grad_(name in selected)
