"""Sparse linear regression with frequent/uninformative and rare/informative features
(the toy problem of Li, Zaheer, Reddi, Smith 2022 "AdaDPS", §4.1 and Figure 3).

Every feature is binary, ``x_j ~ Bernoulli(p_j)``, and the planted model is::

    p_j = 0.9,  w*_j = 0.01   for the first 10% of the features (frequent, uninformative)
    p_j = 0.01, w*_j = 1.0    for the other 90% (rare, informative)
    y = <w*, x> + b,  b ~ N(0, noise^2)   (noise = 0.01, numpy's N(0, 0.01) in the authors' code)

with d = 500 and n = 1,000 training examples in the paper. The model is ``x -> w^T x``
without bias, loss ``(w^T x - y)^2 / 2`` (the paper's ``1/(2n) sum (w^T x_i - y_i)^2``),
initialised ``w ~ N(0, init_std^2)`` (init_std = 0.1 in the authors' code).

The side information of the paper's Figure 3 — "model engineers know which words are
more frequent": ``A_j = 1`` for the frequent features, ``0.01`` for the rare ones — is
:func:`sparse_side_information`. Held-out and public examples come from the same
distribution, drawn after the training set (so it does not depend on their number).
Example ids: training ``0..n-1``, held-out ``n..n+n_eval-1``, public from ``n+n_eval`` on.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gradspec.tasks._base import DRAWN_IDS, Task, drawn_splits
from gradspec.tasks._registry import register_task
from gradspec.tasks.lowrank import _linear_forward, _mse, _squared_loss

__all__ = ["sparse_linear_task", "sparse_side_information"]


def sparse_side_information(task_or_config: Task | dict, *, frequent: float = 1.0,
                            rare: float = 0.01) -> Tensor:
    """The paper's side information for a ``sparselinear`` task: ``frequent`` (1) on the
    frequent features, ``rare`` (0.01) on the rare ones (Li et al. 2022, §4.1), float32 (d,).

    It is public knowledge of the feature frequencies, not computed from any data.
    """
    config = task_or_config.config if isinstance(task_or_config, Task) else task_or_config
    if config.get("task") != "sparselinear":
        raise ValueError("sparse_side_information needs a task (or config) built by make_task('sparselinear')")
    d, n_freq = int(config["d"]), _n_frequent(int(config["d"]), float(config["frac_frequent"]))
    a = torch.full((d,), float(rare))
    a[:n_freq] = float(frequent)
    return a


def _n_frequent(d: int, frac: float) -> int:
    return int(round(d * frac))


@register_task("sparselinear")
def sparse_linear_task(
    *,
    seed: int = 0,
    n: int = 1000,
    n_eval: int = 1000,
    n_public: int = 10,
    d: int = 500,
    frac_frequent: float = 0.1,
    p_frequent: float = 0.9,
    p_rare: float = 0.01,
    w_frequent: float = 0.01,
    w_rare: float = 1.0,
    noise: float = 0.01,
    init_std: float = 0.1,
) -> Task:
    """Linear regression on sparse binary features with heavy-tailed frequencies.

    Args:
        seed: draws the features, the label noise and the initial weights.
        n: training examples (1,000 in the paper).
        n_eval: held-out examples (the paper plots the training loss only).
        n_public: public examples (default 1% of n), for AdaDPS's frequency side
            information or public preconditioner; 0 for none.
        d: features = parameters (500 in the paper).
        frac_frequent: share of frequent features (the first ``round(d * frac)``).
        p_frequent, p_rare: P(x_j = 1) for frequent and rare features.
        w_frequent, w_rare: the planted weights.
        noise: standard deviation of the label noise.
        init_std: standard deviation of the initial weights.

    Returns:
        A task with model ``nn.Linear(d, 1, bias=False)`` and data
        ``{"inputs": (n, d) float32 in {0, 1}, "targets": (n,)}``; metric ``mse``.
    """
    if d < 1 or not 0 <= frac_frequent <= 1:
        raise ValueError(f"need d >= 1 and 0 <= frac_frequent <= 1, got d={d}, frac_frequent={frac_frequent}")
    for name, p in (("p_frequent", p_frequent), ("p_rare", p_rare)):
        if not 0 <= p <= 1:
            raise ValueError(f"{name} is a probability, got {p}")
    if n < 1 or n_eval < 1 or n_public < 0:
        raise ValueError(f"n and n_eval must be positive and n_public >= 0, got {n}, {n_eval}, {n_public}")
    if noise < 0 or init_std < 0:
        raise ValueError(f"noise and init_std must be >= 0, got {noise}, {init_std}")
    gen = torch.Generator().manual_seed(seed)
    n_freq = _n_frequent(d, frac_frequent)
    prob = torch.full((d,), float(p_rare), dtype=torch.float64)
    prob[:n_freq] = p_frequent
    w_star = torch.full((d,), float(w_rare), dtype=torch.float64)
    w_star[:n_freq] = w_frequent

    def draw(m: int) -> tuple[Tensor, Tensor]:
        x = (torch.rand(m, d, generator=gen, dtype=torch.float64) < prob).double()
        y = x @ w_star + noise * torch.randn(m, generator=gen, dtype=torch.float64)
        return x.float(), y.float()

    x, y = draw(n + n_eval)
    model = nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(init_std * torch.randn(1, d, generator=gen, dtype=torch.float64))
    x_pub, y_pub = draw(n_public)  # drawn last: train and eval do not depend on n_public
    train, held_out, public = drawn_splits({"inputs": x, "targets": y}, {"inputs": x_pub, "targets": y_pub},
                                           n=n, n_eval=n_eval)
    return Task(
        name="sparselinear",
        model=model,
        train=train,
        eval=held_out,
        public=public,
        forward=_linear_forward,
        loss=_squared_loss,
        metrics=_mse,
        params=("weight",),
        config={"n_frequent": n_freq, "ids": DRAWN_IDS},
    )
