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
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from analyses.zhou2021_pdp_sgd.config import (  # noqa: F401 - run.py's settings, also read by the tests
    LR_DP,
    LR_PDP,
    PAPER,
    PAPER_EPS,
    SCALES,
    START_EPOCH,
    SWEEP_SIGMA,
    Scale,
    n_train,
    start_epoch,
    total_steps,
)
from analyses.zhou2021_pdp_sgd.report import _stats, figures, markdown, summarize_diagnostics, table

logger = logging.getLogger("analyses.zhou2021_pdp_sgd")

K_PDP, K_RPDP, M_PUBLIC = 50, 800, 100
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


def n_train_from(spec: dict[str, Any]) -> int:
    return 1797 - spec["n_eval"] - spec["n_public_pool"]


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


def _group(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return sorted([r for r in rows if all(r.get(k) == v for k, v in match.items())], key=lambda r: r["seed"])


def paired(a: list[dict[str, Any]], b: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """Seed-paired difference a - b (same split, init and noise seed) with its standard error.

    se = sqrt(std_diff^2 / n + (mean eval se_a^2 + mean eval se_b^2) / n): the spread over
    seeds plus the binomial error of the 400-example evaluation set (conservative: it
    ignores that both runs are scored on the same examples). A difference counts when
    |mean| > 2 se.
    """
    by_seed = {r["seed"]: r for r in b}
    pairs = [(r, by_seed[r["seed"]]) for r in a if r["seed"] in by_seed]
    diffs = [x[metric] - y[metric] for x, y in pairs]
    n = len(diffs)
    st = _stats(diffs)
    binom = 0.0
    if metric == "eval_accuracy":
        binom = float(np.mean([x["eval_accuracy_se"] ** 2 + y["eval_accuracy_se"] ** 2 for x, y in pairs]))
    se = math.sqrt(st["std"] ** 2 / n + binom / n) if n else float("nan")
    verdict = "higher" if st["mean"] > 2 * se else ("lower" if st["mean"] < -2 * se else "no difference")
    return {**st, "se": se, "verdict": verdict, "per_seed": diffs}


def select_lr(rows: list[dict[str, Any]], method: str, sigma: float) -> dict[str, Any] | None:
    """The step size of ``method`` at ``sigma`` with the best mean final *train* accuracy over
    seeds (the paper's criterion), among every finished main/lr/control run of it."""
    groups: dict[float, list[dict[str, Any]]] = {}
    for r in rows:
        if r["method"] == method and r["sigma"] == sigma and r["group"] in ("main", "lr", "control"):
            groups.setdefault(r["lr"], []).append(r)
    if not groups:
        return None
    n = max(len(g) for g in groups.values())
    groups = {lr: sorted(g, key=lambda r: r["seed"]) for lr, g in groups.items() if len(g) == n}
    train = {lr: float(np.mean([r["train_accuracy"] for r in g])) for lr, g in groups.items()}
    best = max(train, key=train.get)
    return {"lr": best, "candidates": {f"{lr:g}": train[lr] for lr in sorted(train)},
            "eval_accuracy": _stats([r["eval_accuracy"] for r in groups[best]]), "rows": groups[best]}


def aggregate(rows: list[dict[str, Any]], scale: Scale, seeds: list[int], untrained_acc: list[float]) -> dict[str, Any]:
    grid = []
    for sigma in scale.sigmas:
        entry: dict[str, Any] = {"sigma": sigma, "paper_epsilon": PAPER_EPS[sigma]}
        groups = {m: _group(rows, group="main", method=m, sigma=sigma) for m in ("dp-sgd", "pdp-sgd", "rpdp-sgd")}
        entry["epsilon"] = float(np.mean([r["epsilon"] for r in groups["dp-sgd"]]))
        for m, g in groups.items():
            entry[m] = {metric: _stats([r[metric] for r in g]) for metric in ("train_accuracy", "eval_accuracy")}
            entry[m]["eval_se"] = float(np.mean([r["eval_accuracy_se"] for r in g]))
        for m in ("pdp-sgd", "rpdp-sgd"):
            entry[f"{m} - dp-sgd"] = {metric: paired(groups[m], groups["dp-sgd"], metric)
                                      for metric in ("train_accuracy", "eval_accuracy")}
        tuned = {m: select_lr(rows, m, sigma) for m in ("dp-sgd", "pdp-sgd")}
        if all(t is not None for t in tuned.values()) and any(len(t["candidates"]) > 1 for t in tuned.values()):
            entry["lr_selected"] = {m: {k: v for k, v in t.items() if k != "rows"} for m, t in tuned.items()}
            entry["lr_selected"]["pdp-sgd - dp-sgd"] = paired(tuned["pdp-sgd"]["rows"], tuned["dp-sgd"]["rows"],
                                                              "eval_accuracy")
        grid.append(entry)

    def sweep(group: str, key: str, values: tuple[int, ...], main_value: int) -> list[dict[str, Any]]:
        out = []
        main = {"k": K_PDP, "m": M_PUBLIC, "s": 1}
        for v in sorted({*values, main_value}):
            if v == main_value:
                g = _group(rows, group="main", method="pdp-sgd", sigma=SWEEP_SIGMA)
            else:
                g = _group(rows, group=group, method="pdp-sgd", **{key: v})
            if not g:
                continue
            out.append({key: v, **{k2: v2 for k2, v2 in main.items() if k2 != key},
                        "eval_accuracy": _stats([r["eval_accuracy"] for r in g]),
                        "train_accuracy": _stats([r["train_accuracy"] for r in g])})
        return out

    dp18 = _group(rows, group="main", method="dp-sgd", sigma=SWEEP_SIGMA)
    pdp18 = _group(rows, group="main", method="pdp-sgd", sigma=SWEEP_SIGMA)
    lr_ctrl = _group(rows, group="control", method="dp-sgd")
    nonpriv = _group(rows, group="control", method="sgd")
    controls = {
        "non_private_sgd": {m: _stats([r[m] for r in nonpriv]) for m in ("train_accuracy", "eval_accuracy")},
        "dp_sgd_at_pdp_lr_sigma18": {m: _stats([r[m] for r in lr_ctrl]) for m in ("train_accuracy", "eval_accuracy")},
        "pdp - dp_sgd_at_pdp_lr_sigma18": paired(pdp18, lr_ctrl, "eval_accuracy"),
        "untrained_eval_accuracy": _stats(untrained_acc),
    }
    diag = [r["diagnostics"] for r in pdp18 if r.get("diagnostics")]
    diagnostics = summarize_diagnostics(diag)
    return {"grid": grid, "sweep_k": sweep("sweep_k", "k", scale.ks, K_PDP),
            "sweep_m": sweep("sweep_m", "m", scale.ms, M_PUBLIC), "sweep_s": sweep("sweep_s", "s", scale.ss, 1),
            "dp_sgd_sigma18": {m: _stats([r[m] for r in dp18]) for m in ("train_accuracy", "eval_accuracy")},
            "controls": controls, "diagnostics": diagnostics}


def _clean(obj: Any) -> Any:
    """JSON-able, with non-finite floats (a non-private run's epsilon) as null."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("gradspec").setLevel(logging.WARNING)
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
    from importlib import metadata

    try:
        gradspec_version = metadata.version("gradspec")
    except metadata.PackageNotFoundError:
        gradspec_version = "?"
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
                     "gradspec": gradspec_version},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores shared, torch threads {args.threads}",
        "command": "python -m analyses.zhou2021_pdp_sgd.run " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    (out / "results.json").write_text(json.dumps(_clean(results), indent=1, default=str, allow_nan=False))
    (out / "table.md").write_text(md + "\n")
    print(md)
    return results


if __name__ == "__main__":
    main()
