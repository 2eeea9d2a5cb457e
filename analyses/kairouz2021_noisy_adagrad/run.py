"""Kairouz et al. 2021: excess risk vs dimension d of ball-constrained private logistic regression.

The paper has no experiments. Its theory predicts (README, "What the theory predicts"):
on a *constrained* convex problem whose gradients lie in a k-dimensional subspace,
ambient DP-GD's excess empirical risk grows with d (the out-of-subspace noise fills the
ball and the projection onto the ball shrinks the useful part of theta; Bassily et al.
2014 lower bound Omega(sqrt(d) / (eps n)), quoted in §4.2), while noisy AdaGrad in a
public estimate of the gradient subspace is dimension free (Corollary 4.2:
O(sqrt(log(1/delta)) / (eps n))), as is PDP-SGD (projection of the noisy gradient).

Task ``ballglm`` (gradspec.tasks.ballglm): unit-norm data of rank r = 5 in R^d, logistic
loss (1-Lipschitz: clipping at C = 1 is inactive), ball of radius R. Full-batch steps
(Poisson rate q = 1), T steps, every method at the same (eps, delta) with its own
calibrated noise: DP-GD / PDP-GD / RPDP-GD release T Gaussian gradients (sigma for T
releases); noisy AdaGrad releases T gradients and T preconditioners (sigma = z_B for 2T
releases, split equally). The non-private optimum is computed in float64
(``ball_optimum``, with a Frank-Wolfe gap certificate); non-private projected GD is the
control, as are a random subspace of the same rank (RPDP-GD) and the untrained model.

Learning rates: the same grid for every method, chosen per (method, d) by the held-out
(validation) loss of a separate tuning draw (seed 1000: its own data, public set and
noise), never on the reported seeds.

Run: ``python -m analyses.kairouz2021_noisy_adagrad.run [--quick] [--out DIR] [--seeds 0 1 2]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from analyses._common import installed_version, log_to_stderr
from analyses.kairouz2021_noisy_adagrad.config import FULL, METHODS, PAPER, QUICK, TUNE_SEED, Scale
from analyses.kairouz2021_noisy_adagrad.report import claims, figure, print_tables, summarise

logger = logging.getLogger("kairouz2021")


def _hooks(method: str, *, scale: Scale, d: int, seed: int, z_b: float) -> Any:
    from gradspec.optim import BallConstraint, RandomProjector, make_algorithm
    from gradspec.train import StepHooks

    k, m, never = scale.rank, scale.public_size, 10**9
    if method in ("gd", "dp-gd"):
        inner = StepHooks()
    elif method == "pdp-gd":
        inner = make_algorithm("pdp-sgd", rank=k, public_size=m, period=never, seed=seed)
    elif method == "rpdp-gd":
        inner = make_algorithm("rpdp-sgd", rank=k, seed=seed + 11)
    elif method in ("noisy-adagrad", "noisy-adagrad-diag"):
        inner = make_algorithm("noisy-adagrad", rank=k, public_size=m, period=never, seed=seed,
                               precond_noise_multiplier=z_b, diagonal=method.endswith("diag"),
                               noise_seed=seed + 7)
    elif method == "noisy-adagrad-ambient":
        # a random orthonormal basis of all of R^d: full-matrix AdaGrad is rotation equivariant
        inner = make_algorithm("noisy-adagrad", projector=RandomProjector(d, seed=seed),
                               precond_noise_multiplier=z_b, noise_seed=seed + 7)
    else:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
    return BallConstraint(inner, radius=scale.radius)


def noise_levels(scale: Scale) -> dict[str, float]:
    """sigma for each accounting kind at the target (eps, delta): T or 2T full-batch Gaussians."""
    from gradspec.privacy import calibrate_noise_multiplier, default_delta

    delta = default_delta(scale.n)
    return {
        "delta": delta,
        "gradient": calibrate_noise_multiplier(target_epsilon=scale.epsilon, sample_rate=1.0,
                                               steps=scale.steps, delta=delta),
        "gradient+preconditioner": calibrate_noise_multiplier(
            target_epsilon=scale.epsilon, sample_rate=1.0, steps=2 * scale.steps, delta=delta),
    }


def one_run(method: str, *, scale: Scale, d: int, seed: int, lr: float, sigmas: dict[str, float],
            out: Path) -> dict[str, Any]:
    """Train one (method, d, seed, lr) and measure its excess risk against the float64 optimum."""
    from gradspec.optim import retrain
    from gradspec.tasks import ball_basis, ball_optimum, logistic_risk, make_task
    from gradspec.train import TrainConfig

    private, kind, _ = METHODS[method]
    sigma = sigmas[kind] if private else 0.0
    options = dict(n=scale.n, d=d, r=scale.rank, n_public=scale.n_public, n_eval=scale.n_eval,
                   margin=scale.margin)
    task = make_task("ballglm", seed=seed, **options)
    hooks = _hooks(method, scale=scale, d=d, seed=seed, z_b=sigma if kind.endswith("preconditioner") else 0.0)
    config = TrainConfig(
        task="ballglm", task_options=options, steps=scale.steps, batch_size=scale.n, sampling="poisson",
        max_grad_norm=1.0, noise_multiplier=sigma, optimizer="sgd", momentum=0.0, lr=lr,
        delta=sigmas["delta"], eval_every=0, log_every=10**6, checkpoint_every=10**6, seed=seed,
        microbatch=scale.n,
    )
    t0 = time.perf_counter()
    res = retrain(config=config, algorithm=hooks, out=out, task=task, overwrite=True, train_metrics=False)
    seconds = time.perf_counter() - t0
    theta = task.model.weight.detach().double().reshape(-1)
    basis = ball_basis(task)
    opt = ball_optimum(task.train, scale.radius, basis=basis)
    risk = logistic_risk(theta, task.train)
    outside = theta - basis @ (basis.T @ theta)
    if private and res.epsilon > scale.epsilon * (1 + 1e-3):
        raise RuntimeError(f"{method}: the run spent epsilon {res.epsilon:.4f} > target {scale.epsilon}")
    return {
        "method": method, "d": d, "seed": seed, "lr": lr, "sigma": sigma,
        "precond_noise_multiplier": sigma if kind.endswith("preconditioner") else None,
        "epsilon": res.epsilon if private else None, "delta": sigmas["delta"] if private else None,
        "accounting": res.accounting, "train_risk": risk, "opt_risk": opt.risk,
        "excess_risk": risk - opt.risk, "opt_gap_certificate": opt.gap, "opt_kkt": opt.kkt_residual,
        "opt_multiplier": opt.multiplier, "heldout_risk": logistic_risk(theta, task.eval),
        "heldout_risk_opt": logistic_risk(opt.theta, task.eval),
        "heldout_accuracy": res.final_metrics.get("eval_accuracy"),
        "theta_norm": float(theta.norm()), "theta_out_of_span_norm": float(outside.norm()),
        "untrained_risk": math.log(2.0), "seconds": seconds, "steps": res.steps,
    }


def _cached(path: Path) -> dict[tuple, dict[str, Any]]:
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[(row["phase"], row["method"], row["d"], row["seed"], row["lr"])] = row
    return rows


def methods_for(d: int, scale: Scale) -> list[str]:
    return [m for m in METHODS if m != "noisy-adagrad-ambient" or d <= scale.ambient_max_d]


def run_all(scale: Scale, seeds: list[int], out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "runs.jsonl"
    cache = _cached(log_path)
    sigmas = noise_levels(scale)
    logger.info("calibrated noise multipliers at eps=%g, delta=%.3g: %s", scale.epsilon, sigmas["delta"],
                {k: round(v, 4) for k, v in sigmas.items() if k != "delta"})

    def run(phase: str, method: str, d: int, seed: int, lr: float) -> dict[str, Any]:
        key = (phase, method, d, seed, lr)
        if key not in cache:
            row = one_run(method, scale=scale, d=d, seed=seed, lr=lr, sigmas=sigmas,
                          out=out / "runs" / f"{phase}-{method}-d{d}-seed{seed}-lr{lr:g}")
            row["phase"] = phase
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            cache[key] = row
            logger.info("%s %-22s d=%-6d seed=%-4d lr=%-5g excess=%.4g heldout=%.4f |theta_perp|=%.3f (%.1fs)",
                        phase, method, d, seed, lr, row["excess_risk"], row["heldout_risk"],
                        row["theta_out_of_span_norm"], row["seconds"])
        return cache[key]

    chosen: dict[str, dict[int, float]] = {}
    tuning: dict[str, dict[int, dict[str, float]]] = {}
    results: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for d in scale.dims:
        for method in methods_for(d, scale):
            scores = {lr: run("tune", method, d, TUNE_SEED, lr)["heldout_risk"] for lr in scale.lrs}
            best = min(scores, key=lambda lr: (scores[lr], lr))
            chosen.setdefault(method, {})[d] = best
            tuning.setdefault(method, {})[d] = {f"{lr:g}": v for lr, v in scores.items()}
            results.setdefault(method, {})[d] = [run("report", method, d, s, best) for s in seeds]
    return {"sigmas": sigmas, "chosen_lr": chosen, "tuning_heldout_risk": tuning, "runs": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke test (d in {10, 1000}, 30 steps)")
    parser.add_argument("--out", default=None, help="output directory")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    if len(args.seeds) < 2 or len(set(args.seeds)) != len(args.seeds) or TUNE_SEED in args.seeds:
        parser.error(f"give >= 2 distinct seeds other than the tuning seed {TUNE_SEED}")
    log_to_stderr()
    torch.set_num_threads(1)
    scale = QUICK if args.quick else FULL
    out = Path(args.out or f"runs/analyses/kairouz2021_noisy_adagrad/{'quick' if args.quick else 'full'}")
    started = time.time()
    found = run_all(scale, args.seeds, out)
    table = summarise(found, scale, args.seeds)
    rows = claims(table, scale, args.seeds)
    text = print_tables(table, rows, scale)
    (out / "table.md").write_text(text + "\n")
    fig = figure(table, scale, out)
    result = {
        "paper": PAPER, "scale": dataclasses.asdict(scale), "mode": "quick" if args.quick else "full",
        "seeds": args.seeds, "tune_seed": TUNE_SEED, "sigmas": found["sigmas"],
        "chosen_lr": {m: {str(d): v for d, v in by.items()} for m, by in found["chosen_lr"].items()},
        "tuning_heldout_risk": {m: {str(d): v for d, v in by.items()} for m, by in found["tuning_heldout_risk"].items()},
        "methods": {m: METHODS[m][2] for m in METHODS}, "table": table, "claims": rows,
        "runs": [r for by in found["runs"].values() for rs in by.values() for r in rs],
        "figure": fig.name, "seconds": time.time() - started,
        "train_seconds_total": sum(r["seconds"] for r in _cached(out / "runs.jsonl").values()),
        "runs_total": len(_cached(out / "runs.jsonl")),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "gradspec": installed_version("gradspec") or "?"},
        "machine": f"{os.cpu_count()} CPUs (shared), torch threads 1",
        "command": "python -m analyses.kairouz2021_noisy_adagrad.run" + (" --quick" if args.quick else "")
                   + (f" --seeds {' '.join(map(str, args.seeds))}" if args.seeds != [0, 1, 2] else ""),
    }
    (out / "results.json").write_text(json.dumps(result, indent=2))
    logger.info("wrote %s (%.0f s)", out / "results.json", result["seconds"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
