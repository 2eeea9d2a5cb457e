"""Li, Zaheer, Reddi, Smith 2022, "Private Adaptive Optimization with Side Information" (AdaDPS).

Three experiments, each comparing AdaDPS (Algorithm 1) with DP-SGD and DP-Adam at the same
noise (hence the same epsilon), with non-private SGD and Adam as controls:

* ``sparse``: the sparse linear regression of §4.1 / Figure 3 as specified (d = 500,
  n = 1,000, the first 10% of features frequent (P = 0.9, w* = 0.01), the rest rare
  (P = 0.01, w* = 1), label noise N(0, 0.01^2)); batch 8, 2,250 steps, sigma = 0.7 (the
  authors' toy/run.sh), delta = 1e-3; AdaDPS Option 2 with the paper's side information
  A = 1 / 0.01 and with A = feature frequencies of the 1% public examples; plotted:
  training loss.
* ``digits``: the MNIST-classification row of Table 6 on scikit-learn digits with
  gradspec's CNN task (the paper does not describe its MNIST classifier); AdaDPS
  Option 1 (RMSProp preconditioner from a 1% public split drawn from the training pool,
  disjoint from train and eval); sigma calibrated to epsilon = 1.25 (Table 6), delta = 1/n.
* ``bow``: AdaDPS Option 2 with token-frequency side information (§6.1.2) on a synthetic
  bag-of-words logistic regression with Zipf word frequencies (no text corpus is available
  offline); sigma calibrated to epsilon = 1.5 (Table 6's IMDB convex), delta = 1/n.

Hyper-parameters, the same procedure for every method: a grid over the learning rate
(and for private methods the clipping norm C, which the paper tunes jointly) is run on one
tuning seed that is not a reported seed; the choice is made on a validation split carved
from that seed's training split (``digits``, ``bow``: held-out accuracy of the remaining
80%), or on the training loss the paper plots (``sparse``). The reported numbers come
from fresh runs on the reported seeds with the chosen values. Tuning runs are not
privacy-accounted (as in the paper).

Run ``python -m analyses.li2022_adadps.run [--quick] [--out DIR] [--seeds N] [--only sparse,bow,digits]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from analyses._common import log_to_stderr
from analyses.li2022_adadps.experiments import Experiment, Method, experiments, lr_kind
from analyses.li2022_adadps.report import (
    claims_table,
    figures,
    markdown_table,
    method_table,
    score_summary,
)

logger = logging.getLogger("li2022_adadps")

DEFAULT_OUT = Path("runs/analyses/li2022_adadps")
TUNE_SEED = 1000


def _config(exp: Experiment, method: Method, *, seed: int, lr: float, clip: float, n_train: int,
            sigma: float | None):
    from gradspec.train import TrainConfig

    private = method.private
    return TrainConfig(
        task=exp.task, task_options=exp.task_options, steps=exp.steps, batch_size=exp.batch_size,
        sampling="poisson", max_grad_norm=clip if private else 1.0, clip=private,
        noise_multiplier=sigma if private else 0.0,
        delta=None,  # gradspec's default n^-1.1: it refuses the paper's delta = 1/n
        optimizer="adam" if method.optimizer == "adam" else "sgd", lr=lr, momentum=0.0,
        eval_every=exp.eval_every, log_every=10**9, checkpoint_every=10**9, seed=seed, microbatch=64,
    )


def _validation_task(task, seed: int, frac: float = 0.2):
    """``task`` with its training split cut into train (80%) and validation (20%, as ``eval``)."""
    import torch

    from gradspec.tasks import Task

    n = len(task.train)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7))
    n_val = max(1, int(frac * n))
    if not isinstance(task, Task):
        raise TypeError(f"expected a Task, got {type(task).__name__}")
    return dataclasses.replace(task, train=task.train.subset(order[n_val:].sort().values),
                               eval=task.train.subset(order[:n_val].sort().values))


def _sigma(exp: Experiment, n_train: int) -> float:
    from gradspec.privacy import calibrate_noise_multiplier

    if exp.noise_multiplier is not None:
        return exp.noise_multiplier
    return calibrate_noise_multiplier(target_epsilon=exp.target_epsilon, sample_rate=exp.batch_size / n_train,
                                      steps=exp.steps, delta=n_train**-1.1)


def _finished(out: Path, config, method: Method):
    """The finished run in ``out`` if it was asked for with this very config and algorithm (an
    interrupted analysis resumes without retraining), else None."""
    from gradspec.optim import read_result

    if not (out / "retrain.json").is_file():
        return None
    saved = read_result(out)  # a damaged file: a one-line ValueError, not a traceback
    asked = json.loads(json.dumps(config.to_dict(), default=str))
    if saved.settings.get("config") != asked or saved.settings.get("algorithm") != method.algorithm:
        return None
    return saved


def _paper_delta_epsilons(exp: Experiment, sigma: float, n_train: int) -> dict[str, Any]:
    """epsilon at the paper's delta (1/n, or 1e-3 for Fig. 3), which gradspec's trainer refuses
    as a run setting (delta >= 1/n), by the PLD and the RDP accountant (the paper used RDP)."""
    from gradspec.privacy import compute_epsilon

    delta = exp.delta or 1.0 / n_train
    q = exp.batch_size / n_train
    return {"delta": delta, **{m: compute_epsilon(noise_multiplier=sigma, sample_rate=q, steps=exp.steps,
                                                  delta=delta, method=m) for m in ("pld", "rdp")}}


def _run_one(exp: Experiment, method: Method, *, seed: int, lr: float, clip: float, sigma: float,
             out: Path, validation: bool, reuse: bool = True) -> dict[str, Any]:
    from gradspec.optim import retrain
    from gradspec.tasks import make_task

    task = make_task(exp.task, seed=seed, **exp.task_options)
    if validation:
        task = _validation_task(task, seed)
    config = _config(exp, method, seed=seed, lr=lr, clip=clip, n_train=len(task.train), sigma=sigma)
    t0 = time.time()
    res = _finished(out, config, method) if reuse else None
    try:
        res = res or retrain(config=config, algorithm=method.algorithm, options=dict(method.options), out=out,
                             task=task, overwrite=True)
    except ValueError as err:  # a learning rate so large that the run diverged
        if "non-finite" not in str(err):
            raise
        return {"lr": lr, "clip": clip, "seed": seed, "diverged": True, "score": None, "out": str(out)}
    final = res.final_metrics
    score = final.get(exp.metric)
    if score is not None and not math.isfinite(score):
        score = None
    return {"lr": lr, "clip": clip, "seed": seed, "diverged": score is None, "score": score,
            "epsilon": res.epsilon, "delta": res.delta, "noise_multiplier": res.noise_multiplier,
            "final": {k: v for k, v in final.items() if isinstance(v, int | float)},
            "seconds": round(time.time() - t0, 2), "out": str(out)}


def _pick(exp: Experiment, trials: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [t for t in trials if t["score"] is not None]
    if not ok:
        raise RuntimeError(f"{exp.name}: every setting of the grid diverged")
    return (max if exp.maximize else min)(ok, key=lambda t: t["score"])


def run_experiment(exp: Experiment, seeds: list[int], out: Path, *, reuse: bool = True) -> dict[str, Any]:
    """Tune each method on the tuning seed, then run it on ``seeds``; ``reuse``: a finished run of the
    same settings in its directory is read back instead of retrained."""
    from gradspec.tasks import make_task

    n_full = len(make_task(exp.task, seed=seeds[0], **exp.task_options).train)
    sigma = _sigma(exp, n_full)
    logger.info("[%s] n_train=%d sigma=%.4f", exp.name, n_full, sigma)
    result: dict[str, Any] = {"claim": exp.claim, "paper": exp.paper, "task": exp.task,
                              "task_options": exp.task_options, "steps": exp.steps,
                              "batch_size": exp.batch_size, "noise_multiplier": sigma,
                              "n_train": n_full, "metric": exp.metric,
                              "selection": ("validation split (20% of the tuning seed's training split)"
                                            if exp.select_on_validation else "training loss of the tuning seed"),
                              "tune_seed": TUNE_SEED, "methods": {},
                              "epsilon_at_paper_delta": _paper_delta_epsilons(exp, sigma, n_full)}
    for method in exp.methods:
        kind = lr_kind(method)
        clips = exp.clip_grid if method.private else [1.0]
        trials = []
        for lr in exp.lr_grid[kind]:
            for clip in clips:
                name = f"{method.label}-lr{lr:g}-C{clip:g}".replace(" ", "_").replace("/", "_")
                trials.append(_run_one(exp, method, seed=TUNE_SEED, lr=lr, clip=clip, sigma=sigma,
                                       out=out / exp.name / "tune" / name, validation=exp.select_on_validation,
                                       reuse=reuse))
                logger.info("[%s] tune %-32s lr=%-7g C=%-4g %s=%s", exp.name, method.label, lr, clip,
                            exp.metric, trials[-1]["score"])
        best = _pick(exp, trials)
        runs = []
        for seed in seeds:
            name = f"{method.label}-seed{seed}".replace(" ", "_").replace("/", "_")
            runs.append(_run_one(exp, method, seed=seed, lr=best["lr"], clip=best["clip"], sigma=sigma,
                                 out=out / exp.name / "final" / name, validation=False, reuse=reuse))
        scores = [r["score"] for r in runs if r["score"] is not None]
        summary = score_summary(scores, len(runs))
        extra = {}
        for key in ("eval_accuracy", "eval_loss", "train_loss", "eval_accuracy_se"):
            vals = [r["final"][key] for r in runs if "final" in r and key in r["final"]]
            if vals:
                extra[key] = score_summary(vals, len(runs))
        eps = sorted({round(r["epsilon"], 4) for r in runs if "epsilon" in r})
        result["methods"][method.label] = {
            "algorithm": method.algorithm, "optimizer": method.optimizer, "private": method.private,
            "options": {k: (v if isinstance(v, str | int | float) else "tensor") for k, v in method.options.items()},
            "chosen": {"lr": best["lr"], "clip": best["clip"] if method.private else None,
                       "tune_score": best["score"]},
            "grid": [{k: t[k] for k in ("lr", "clip", "score", "diverged")} for t in trials],
            "epsilon": eps, "score": summary, "metrics": extra,
            "runs": [{k: r.get(k) for k in ("seed", "score", "epsilon", "final", "seconds", "out")} for r in runs],
        }
        logger.info("[%s] %-32s lr=%g C=%s -> %s = %.4f ± %.4f (n=%d) eps=%s", exp.name, method.label, best["lr"],
                    best["clip"] if method.private else "-", exp.metric, summary["mean"], summary["std"],
                    summary["n"], eps)
    return result


def merge_results(dirs: list[Path]) -> dict[str, Any]:
    """One results dict from the ``results.json`` of runs that each did some of the experiments
    (e.g. two processes run side by side); refuses runs with other seeds or another mode."""
    parts = [json.loads((Path(d) / "results.json").read_text()) for d in dirs]
    first = parts[0]
    merged = {"paper": first["paper"], "quick": first["quick"], "seeds": first["seeds"], "experiments": {},
              "merged_from": [str(d) for d in dirs],
              "seconds": {str(d): p.get("seconds") for d, p in zip(dirs, parts, strict=True)}}
    for d, part in zip(dirs, parts, strict=True):
        if part["seeds"] != first["seeds"] or part["quick"] != first["quick"]:
            raise ValueError(f"{d} ran seeds {part['seeds']} (quick={part['quick']}), {dirs[0]} ran "
                             f"{first['seeds']} (quick={first['quick']}): merge runs of one configuration")
        for name, exp in part["experiments"].items():
            if name not in merged["experiments"]:
                merged["experiments"][name] = exp
                continue
            have = merged["experiments"][name]  # the same experiment, other methods (run in parallel)
            same = {k: v for k, v in exp.items() if k != "methods"} == {k: v for k, v in have.items() if k != "methods"}
            clash = set(have.get("methods", {})) & set(exp.get("methods", {}))
            if not same or clash:
                raise ValueError(f"experiment {name!r} is in more than one of {dirs} with other settings or "
                                 f"the same methods {sorted(clash)}")
            have["methods"] = {**have["methods"], **exp["methods"]}
    order = ["bow", "sparse", "digits"]
    merged["experiments"] = dict(sorted(merged["experiments"].items(), key=lambda kv: order.index(kv[0])))
    return merged


def finish(results: dict[str, Any], out: Path, seeds: list[int], quick: bool) -> None:
    """Versions, the claims table and the figures; writes results.json and table.md."""
    import torch

    import gradspec

    results["versions"] = {"python": platform.python_version(), "torch": torch.__version__,
                           "numpy": np.__version__, "gradspec": getattr(gradspec, "__version__", "?")}
    results["machine"] = {"platform": platform.platform(), "torch_threads": torch.get_num_threads(),
                          "note": "2 CPU cores shared with 7 other engineers' jobs (load average ~15)"}
    rows = claims_table(results, seeds, quick)
    results["table"] = rows
    results["figures"] = figures(results, out)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    text = markdown_table(rows) + "\n\n" + method_table(results) + "\n"
    (out / "table.md").write_text(text)
    print(text)
    print(f"results: {out / 'results.json'}  figures: {', '.join(results['figures'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test (a couple of minutes)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seeds", type=int, default=3, help="reported seeds 0..N-1 (>= 3 for the claims)")
    parser.add_argument("--only", default="bow,sparse,digits", help="comma-separated experiments")
    parser.add_argument("--methods", default=None,
                        help="only these method labels (comma-separated), e.g. to run methods in parallel processes")
    parser.add_argument("--no-reuse", action="store_true",
                        help="retrain runs whose directory already holds a finished run of the same settings")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="DIR",
                        help="combine the results.json of runs that each did some experiments into --out")
    args = parser.parse_args(argv)
    log_to_stderr()
    import torch

    torch.set_num_threads(1)
    out = args.out or DEFAULT_OUT / ("quick" if args.quick else "full")
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seeds))
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    exps = [e for e in experiments(args.quick) if e.name in wanted]
    if args.methods:
        keep = {m.strip() for m in args.methods.split(",")}
        for e in exps:
            e.methods = [m for m in e.methods if m.label in keep]
    unknown = set(wanted) - {e.name for e in exps}
    if unknown:
        parser.error(f"unknown experiment(s) {sorted(unknown)}; choose from sparse, digits, bow")
    t0 = time.time()
    if args.merge:
        results = merge_results(args.merge)
        seeds = results["seeds"]
    else:
        results = {"paper": "Li, Zaheer, Reddi, Smith 2022, AdaDPS", "quick": args.quick,
                   "seeds": seeds, "experiments": {}}
        for exp in exps:
            results["experiments"][exp.name] = run_experiment(exp, seeds, out, reuse=not args.no_reuse)
            (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        results["seconds"] = round(time.time() - t0, 1)
    finish(results, out, seeds, bool(results["quick"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
