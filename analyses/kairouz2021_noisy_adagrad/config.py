"""The Kairouz et al. 2021 experiment's settings: the scales we run at and the methods compared."""

from __future__ import annotations

import dataclasses

PAPER = "Kairouz, Ribero, Rush, Thakurta 2021 (arXiv:2008.06570)"
TUNE_SEED = 1000


@dataclasses.dataclass(frozen=True)
class Scale:
    """The size of a run (the README states which one produced the committed numbers)."""

    dims: tuple[int, ...]
    n: int
    n_eval: int
    n_public: int
    public_size: int
    rank: int
    margin: float
    radius: float
    steps: int
    epsilon: float
    lrs: tuple[float, ...]
    ambient_max_d: int


FULL = Scale(dims=(10, 100, 1000, 10000), n=500, n_eval=2000, n_public=100, public_size=100, rank=5,
             margin=4.0, radius=2.0, steps=100, epsilon=1.0, lrs=(0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
             ambient_max_d=100)
QUICK = dataclasses.replace(FULL, dims=(10, 1000), steps=30, n_eval=500, lrs=(0.3, 1.0), ambient_max_d=10)

#: name -> (private, accounting kind, description)
METHODS: dict[str, tuple[bool, str, str]] = {
    "gd": (False, "none", "non-private projected GD (control)"),
    "dp-gd": (True, "gradient", "DP-GD, ambient (projected onto the ball)"),
    "pdp-gd": (True, "gradient", "PDP-SGD full batch: noisy gradient projected on the public top-k subspace"),
    "rpdp-gd": (True, "gradient", "PDP with a random rank-k subspace (control)"),
    "noisy-adagrad": (True, "gradient+preconditioner", "noisy full-matrix AdaGrad in the public top-k subspace"),
    "noisy-adagrad-diag": (True, "gradient+preconditioner", "noisy diagonal AdaGrad in the public top-k subspace"),
    "noisy-adagrad-ambient": (True, "gradient+preconditioner",
                              "noisy full-matrix AdaGrad in all of R^d (no subspace; d <= ambient_max_d)"),
}
