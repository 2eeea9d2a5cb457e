"""The PDP-SGD reproduction's settings: the paper's noise levels, learning rates, start
epochs and epsilons, and the scales we run at."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

PAPER = "Zhou, Wu & Banerjee (2021), Bypassing the Ambient Dimension: Private SGD with Gradient Subspace Identification, ICLR"
SIGMAS = (18.0, 14.0, 10.0, 8.0, 6.0, 4.0)
#: the paper's epsilon (moments accountant, 30 epochs, B = 250, n = 10,000, delta = 1e-5), MNIST.
PAPER_EPS = {18.0: 0.23, 14.0: 0.30, 10.0: 0.42, 8.0: 0.53, 6.0: 0.72, 4.0: 1.09}
#: Appendix D, Table 3 (MNIST): step sizes chosen by the paper's grid search on final train accuracy.
LR_DP = {18.0: 0.05, 14.0: 0.05, 10.0: 0.05, 8.0: 0.05, 6.0: 0.1, 4.0: 0.1}
LR_PDP = {18.0: 0.1, 14.0: 0.2, 10.0: 0.2, 8.0: 0.1, 6.0: 0.1, 4.0: 0.2}
#: Table 3: the (1-based) epoch of 30 at which projection starts.
START_EPOCH = {18.0: 1, 14.0: 1, 10.0: 1, 8.0: 15, 6.0: 15, 4.0: 15}
PAPER_EPOCHS = 30
SWEEP_SIGMA = 18.0
#: the lr check: DP-SGD and PDP-SGD also at these step sizes (the paper's grid {0.01, 0.05, 0.1, 0.2}
#: less 0.01, too small for our 50 steps), the lr of each then picked by final *train* accuracy
#: (the paper's criterion, Appendix D), never by the test accuracy reported.
LR_GRID = (0.05, 0.1, 0.2)
#: PDP-SGD's rank k and public sample m (Table 3 settings), RPDP-SGD's rank
K_PDP, K_RPDP, M_PUBLIC = 50, 800, 100
#: examples in scikit-learn's digits: eval, public pool and private training split share them
DIGITS_EXAMPLES = 1797


@dataclasses.dataclass(frozen=True)
class Scale:
    """The size of a run (the README states which one produced the committed numbers)."""

    name: str
    epochs: float
    sigmas: tuple[float, ...]
    ks: tuple[int, ...]
    ms: tuple[int, ...]
    ss: tuple[int, ...]
    diag_every: int
    lr_grid: tuple[float, ...] = ()  # step sizes every method is also run at (the lr check)
    diag_seeds: int = 3  # diagnose the PDP-SGD runs at sigma = 18 of the first this many seeds
    n_eval: int = 400
    n_public: int = 150  # the public pool; each PDP run draws m of it (m = 150 takes all)
    batch_size: int = 250
    clip: float = 1.0
    delta: float = 1e-5


SCALES = {
    "quick": Scale("quick", epochs=1, sigmas=(18.0, 4.0), ks=(10,), ms=(50,), ss=(5,), diag_every=100,
                   diag_seeds=1),
    # sized for a 2-core machine shared by 8 (load average ~15): about an hour
    "full": Scale("full", epochs=10, sigmas=(18.0, 10.0, 6.0, 4.0), ks=(10, 20, 30), ms=(50,), ss=(20,),
                  diag_every=25, lr_grid=LR_GRID),
    "paper": Scale("paper", epochs=30, sigmas=SIGMAS, ks=(10, 20, 30), ms=(50, 150), ss=(10, 20),
                   diag_every=50, lr_grid=LR_GRID),
}


def n_train(scale: Scale) -> int:
    return DIGITS_EXAMPLES - scale.n_eval - scale.n_public


def total_steps(scale: Scale) -> int:
    return math.ceil(scale.epochs * n_train(scale) / scale.batch_size - 1e-9)


def start_epoch(sigma: float, scale: Scale) -> float:
    """Table 3's start epoch (1-based, of 30) as a fraction of our run: epoch e -> (e-1)/30 * E."""
    return (START_EPOCH.get(sigma, 1) - 1) / PAPER_EPOCHS * scale.epochs


def n_train_from(spec: dict[str, Any]) -> int:
    """The private training examples of one run's spec (as :func:`n_train` of its scale)."""
    return DIGITS_EXAMPLES - spec["n_eval"] - spec["n_public_pool"]
