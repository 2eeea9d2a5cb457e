"""Li et al. 2022 (restricted Lipschitz continuity), the text experiment: §4.2 Fig. 2a/2b, App. B.

Run: ``python -m analyses.li2022_restricted_lipschitz.text [--quick] [--out DIR] [--seeds 0,1,2]``.

Stages (each reuses its output when it is already there, so a killed run continues):

1. ``collect``: DP-SGD fine-tuning (ε = 8) of MiniLM's attention query/value weights
   (p = 1,769,472) on the offline sentiment task, storing every step's average clipped
   gradient (before noise): the gradient matrix H (r × p), as §4.2.
2. ``pca``: exact top-k SVD of H (``gradspec.linalg.pca``, method ``gram``) into a spectrum
   store, the basis of the retraining.
3. ``gram``: H·Hᵀ (r × r, float64, one pass). Every App. B comparison is computed from it:
   the spectrum of any row subset is the spectrum of a principal sub-block, the
   orthogonal iteration of the paper (``gradspec.linalg.orthogonal_iteration``, which
   iterates on H·Hᵀ in row space) runs on a factor A with A·Aᵀ = H·Hᵀ — the same
   iterates as on the store, without reading 9 GB per iteration — and the principal
   angles between right-singular subspaces of two row subsets need only H_a·H_bᵀ
   (``gradspec.spectrum.gram_subspace_cosines``).
4. ``decay``: power-law fit of σ_k, G_k and the bounds of Theorems 3.3/3.5
   (``gradspec.spectrum.decay_analysis``).
5. ``retrain``: Fig. 2b — DP-SGD (ε = 8) with the clipped gradient projected onto the top-k
   subspace (isotropic noise in all p dimensions, as the paper), a random subspace of the
   same rank, full DP-SGD, the non-private run and the untrained model, over seeds.

The top-k subspace comes from the noise-free gradients of the same private data, so its
retraining is a diagnostic, not a DP guarantee (gradspec records ``dp_guarantee: false``);
the paper's Fig. 2b is the same experiment.
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
from analyses.li2022_restricted_lipschitz.text_appendix import run_appendix, run_bounds
from analyses.li2022_restricted_lipschitz.text_report import report
from analyses.li2022_restricted_lipschitz.text_scale import FULL, QUICK, Scale

logger = logging.getLogger("analyses.li2022_restricted_lipschitz.text")


# --------------------------------------------------------------------------- retraining
def retrain_config(scale: Scale, **changes: Any):
    """A retraining run on the collection's task (``task_seed`` 0: its data and its head).

    ``seed`` then changes only the Poisson batches and the noise, as the paper's seeds.
    """
    from gradspec.train import TrainConfig

    base = dict(task="text", task_options=dict(scale.task_options), steps=scale.retrain_steps,
                batch_size=scale.retrain_batch, target_epsilon=scale.epsilon, noise_multiplier=None,
                optimizer="adam", lr=scale.retrain_lr, eval_every=0, log_every=10,
                checkpoint_every=100, seed=0, task_seed=0, backend="ghost")  # a killed sweep loses <= 100 steps
    base.update(changes)
    return TrainConfig(**base)


def run_untrained(scale: Scale, out: Path, name: str, task_options: dict[str, Any]) -> dict[str, Any]:
    """Held-out accuracy of the model as initialised (pretrained body, its head), task seed 0."""
    import torch

    from gradspec.tasks import make_task
    from gradspec.train import evaluate

    path = out / "untrained" / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    task = make_task("text", seed=0, **task_options)
    metrics = evaluate(task, task.model, torch.device("cpu"))
    n = len(task.eval)
    acc = metrics["eval_accuracy"]
    row = {"arm": name, "task_seed": 0, "task_options": task_options, "head": task.config.get("head"),
           "eval_examples": n, **metrics, "eval_accuracy_se": math.sqrt(acc * (1 - acc) / n)}
    logger.info("untrained %s: %s", name, metrics)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(row), indent=2))
    return row


RETRAIN_GROUPS = ("untrained", "dpsgd", "random", "nonprivate", "topk", "b2", "long")


def run_retrain(scale: Scale, seeds: list[int], out: Path, groups: list[str], ranks: list[int],
                spectrum: Path | None) -> dict[str, Any]:
    """The Fig. 2b runs, one sweep directory per group (a finished run is reused)."""
    from gradspec.optim import sweep

    res: dict[str, Any] = {}
    for group in groups:
        if group == "untrained":
            res[group] = run_untrained(scale, out, "head0", scale.task_options)
        elif group == "dpsgd":
            res[group] = sweep(config=retrain_config(scale), out=out / group, algorithms=["dp-sgd"],
                               seeds=seeds, epsilons=[scale.epsilon], train_metrics=False)
        elif group == "random":
            res[group] = sweep(config=retrain_config(scale), out=out / group,
                               algorithms=[("subspace", {"projector": "random"})], ranks=ranks,
                               seeds=seeds, epsilons=[scale.epsilon], train_metrics=False)
        elif group == "nonprivate":
            cfg = retrain_config(scale, target_epsilon=None, noise_multiplier=0.0, clip=False)  # ghost: the plain sum
            res[group] = sweep(config=cfg, out=out / group, algorithms=["dp-sgd"], seeds=seeds,
                               train_metrics=False)
        elif group == "topk":
            if spectrum is None:
                raise ValueError("the top-k retraining needs the spectrum store: run stage pca first")
            res[group] = sweep(config=retrain_config(scale), out=out / group,
                               algorithms=[("subspace", {"spectrum": str(spectrum)})], ranks=ranks,
                               seeds=seeds, epsilons=[scale.epsilon], train_metrics=False)
    return res


def run_b2(scale: Scale, seeds: list[int], out: Path, spectrum: Path) -> None:
    """App. B.2: retraining in the top-k subspace with other random heads, and with a trained head.

    * Random heads: for each ``head_seed`` h, the collection's data with head h (frozen),
      full DP-SGD and top-k retraining in the collection's subspace (computed with head 0),
      training seed h — a fresh random head per seed, as the paper's CLS-head runs.
    * Trained head: the head fitted to the public split (``head="public"``, no private
      example), its own collection (the main collection's settings) and PCA, then full
      DP-SGD, top-k and random-k retraining over ``seeds``.
    """
    from gradspec.optim import sweep

    k = min(scale.b2_k, max(scale.ranks))
    for h in scale.head_seeds:
        opts = {**scale.task_options, "head_seed": h}
        run_untrained(scale, out / "retrain", f"head{h}", opts)
        sweep(config=retrain_config(scale, task_options=opts), out=out / "retrain" / f"b2-head{h}",
              algorithms=["dp-sgd", ("subspace", {"spectrum": str(spectrum)})], ranks=[k], seeds=[h],
              epsilons=[scale.epsilon], train_metrics=False)
    public = dataclasses.replace(scale, task_options={**scale.task_options, "head": "public"})
    sub = out / "b2_public_head"
    store = run_collect(public, sub)
    run_pca(store, sub, k)
    run_untrained(public, out / "retrain", "public-head", public.task_options)
    sweep(config=retrain_config(public), out=out / "retrain" / "b2-public-head",
          algorithms=["dp-sgd", ("subspace", {"spectrum": str(sub / "spectrum.zarr")}),
                      ("subspace", {"projector": "random"})],
          ranks=[k], seeds=seeds, epsilons=[scale.epsilon], train_metrics=False)


# --------------------------------------------------------------------------- collect and pca
def run_collect(scale: Scale, out: Path) -> Path:
    """The gradient store: reused when ``out/collect`` already holds rows (even a stopped run)."""
    from gradspec.collect import collect
    from gradspec.store import GradientStore
    from gradspec.train import TrainConfig

    run = out / "collect"
    store = run / "gradients.zarr"
    if store.exists():
        n = GradientStore.open(store).n_rows
        if n > 0:
            logger.info("collect: reusing %s (%d committed rows)", store, n)
            return store
    cfg = TrainConfig(task="text", task_options=dict(scale.task_options), steps=scale.collect_steps,
                      batch_size=scale.collect_batch, target_epsilon=scale.epsilon,
                      noise_multiplier=None, optimizer="adam", lr=scale.collect_lr, eval_every=0,
                      checkpoint_every=100, seed=0, backend="ghost")
    collect(cfg, out=run, overwrite=True)
    return store


def run_pca(store: Path, out: Path, k: int) -> dict[str, Any]:
    """Exact top-k SVD of H (all committed rows) into ``out/spectrum.zarr``; H·Hᵀ into ``gram.npy``."""
    from gradspec.linalg import pca
    from gradspec.store import GradientStore, SpectrumStore

    spectrum, gram_path, info_path = out / "spectrum.zarr", out / "gram.npy", out / "pca.json"
    r = GradientStore.open(store).n_rows
    if gram_path.is_file() and info_path.is_file() and spectrum.exists():
        info = json.loads(info_path.read_text())
        if info["rows"] == r and SpectrumStore.open(spectrum).status == "complete":
            logger.info("pca: reusing %s and %s (%d rows)", spectrum, gram_path, r)
            return info
    res = pca(source=store, k=min(k, r), method="gram", rows=slice(0, r), out=spectrum,
              overwrite=True, progress=True)  # precision auto: float32 products, float64 sums, refined σ
    np.save(gram_path, res.gram)
    info = {"rows": r, "p": int(res.source.get("shape", [r, 0])[1]) if res.source.get("shape") else None,
            "k": res.k, "accuracy": res.accuracy(), "timings": res.timings,
            "precision": res.params.get("precision", "auto"), "method": res.method,
            "command": f"gradspec pca {store} --k {min(k, r)} --method gram --out {spectrum}"}
    info_path.write_text(json.dumps(json_safe(info), indent=2))
    return info


# --------------------------------------------------------------------------- entry point
STAGES = ("collect", "pca", "appendix", *RETRAIN_GROUPS, "report")
#: The full mode's stages: about 60 minutes on 2 CPU cores; ``long`` only when asked for.
DEFAULT_STAGES = tuple(s for s in STAGES if s != "long")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m analyses.li2022_restricted_lipschitz.text",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test (tiny BERT, ~2 minutes)")
    ap.add_argument("--out", type=Path, default=None,
                    help="run directory (default runs/analyses/li2022_text[_quick])")
    ap.add_argument("--seeds", default="0,1,2", help="retraining seeds (comma-separated)")
    ap.add_argument("--ranks", default=None, help="retraining ranks (default: the scale's)")
    ap.add_argument("--retrain-steps", type=int, default=None, help="retraining steps (default: the scale's)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's own choice, all cores)")
    ap.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                    help=f"comma-separated subset of {','.join(STAGES)} (default: all but 'long', which "
                         "adds Fig. 2b at 3 epochs: about 60 more minutes on 2 cores)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_stderr(fmt="%(asctime)s %(levelname)s %(name)s: %(message)s",
                  quiet=("gradspec.linalg.orthogonal",))  # it logs one line per iteration
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    scale = QUICK if args.quick else FULL
    out = args.out or Path("runs/analyses") / ("li2022_text_quick" if args.quick else "li2022_text")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise SystemExit(f"unknown stage(s) {bad}; choose from {', '.join(STAGES)}")
    if args.retrain_steps:
        scale = dataclasses.replace(scale, retrain_steps=args.retrain_steps)
    ranks = [int(k) for k in args.ranks.split(",")] if args.ranks else list(scale.ranks)
    spectrum = out / "spectrum.zarr"
    figures = out / "figures"
    t0 = time.perf_counter()
    store = out / "collect" / "gradients.zarr"
    if "collect" in stages:
        store = run_collect(scale, out)
    if "pca" in stages:
        run_pca(store, out, max(ranks))
    info = json.loads((out / "pca.json").read_text()) if (out / "pca.json").is_file() else {}
    if "appendix" in stages:
        from gradspec.store import GradientStore

        cfg = GradientStore.open(store).config  # the collected run's n and δ
        app = run_appendix(scale, out, figures)
        bounds = run_bounds(scale, out, figures, p=int(cfg["p"]), n=int(cfg["n_train"]),
                            delta=float(cfg["delta"]))
        (out / "appendix.json").write_text(json.dumps(json_safe({"appendix": app, "bounds": bounds}), indent=2))
    groups = [s for s in stages if s in RETRAIN_GROUPS and s not in ("b2", "long")]
    if groups:
        run_retrain(scale, seeds, out / "retrain", groups, ranks, spectrum if spectrum.exists() else None)
    if "long" in stages:  # Fig. 2b again at the paper's schedule (3 epochs)
        long = dataclasses.replace(scale, retrain_steps=scale.long_retrain_steps)
        available = spectrum if spectrum.exists() else None
        run_retrain(long, seeds, out / "retrain-long", ["untrained", "dpsgd", "nonprivate", "topk"], ranks,
                    available)
        run_retrain(long, seeds, out / "retrain-long", ["random"],
                    [k for k in ranks if k in scale.long_random_ranks], available)
    if "b2" in stages:
        run_b2(scale, seeds, out, spectrum)
    if "report" in stages:
        report(scale, out, seeds, ranks, info, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
