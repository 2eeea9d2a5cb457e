"""The AdaDPS reproduction's three experiments (``sparse``, ``digits``, ``bow``): each one's task,
budget, methods, grids and the paper's numbers (`run.py` tunes and runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the learning-rate grid of the paper's Appendix B (non-private runs; private runs tune C jointly)
PAPER_LR_GRID = [0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]


@dataclass(frozen=True)
class Method:
    """One optimizer of a comparison."""

    label: str
    algorithm: str  # gradspec.optim algorithm name
    optimizer: str = "sgd"  # outer optimizer
    private: bool = True
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Experiment:
    """One comparison: its task and budget, the methods, their grids, how a setting is chosen,
    the claim and the paper's numbers."""

    name: str
    task: str
    task_options: dict[str, Any]
    steps: int
    batch_size: int
    delta: float
    metric: str  # what selects and what is reported
    maximize: bool
    methods: list[Method]
    lr_grid: dict[str, list[float]]  # by outer optimizer kind: "sgd", "adam", "adadps"
    clip_grid: list[float]
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    select_on_validation: bool = True
    eval_every: int = 0
    claim: str = ""
    paper: dict[str, Any] = field(default_factory=dict)


def experiments(quick: bool) -> list[Experiment]:
    """The experiments in run order (``quick``: the smoke test's smaller grids and budgets)."""
    from gradspec.tasks import make_task, sparse_side_information

    sparse_opts = {"n": 1000, "d": 500, "n_public": 10, "n_eval": 1000}
    side = sparse_side_information(make_task("sparselinear", seed=0, **sparse_opts))
    lr_sgd = [0.01, 0.05, 0.2, 1.0] if not quick else [0.05, 0.2]
    lr_adam = [0.0005, 0.002, 0.01, 0.05] if not quick else [0.002, 0.01]
    sparse = Experiment(
        name="sparse", task="sparselinear", task_options=sparse_opts,
        steps=2250 if not quick else 300, batch_size=8, delta=1e-3, noise_multiplier=0.7,
        metric="train_loss", maximize=False, select_on_validation=False, eval_every=75 if not quick else 50,
        methods=[
            Method("SGD", "dp-sgd", private=False),
            Method("Adam", "dp-sgd", "adam", private=False),
            Method("AdaS (side info A=1/0.01)", "adadps", private=False,
                   options={"rule": "fixed", "side_information": side}),
            Method("DP-SGD", "dp-sgd"),
            Method("DP-Adam", "dp-adam"),
            Method("AdaDPS (side info A=1/0.01)", "adadps", options={"rule": "fixed", "side_information": side}),
            Method("AdaDPS (public feature freq.)", "adadps",
                   options={"rule": "fixed", "side_information": "frequency", "public_size": 10}),
        ],
        lr_grid={k: PAPER_LR_GRID if not quick else [0.005, 0.05] for k in ("sgd", "adam", "adadps")},
        clip_grid=[0.5, 2.0] if not quick else [0.5],
        claim="Fig. 3: with side information, AdaDPS (and AdaS) reach a much lower training loss than DP-SGD/DP-Adam (SGD/Adam)",
        paper={"epsilon": 4.13, "delta": 1e-3, "numbers": "figure only (no values given)"},
    )
    digits = Experiment(
        name="digits", task="cnn",
        task_options={"dataset": "digits", "n_public": 15},
        steps=240 if not quick else 20, batch_size=64, delta=0.0, target_epsilon=1.25,
        metric="eval_accuracy", maximize=True,
        methods=[
            Method("SGD", "dp-sgd", private=False),
            Method("Adam", "dp-sgd", "adam", private=False),
            Method("DP-SGD", "dp-sgd"),
            Method("DP-Adam", "dp-adam"),
            Method("AdaDPS (RMSProp, 1% public)", "adadps", options={"rule": "rmsprop", "public_size": 15}),
        ],
        lr_grid={"sgd": lr_sgd, "adam": lr_adam, "adadps": lr_sgd},
        clip_grid=[0.5, 2.0] if not quick else [1.0],
        claim="Table 6 (MNIST classification, eps=1.25): AdaDPS > DP-Adam > DP-SGD",
        paper={"epsilon": 1.25, "DP-SGD": 0.9273, "DP-Adam": 0.9333, "DP-RMSProp": 0.9314,
               "AdaDPS (RMSProp)": 0.9377, "AdaDPS (Adam)": 0.9541},
    )
    bow_opts = ({"n": 5000, "n_eval": 2000, "n_public": 50, "vocab": 2000} if not quick
                else {"n": 1000, "n_eval": 500, "n_public": 10, "vocab": 500})
    freq = {"rule": "fixed", "side_information": "frequency", "public_size": bow_opts["n_public"]}
    bow = Experiment(
        name="bow", task="bow", task_options=bow_opts,
        steps=390 if not quick else 30, batch_size=64, delta=0.0, target_epsilon=1.5,
        metric="eval_accuracy", maximize=True,
        methods=[
            Method("SGD", "dp-sgd", private=False),
            Method("Adam", "dp-sgd", "adam", private=False),
            Method("AdaS (token freq.)", "adadps", private=False, options=freq),
            Method("DP-SGD", "dp-sgd"),
            Method("DP-Adam", "dp-adam"),
            Method("AdaDPS (token freq.)", "adadps", options=freq),
        ],
        lr_grid={"sgd": [0.1, 0.5, 2.0, 8.0] if not quick else [0.5],
                 "adam": [0.001, 0.005, 0.02, 0.1] if not quick else [0.01],
                 "adadps": [0.1, 0.5, 2.0, 8.0] if not quick else [0.5]},
        clip_grid=[0.1, 1.0] if not quick else [1.0],
        claim="§6.1.2 / Table 4 (IMDB BoW, logistic regression): AdaDPS with token-frequency A > DP-Adam > DP-SGD",
        paper={"epsilon": 1.5, "DP-SGD": 0.62, "DP-Adam": 0.68, "AdaDPS (w/o public)": 0.75,
               "non-private SGD": 0.66, "non-private Adam": 0.88, "AdaS (w/o public)": 0.88},
    )
    return [bow, sparse, digits]


def lr_kind(method: Method) -> str:
    """Which learning-rate grid of an experiment (``Experiment.lr_grid``) a method tunes over."""
    if method.algorithm == "adadps":
        return "adadps"
    if method.algorithm == "dp-adam" or method.optimizer == "adam":
        return "adam"
    return "sgd"
