"""Reproduce Zhou, Wu & Banerjee (2021), PDP-SGD, §5 / Appendix D, on the bundled digits CNN.

    python -m analyses.zhou2021_pdp_sgd.run            # full mode (the committed results)
    python -m analyses.zhou2021_pdp_sgd.run --quick    # smoke test, ~2 minutes
    python -m analyses.zhou2021_pdp_sgd.run --paper-scale   # 30 epochs as the paper

What runs (all through ``gradspec.optim.retrain`` on ``gradspec.tasks`` "cnn", the
Papernot et al. CNN of the paper's Table 1, p = 26,010):

* the main grid: DP-SGD, PDP-SGD (k = 50, m = 100, s = 1) and RPDP-SGD (k = 800) at the
  paper's MNIST noise grid sigma in {18, 14, 10, 8, 6, 4}, C = 1, batch 250, with the
  paper's Table 3 step sizes and projection start epochs (scaled to our epoch count);
* the sweeps of Fig. 5/6 at sigma = 18: k in {10, 20, 30, 50}, m in {50, 100, 150},
  s in {1, 10, 20};
* controls: non-private SGD, DP-SGD at PDP-SGD's step size (sigma = 18), the untrained
  model, and (in the diagnostics) a random k-subspace;
* subspace diagnostics along the PDP-SGD runs at sigma = 18: principal angles between
  the public top-k and the private full-data top-k eigenspaces, eigengap, Davis-Kahan.

Finished runs (``runs/<name>/retrain.json`` with the same ``spec.json``) are reused, so
an interrupted run resumes. Writes ``results.json``, ``table.md`` and figures to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from analyses._common import installed_version, json_safe, log_to_stderr
from analyses.zhou2021_pdp_sgd.aggregate import aggregate
from analyses.zhou2021_pdp_sgd.config import (
    K_PDP,
    K_RPDP,
    LR_DP,
    LR_PDP,
    M_PUBLIC,
    PAPER,
    SCALES,
    START_EPOCH,
    SWEEP_SIGMA,
    Scale,
    n_train,
    n_train_from,
    start_epoch,
    total_steps,
)
from analyses.zhou2021_pdp_sgd.report import figures, markdown, table

logger = logging.getLogger("analyses.zhou2021_pdp_sgd")


# ---------------------------------------------------------------------------- the runs
def plan(scale: Scale, seeds: list[int]) -> list[dict[str, Any]]:
    """Every run, as a JSON-able spec (its ``name`` is its directory)."""
    specs = []

    def add(group: str, method: str, sigma: float, lr: float, seed: int, **opts: Any) -> None:
        tag = "-".join(f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in sorted(opts.items()))
        name = f"{group}-{method}-sigma{sigma:g}-lr{lr:g}" + (f"-{tag}" if tag else "") + f"-seed{seed}"
        specs.append({"name": name, "group": group, "method": method, "sigma": sigma, "lr": lr,
                      "seed": seed, "epochs": scale.epochs, "steps": total_steps(scale),
                      "batch_size": scale.batch_size, "n_eval": scale.n_eval,
                      "n_public_pool": scale.n_public, **opts})

    for sigma in scale.sigmas:
        for i, seed in enumerate(seeds):
            start = start_epoch(sigma, scale)
            add("main", "dp-sgd", sigma, LR_DP[sigma], seed)
            add("main", "pdp-sgd", sigma, LR_PDP[sigma], seed, k=K_PDP, m=M_PUBLIC, s=1, start=start,
                diagnose=sigma == SWEEP_SIGMA and i < scale.diag_seeds)
            add("main", "rpdp-sgd", sigma, LR_PDP[sigma], seed, k=K_RPDP, start=start)
    lr = LR_PDP[SWEEP_SIGMA]
    for seed in seeds:
        add("control", "dp-sgd", SWEEP_SIGMA, lr, seed)  # DP-SGD at PDP-SGD's step size
        add("control", "sgd", 0.0, 0.1, seed)  # non-private
    for sigma in scale.sigmas:  # the lr check (after the controls: it extends them)
        for seed in seeds:
            start = start_epoch(sigma, scale)
            for x in scale.lr_grid:
                if x != LR_DP[sigma] and not (sigma == SWEEP_SIGMA and x == lr):
                    add("lr", "dp-sgd", sigma, x, seed)
                if x != LR_PDP[sigma]:
                    add("lr", "pdp-sgd", sigma, x, seed, k=K_PDP, m=M_PUBLIC, s=1, start=start)
    for seed in seeds:
        for k in scale.ks:
            add("sweep_k", "pdp-sgd", SWEEP_SIGMA, lr, seed, k=k, m=M_PUBLIC, s=1, start=0.0)
        for m in scale.ms:
            add("sweep_m", "pdp-sgd", SWEEP_SIGMA, lr, seed, k=K_PDP, m=m, s=1, start=0.0)
        for s in scale.ss:
            add("sweep_s", "pdp-sgd", SWEEP_SIGMA, lr, seed, k=K_PDP, m=M_PUBLIC, s=s, start=0.0)
    return specs


def _config(spec: dict[str, Any]):
    from gradspec.train import TrainConfig

    steps_per_epoch = max(1, round(n_train_from(spec) / spec["batch_size"]))
    return TrainConfig(
        task="cnn", task_options={"n_eval": spec["n_eval"], "n_public": spec["n_public_pool"]},
        steps=spec["steps"], epochs=None, batch_size=spec["batch_size"], sampling="poisson",
        max_grad_norm=1.0, noise_multiplier=spec["sigma"], delta=1e-5, optimizer="sgd",
        lr=spec["lr"], momentum=0.0, microbatch=None, eval_every=steps_per_epoch,
        log_every=10**6, checkpoint_every=10**6, seed=spec["seed"], device="cpu",
    )


def _hooks(spec: dict[str, Any], diag_every: int):
    from gradspec.optim import PDPSGD, PublicProjector, RandomProjector

    method = spec["method"]
    if method in ("dp-sgd", "sgd"):
        return "dp-sgd"
    if method == "rpdp-sgd":
        return PDPSGD(RandomProjector(spec["k"], seed=spec["seed"]), start_epoch=spec["start"])
    projector = PublicProjector(spec["k"], public_size=spec["m"], period=spec["s"], seed=spec["seed"])
    if spec.get("diagnose"):
        from analyses.zhou2021_pdp_sgd.diagnostics import DiagnosedPDPSGD

        return DiagnosedPDPSGD(projector, start_epoch=spec["start"], every=diag_every,
                               last_step=spec["steps"] - 1, seed=spec["seed"])
    return PDPSGD(projector, start_epoch=spec["start"])


def run_one(spec: dict[str, Any], root: Path, diag_every: int) -> dict[str, Any]:
    """Train one spec (or reuse its finished run) and return its summary row."""
    from gradspec.optim import retrain
    from gradspec.plot import load_curve

    out = root / "runs" / spec["name"]
    done, saved_spec = out / "retrain.json", out / "spec.json"
    if done.is_file() and saved_spec.is_file() and json.loads(saved_spec.read_text()) == spec:
        result = json.loads(done.read_text())
        diag = json.loads((out / "diagnostics.json").read_text()) if (out / "diagnostics.json").is_file() else None
    else:
        hooks = _hooks(spec, diag_every)
        t0 = time.perf_counter()
        res = retrain(config=_config(spec), algorithm=hooks, out=out, overwrite=True)
        result = res.to_dict()
        result["wall_s"] = time.perf_counter() - t0
        diag = getattr(hooks, "records", None)
        if diag is not None:
            (out / "diagnostics.json").write_text(json.dumps(diag))
        done.write_text(json.dumps(result, indent=2, default=str))
        saved_spec.write_text(json.dumps(spec))
    final = result["final_metrics"]
    steps_curve, acc_curve = load_curve(out / "metrics.jsonl", "eval_accuracy")
    return {**spec, "algorithm": spec["method"], "rank": spec.get("k"),
            "epsilon": result["epsilon"] if spec["sigma"] > 0 else float("inf"),
            "train_accuracy": final.get("train_accuracy"), "eval_accuracy": final.get("eval_accuracy"),
            "eval_accuracy_se": final.get("eval_accuracy_se"), "eval_examples": final.get("eval_examples"),
            "wall_s": result.get("wall_s"), "out": str(out),
            "curve": {"step": [int(s) for s in steps_curve], "eval_accuracy": [float(a) for a in acc_curve]},
            "diagnostics": diag}


def untrained(seeds: list[int], scale: Scale) -> list[float]:
    """Held-out accuracy of the freshly initialised CNN (the untrained control)."""
    import torch

    from gradspec.tasks import make_task
    from gradspec.train import evaluate

    accs = []
    for seed in seeds:
        task = make_task("cnn", seed=seed, n_eval=scale.n_eval, n_public=scale.n_public)
        task.model.eval()
        with torch.no_grad():
            accs.append(float(evaluate(task, task.model, torch.device("cpu"))["eval_accuracy"]))
    return accs


# ---------------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smoke test (1 epoch, σ ∈ {18, 4}, ~2 min)")
    mode.add_argument("--paper-scale", action="store_true", help="30 epochs as the paper (about 2x the full mode)")
    parser.add_argument("--out", default=None, help="output folder (default runs/analyses/zhou2021_pdp_sgd/<mode>)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only-finished", action="store_true",
                        help="aggregate the runs already finished in --out, start none (an interrupted run)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    args = parser.parse_args(argv)
    scale = SCALES["quick" if args.quick else "paper" if args.paper_scale else "full"]
    out = Path(args.out or os.path.join("runs", "analyses", "zhou2021_pdp_sgd", scale.name))
    out.mkdir(parents=True, exist_ok=True)
    log_to_stderr()
    logging.getLogger("analyses.zhou2021_pdp_sgd.diagnostics").setLevel(logging.INFO)
    import torch

    torch.set_num_threads(args.threads)
    seeds = list(dict.fromkeys(args.seeds))
    specs = plan(scale, seeds)
    if args.only_finished:
        specs = [s for s in specs if (out / "runs" / s["name"] / "retrain.json").is_file()]
        scale = dataclasses.replace(
            scale, sigmas=tuple(x for x in scale.sigmas if any(s["sigma"] == x and s["group"] == "main" for s in specs)),
            ks=tuple(k for k in scale.ks if any(s["group"] == "sweep_k" and s["k"] == k for s in specs)),
            ms=tuple(m for m in scale.ms if any(s["group"] == "sweep_m" and s["m"] == m for s in specs)),
            ss=tuple(x for x in scale.ss if any(s["group"] == "sweep_s" and s["s"] == x for s in specs)))
    logger.info("%d runs at scale %s (%g epochs = %d steps, n_train %d)", len(specs), scale.name,
                scale.epochs, total_steps(scale), n_train(scale))
    t0 = time.perf_counter()
    rows = []
    for i, spec in enumerate(specs, 1):
        row = run_one(spec, out, scale.diag_every)
        rows.append(row)
        logger.info("[%d/%d] %s: eps %.3f train %.3f test %.3f (%.0fs elapsed)", i, len(specs), spec["name"],
                    row["epsilon"], row["train_accuracy"], row["eval_accuracy"], time.perf_counter() - t0)
    agg = aggregate(rows, scale, seeds, untrained(seeds, scale))
    table_rows = table(agg, scale, seeds)
    md = markdown(table_rows)
    written = figures(rows, agg, out)
    results = {
        "paper": PAPER, "scale": dataclasses.asdict(scale), "seeds": seeds, "n_train": n_train(scale),
        "steps": total_steps(scale),
        "setup": {"task": "cnn (digits 8x8 upsampled to 28x28, Papernot CNN, tanh, p=26010)",
                  "lr_dp": LR_DP, "lr_pdp_rpdp": LR_PDP, "start_epoch_paper": START_EPOCH,
                  "k_pdp": K_PDP, "k_rpdp": K_RPDP, "m": M_PUBLIC, "sweep_sigma": SWEEP_SIGMA,
                  "delta": 1e-5, "accountant": "PLD (dp-accounting), Poisson subsampling",
                  "clip": 1.0, "batch_size": scale.batch_size},
        "aggregate": agg, "table": table_rows, "runs": [{k: v for k, v in r.items()} for r in rows],
        "figures": written, "wall_s": time.perf_counter() - t0,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                     "gradspec": installed_version("gradspec") or "?"},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores shared, torch threads {args.threads}",
        "command": "python -m analyses.zhou2021_pdp_sgd.run " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    (out / "results.json").write_text(json.dumps(json_safe(results), indent=1, default=str, allow_nan=False))
    (out / "table.md").write_text(md + "\n")
    print(md)
    return results


if __name__ == "__main__":
    main()
