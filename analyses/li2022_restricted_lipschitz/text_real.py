"""Li et al. 2022, Fig. 2a/2b on real text (issue 23): movie reviews and tweets, 3 epochs.

Run: ``python -m analyses.li2022_restricted_lipschitz.text_real --dataset movie-reviews
[--seeds 0,1,2] [--out DIR] [--stages collect,pca,fig2a,retrain,report]``.

The synthetic-text reproduction (``text.py``) had 2,000 private examples; here the private
data are real: the Rotten Tomatoes snippets (``movie-reviews``, 9,466 training examples) or
22k tweets (``tweets``). Stages (each reuses what is already there, so a killed run
continues; a retraining run is the unit of resumption):

1. ``collect``: DP-SGD (ε = 8, δ = n^-1.1) fine-tuning of MiniLM's query/value weights
   (p = 1,769,472), r = 2,000 per-step average clipped gradients (the paper's r).
2. ``pca``: exact top-1000 SVD of H and H·Hᵀ.
3. ``fig2a``: the power-law fit of σ_k (ranks 1..r/2 and all), the share of ‖H‖_F² in the
   top k, the spectrum figure.
4. ``retrain``: Fig. 2b at the paper's 3 epochs (batch 32): top-k, random-k and the
   complement of the top-k subspace (Song, Ahn & Yun 2025's control) for k ∈ {10, 100,
   1000}, full DP-SGD, non-private, untrained. Runs go seed by seed, the most informative
   arms first, so a run stopped part-way has whole seeds.
5. ``report``: the table with the paper's numbers beside ours, per-seed accuracies, figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from analyses._common import json_safe, log_to_stderr
from analyses.li2022_restricted_lipschitz.text import (
    retrain_config,
    run_collect,
    run_pca,
    run_untrained,
)
from analyses.li2022_restricted_lipschitz.text_appendix import _fit
from analyses.li2022_restricted_lipschitz.text_scale import FULL, QUICK, Scale

logger = logging.getLogger("analyses.li2022_restricted_lipschitz.text_real")

#: Training examples of each real task at its default split (``gradspec.tasks.text``).
N_TRAIN = {"movie-reviews": 9466, "tweets": 21705}
RANKS = (10, 100, 1000)
BATCH = 32
EPOCHS = 3


def real_scale(dataset: str, quick: bool = False) -> Scale:
    """FULL's settings on real text: r = 2,000 collected steps; 3 epochs of batch 32 retraining.

    ``quick``: a smoke test of every stage (tiny BERT, 200 examples, a few steps).
    """
    if quick:
        return dataclasses.replace(QUICK, name=f"{dataset}-quick", collect_steps=30, retrain_steps=6,
                                   task_options={**QUICK.task_options, "dataset": dataset}, ranks=(2, 5, 10))
    steps = math.ceil(EPOCHS * N_TRAIN[dataset] / BATCH)
    return dataclasses.replace(FULL, name=dataset, task_options={"dataset": dataset, "n_eval": 1000},
                               collect_steps=2000, retrain_steps=steps, retrain_batch=BATCH,
                               long_retrain_steps=steps, ranks=RANKS)


# --------------------------------------------------------------------------- collect
def run_collect_to_end(scale: Scale, out: Path) -> Path:
    """``text.run_collect``, but a run stopped part-way (a killed session) is resumed to its
    ``collect_steps`` instead of being taken as it is."""
    from gradspec.collect import collect, read_run_config
    from gradspec.store import GradientStore

    store = out / "collect" / "gradients.zarr"
    if store.exists() and (out / "collect" / "checkpoint.pt").is_file():
        s = GradientStore.open(store)
        if s.status != "complete":
            logger.info("collect: resuming %s at %d of %d rows", store, s.n_rows, scale.collect_steps)
            collect(read_run_config(out / "collect"), out=out / "collect", resume=True)
    return run_collect(scale, out)


# --------------------------------------------------------------------------- Fig. 2a
def run_fig2a(out: Path) -> dict[str, Any]:
    """Power-law fits of σ_k from H·Hᵀ and the spectrum figure (``fig2a.json``)."""
    from gradspec.plot import plot_spectrum, save_figure
    from gradspec.spectrum import gram_eigh

    g = np.load(out / "gram.npy")
    r = g.shape[0]
    sigma, _ = gram_eigh(g)
    frob2 = float(np.trace(g))
    half = _fit(sigma, max(2, r // 2))
    res = {"r": r, "sigma_top20": sigma[:20],
           "fit_top_half": {k: v for k, v in half.items() if k != "object"},
           "fit_all": {k: v for k, v in _fit(sigma, r).items() if k != "object"},
           "energy_top_k": {str(k): float((sigma[:k] ** 2).sum() / frob2) for k in (1, 10, 100, 1000) if k <= r}}
    fig = plot_spectrum({f"H ({r} steps)": sigma}, fits={f"H ({r} steps)": half["object"]},
                        title=f"Fig. 2a on {out.name}:\nsingular values of the average clipped gradients")
    save_figure(fig, out / "figures", "fig2a_spectrum", formats=("png",))
    (out / "fig2a.json").write_text(json.dumps(json_safe(res), indent=2))
    logger.info("fig2a: sigma_k ~ k^-%.3f (ranks 1..%d), R2 %.3f", half["c"], r // 2, half["r2"])
    return res


# --------------------------------------------------------------------------- Fig. 2b
def _arms(spectrum: Path, ranks: tuple[int, int, int]) -> list[tuple[str, list[Any], int | None]]:
    """(group, algorithms, rank) in the order they run within a seed: the middle rank first."""
    top = ("subspace", {"spectrum": str(spectrum)})
    rnd = ("subspace", {"projector": "random"})
    comp = ("complement", {"spectrum": str(spectrum)})
    lo, mid, hi = ranks
    return [("dpsgd", ["dp-sgd"], None), ("topk", [top], mid), ("complement", [comp], mid),
            ("random", [rnd], mid), ("topk", [top], lo), ("topk", [top], hi), ("random", [rnd], lo),
            ("random", [rnd], hi), ("complement", [comp], lo), ("complement", [comp], hi),
            ("nonprivate", ["dp-sgd"], None)]


def arm_name(group: str, rank: int | None) -> str:
    """``dpsgd``, ``nonprivate``, ``topk-100``, ``complement-10``, ...: what ``--arms`` selects."""
    return group if rank is None else f"{group}-{rank}"


def select_arms(names: str | None, ranks: tuple[int, int, int]) -> set[str] | None:
    """The ``--arms`` names as a set (None: every arm); an unknown name is refused in one line."""
    if not names:
        return None
    known = [arm_name(g, k) for g, _, k in _arms(Path("."), ranks)]
    chosen = {n.strip() for n in names.split(",") if n.strip()}
    if bad := sorted(chosen - set(known)):
        raise SystemExit(f"unknown arm(s) {bad}; choose from {', '.join(known)}")
    return chosen


def run_fig2b(scale: Scale, seeds: list[int], out: Path, arms: set[str] | None = None) -> None:
    """Every Fig. 2b run under ``out/retrain/<group>/``, seed by seed (finished runs are reused);
    ``arms`` (names from :func:`arm_name`) restricts the runs, e.g. to the k = 100 arms on a
    larger task."""
    from gradspec.optim import sweep

    root = out / "retrain"
    run_untrained(scale, root, "head0", scale.task_options)
    spectrum = out / "spectrum.zarr"
    for seed in seeds:
        for group, algorithms, rank in _arms(spectrum, scale.ranks):
            if arms is not None and arm_name(group, rank) not in arms:
                continue
            # a run is ~10-40 min on CPU: say which, and show its steps (a bar on stderr)
            logger.info("fig2b: seed %d %s k=%s: %d steps into %s", seed, group, rank, scale.retrain_steps,
                        root / group)
            if group == "nonprivate":
                cfg = retrain_config(scale, target_epsilon=None, noise_multiplier=0.0, clip=False)  # ghost: the plain sum
                sweep(config=cfg, out=root / group, algorithms=algorithms, seeds=[seed], train_metrics=False,
                      progress=True)
            else:
                sweep(config=retrain_config(scale), out=root / group, algorithms=algorithms,
                      ranks=[rank] if rank else [], seeds=[seed], epsilons=[scale.epsilon], train_metrics=False,
                      progress=True)
            logger.info("fig2b: seed %d %s k=%s done", seed, group, rank)


# --------------------------------------------------------------------------- report
def report(scale: Scale, out: Path, seeds: list[int]) -> dict[str, Any]:
    """``results.json``, ``table.md``, ``per_seed.md`` and the Fig. 2b figure from what the stages left."""
    from analyses.li2022_restricted_lipschitz.text_real_report import build_report

    return build_report(scale, out, seeds)


STAGES = ("collect", "pca", "fig2a", "retrain", "report")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analyses.li2022_restricted_lipschitz.text_real",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=sorted(N_TRAIN), default="movie-reviews")
    ap.add_argument("--quick", action="store_true", help="smoke test of every stage (tiny BERT, ~2 minutes)")
    ap.add_argument("--out", type=Path, default=None, help="run directory (default runs/analyses/li2022_<dataset>)")
    ap.add_argument("--seeds", default="0,1,2", help="retraining seeds (comma-separated)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--arms", default=None,
                    help="retraining arms to run (comma-separated, e.g. dpsgd,topk-100,complement-100,"
                         "random-100; default: all 11)")
    args = ap.parse_args(argv)
    log_to_stderr(fmt="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scale = real_scale(args.dataset, args.quick)
    out = args.out or Path("runs/analyses") / f"li2022_{scale.name}"
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    arms = select_arms(args.arms, scale.ranks)
    if bad := [s for s in stages if s not in STAGES]:
        raise SystemExit(f"unknown stage(s) {bad}; choose from {', '.join(STAGES)}")
    t0 = time.perf_counter()
    store = out / "collect" / "gradients.zarr"
    if "collect" in stages:
        store = run_collect_to_end(scale, out)
    if "pca" in stages:
        run_pca(store, out, max(scale.ranks))
    if "fig2a" in stages:
        run_fig2a(out)
    if "retrain" in stages:
        run_fig2b(scale, seeds, out, arms)
    if "report" in stages:
        report(scale, out, seeds)
    logger.info("done in %.1f min", (time.perf_counter() - t0) / 60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
