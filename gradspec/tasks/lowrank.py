"""Linear and logistic regression on data of exact rank r (the GLM case of Li et al. 2022, §3).

The design is ``X = Z W`` with ``Z`` (n x r) and ``W`` (r x d) standard normal (``W``
scaled by ``1/sqrt(d)``), drawn from the seed, so every row of ``X`` lies in the
r-dimensional row space of ``W``. The model is ``x -> w^T x`` without bias, so every
per-example gradient ``l'(w^T x_i, y_i) x_i`` lies in that row space too: the gradient
matrix has rank exactly r (Song et al. 2021; Li et al. 2022, §3 "rank-dependent bounds").

Labels come from a planted ``w*`` (standard normal, scaled so that ``X w*`` has unit
standard deviation on the training data):

- ``kind="linear"``: ``y = X w* + noise * N(0, 1)``, squared loss ``(w^T x - y)^2 / 2``;
  data key ``"targets"`` (float).
- ``kind="logistic"``: ``y ~ Bernoulli(sigmoid(margin * X w*))``, logistic loss;
  data key ``"labels"`` (0/1 long).

Splits: ``n`` private training examples, ``n_eval`` held-out and ``n_public`` public ones,
all i.i.d. from the same ``W`` and ``w*``; the public examples are drawn after the others,
so the training and held-out data do not depend on ``n_public``. Example ids: training
``0..n-1``, held-out ``n..n+n_eval-1``, public from ``n+n_eval`` on.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from gradspec.tasks._base import DRAWN_IDS, Batch, Task, drawn_splits
from gradspec.tasks._registry import register_task

__all__ = ["KINDS", "lowrank_task", "row_space_basis"]

KINDS = ("linear", "logistic")


def _factors(*, d: int, r: int, seed: int) -> tuple[torch.Generator, Tensor]:
    """The seeded generator, after drawing ``W`` (r x d, float64) from it first."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(r, d, generator=generator, dtype=torch.float64) / d**0.5
    return generator, w


def row_space_basis(task_or_config: Task | dict) -> Tensor:
    """An orthonormal basis (d x r, float64) of the row space of a ``lowrank`` task's data.

    Regenerated exactly from the task's ``d``, ``r`` and ``seed``, not estimated, so it
    is a reference for subspace tests: every per-example gradient ``g`` of the task
    satisfies ``g = B B^T g`` up to float32 rounding.

    Args:
        task_or_config: a task built by ``make_task("lowrank", ...)`` or its config.
    """
    config = task_or_config.config if isinstance(task_or_config, Task) else task_or_config
    if config.get("task") != "lowrank":
        raise ValueError("row_space_basis needs a task (or config) built by make_task('lowrank')")
    _, w = _factors(d=int(config["d"]), r=int(config["r"]), seed=int(config["seed"]))
    basis, _ = torch.linalg.qr(w.T)
    return basis


def _linear_forward(call: Callable[..., Tensor], batch: Batch) -> Tensor:
    return call(batch["inputs"]).squeeze(-1)


def _squared_loss(outputs: Tensor, batch: Batch) -> Tensor:
    return 0.5 * (outputs - batch["targets"]).square()


def _mse(outputs: Tensor, batch: Batch) -> dict[str, float]:
    return {"mse": (outputs - batch["targets"]).square().mean().item()}


def _logistic_loss(outputs: Tensor, batch: Batch) -> Tensor:
    return nn.functional.binary_cross_entropy_with_logits(
        outputs, batch["labels"].to(outputs.dtype), reduction="none"
    )


def _binary_accuracy(outputs: Tensor, batch: Batch) -> dict[str, float]:
    return {"accuracy": ((outputs > 0).long() == batch["labels"]).float().mean().item()}


@register_task("lowrank")
def lowrank_task(
    *,
    seed: int = 0,
    kind: str = "linear",
    n: int = 1000,
    n_eval: int = 1000,
    n_public: int = 100,
    d: int = 100,
    r: int = 5,
    noise: float = 0.1,
    margin: float = 3.0,
) -> Task:
    """Linear or logistic regression without bias on rank-r data in dimension d.

    Args:
        seed: draws ``W``, ``Z``, ``w*`` and the label noise.
        kind: ``"linear"`` (squared loss) or ``"logistic"``.
        n: training examples.
        n_eval: held-out examples (same ``W`` and ``w*``).
        n_public: public examples (same distribution, disjoint from both), for PDP-SGD,
            noisy AdaGrad and AdaDPS; 0 for none.
        d: the input dimension, which is also the number of parameters ``p``.
        r: the rank of the data, ``1 <= r <= d``.
        noise: standard deviation of the label noise (``kind="linear"``).
        margin: scale of the planted logits (``kind="logistic"``).

    Returns:
        A task whose model is ``nn.Linear(d, 1, bias=False)`` initialised to zero, with
        data ``{"inputs": (n, d), "targets": (n,)}`` or ``{"inputs", "labels"}``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose one of {list(KINDS)}")
    if not 1 <= r <= d:
        raise ValueError(f"need 1 <= r <= d, got r={r}, d={d}")
    if n < 1 or n_eval < 1 or n_public < 0:
        raise ValueError(f"n and n_eval must be positive and n_public >= 0, got {n}, {n_eval}, {n_public}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    generator, w = _factors(d=d, r=r, seed=seed)
    x = torch.randn(n + n_eval, r, generator=generator, dtype=torch.float64) @ w
    w_star = torch.randn(d, generator=generator, dtype=torch.float64)
    scale = (x[:n] @ w_star).std()

    def labelled(x: Tensor) -> tuple[str, Tensor]:
        signal = x @ w_star / scale
        if kind == "linear":
            y = signal + noise * torch.randn(len(x), generator=generator, dtype=torch.float64)
            return "targets", y.float()
        u = torch.rand(len(x), generator=generator, dtype=torch.float64)
        return "labels", (u < torch.sigmoid(margin * signal)).long()

    key, y = labelled(x)
    x_pub = torch.randn(n_public, r, generator=generator, dtype=torch.float64) @ w
    _, y_pub = labelled(x_pub)  # drawn last: train and eval do not depend on n_public
    loss, metrics = (_squared_loss, _mse) if kind == "linear" else (_logistic_loss, _binary_accuracy)
    model = nn.Linear(d, 1, bias=False)
    nn.init.zeros_(model.weight)
    x, x_pub = x.float(), x_pub.float()
    train, held_out, public = drawn_splits({"inputs": x, key: y}, {"inputs": x_pub, key: y_pub},
                                           n=n, n_eval=n_eval)
    return Task(
        name="lowrank",
        model=model,
        train=train,
        eval=held_out,
        public=public,
        forward=_linear_forward,
        loss=loss,
        metrics=metrics,
        params=("weight",),
        config={"ids": DRAWN_IDS},
    )
