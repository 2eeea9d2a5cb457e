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

logger = logging.getLogger("analyses.zhou2021_pdp_sgd")

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
K_PDP, K_RPDP, M_PUBLIC = 50, 800, 100
SWEEP_SIGMA = 18.0
#: the lr check: DP-SGD and PDP-SGD also at these step sizes (the paper's grid {0.01, 0.05, 0.1, 0.2}
#: less 0.01, too small for our 50 steps), the lr of each then picked by final *train* accuracy
#: (the paper's criterion, Appendix D), never by the test accuracy reported.
LR_GRID = (0.05, 0.1, 0.2)


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
    return 1797 - scale.n_eval - scale.n_public


def total_steps(scale: Scale) -> int:
    return math.ceil(scale.epochs * n_train(scale) / scale.batch_size - 1e-9)


def start_epoch(sigma: float, scale: Scale) -> float:
    """Table 3's start epoch (1-based, of 30) as a fraction of our run: epoch e -> (e-1)/30 * E."""
    return (START_EPOCH.get(sigma, 1) - 1) / PAPER_EPOCHS * scale.epochs


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


# ---------------------------------------------------------------------------- aggregation
def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0, "n": int(len(a))}


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


DIAG_KEYS = ("sin_max_public", "sin_max_random", "mean_cos2_public", "mean_cos2_random",
             "energy_public", "energy_private_topk", "energy_random", "mean_grad_kept_public",
             "mean_grad_kept_private_topk", "mean_grad_kept_random", "eigengap_private_relative",
             "eigengap_public_relative", "deviation", "eigengap_private", "davis_kahan_bound")


def summarize_diagnostics(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per diagnosed step: mean and std over seeds of each diagnostic."""
    if not runs:
        return {}
    steps = sorted(set.intersection(*[{r["step"] for r in run} for run in runs]))
    per_step = []
    for step in steps:
        recs = [next(r for r in run if r["step"] == step) for run in runs]
        angles = np.degrees(np.mean([r["angles_public"] for r in recs], axis=0))
        per_step.append({"step": step, **{k: _stats([r[k] for r in recs if r.get(k) is not None])
                                          for k in DIAG_KEYS},
                         "angles_public_deg_mean": [float(a) for a in angles]})
    return {"k": runs[0][0]["k"], "public_size": runs[0][0]["public_size"],
            "private_size": runs[0][0]["private_size"], "seeds": len(runs), "per_step": per_step}


# ---------------------------------------------------------------------------- table
def _pm(s: dict[str, float], pct: bool = True) -> str:
    f = 100.0 if pct else 1.0
    return f"{f * s['mean']:.1f} ± {f * s['std']:.1f}"


def table(agg: dict[str, Any], scale: Scale, seeds: list[int]) -> list[dict[str, str]]:
    """The claim | paper | ours | reproduced? rows (accuracies in percentage points)."""
    rows = []
    at = (f"digits CNN, n_train={n_train(scale)}, eval 400, {scale.epochs:g} epochs, B=250, "
          f"{len(seeds)} seeds")
    for e in agg["grid"]:
        d = e["pdp-sgd - dp-sgd"]["eval_accuracy"]
        small = e["paper_epsilon"] <= 0.42
        paper = ("PDP > DP (Fig. 3a, MNIST: PDP-SGD better for ε ≤ 0.42; FMNIST ≤ 0.72)" if small else
                 "DP ≥ PDP (Fig. 3a: DP-SGD better at larger ε)")
        expect = "higher" if small else None
        ok = ("yes" if d["verdict"] == "higher" else "no") if expect == "higher" else (
            "yes" if d["verdict"] != "higher" else "no")
        rows.append({
            "claim": f"PDP-SGD − DP-SGD test acc, σ={e['sigma']:g} (paper ε={e['paper_epsilon']}, ours ε={e['epsilon']:.2f})",
            "paper": paper,
            "ours": (f"{100 * d['mean']:+.1f} ± {100 * d['se']:.1f} pp (PDP {_pm(e['pdp-sgd']['eval_accuracy'])}, "
                     f"DP {_pm(e['dp-sgd']['eval_accuracy'])}; eval s.e. {100 * e['dp-sgd']['eval_se']:.1f})"),
            "reproduced": ok})
    for e in agg["grid"]:
        sel = e.get("lr_selected")
        if not sel:
            continue
        d = sel["pdp-sgd - dp-sgd"]
        small = e["paper_epsilon"] <= 0.42
        ok = ("yes" if d["verdict"] == "higher" else "no") if small else ("yes" if d["verdict"] != "higher" else "no")
        rows.append({
            "claim": f"PDP-SGD − DP-SGD test acc, each method at its train-accuracy-selected lr ∈ {{0.05, 0.1, 0.2}}, σ={e['sigma']:g}",
            "paper": "PDP > DP for ε ≤ 0.42" if small else "DP ≥ PDP",
            "ours": (f"{100 * d['mean']:+.1f} ± {100 * d['se']:.1f} pp (PDP lr {sel['pdp-sgd']['lr']:g}: "
                     f"{_pm(sel['pdp-sgd']['eval_accuracy'])}, DP lr {sel['dp-sgd']['lr']:g}: "
                     f"{_pm(sel['dp-sgd']['eval_accuracy'])})"),
            "reproduced": ok})
    for e in agg["grid"]:
        d = e["rpdp-sgd - dp-sgd"]["eval_accuracy"]
        rows.append({
            "claim": f"RPDP-SGD (k=800) − DP-SGD test acc, σ={e['sigma']:g}",
            "paper": "RPDP-SGD fails to improve over DP-SGD for most ε (Fig. 3)",
            "ours": f"{100 * d['mean']:+.1f} ± {100 * d['se']:.1f} pp (RPDP {_pm(e['rpdp-sgd']['eval_accuracy'])})",
            "reproduced": "yes" if d["verdict"] != "higher" else "no"})

    def trend(key: str, entries: list[dict[str, Any]], paper: str, increasing: bool = True) -> None:
        if len(entries) < 2:
            return
        vals = [(e[key], e["eval_accuracy"]) for e in entries]
        text = ", ".join(f"{key}={v}: {_pm(s)}" for v, s in vals)
        first, last = vals[0][1], vals[-1][1]
        se = math.sqrt((first["std"] ** 2 + last["std"] ** 2) / max(first["n"], 1) + 2 * 0.022**2 / max(first["n"], 1))
        diff = last["mean"] - first["mean"]
        if increasing:
            ok = "yes" if diff > 2 * se else ("no (flat within 2 s.e.)" if abs(diff) <= 2 * se else "no (reversed)")
        else:  # "mild decay": last not better than first by more than noise
            ok = "yes" if diff <= 2 * se else "no"
        rows.append({"claim": f"PDP-SGD sweep over {key} (σ=18)", "paper": paper,
                     "ours": f"{text} (last − first {100 * diff:+.1f} ± {100 * se:.1f} pp)", "reproduced": ok})

    trend("k", agg["sweep_k"], "accuracy increases with k ∈ {10,20,30,50}; k=50 best, k=10 slowest (Fig. 5a)")
    trend("m", agg["sweep_m"], "accuracy increases with m ∈ {50,100,150} (Fig. 5b)")
    if agg["sweep_s"]:
        s_entries = agg["sweep_s"]
        trend("s", s_entries, "mild decay with fewer updates s ∈ {1,10,20}, still above DP-SGD (Fig. 6/13)",
              increasing=False)
        dp = agg["dp_sgd_sigma18"]["eval_accuracy"]
        worst = min(s_entries, key=lambda e: e["eval_accuracy"]["mean"])
        rows.append({"claim": f"PDP-SGD with the sparsest update (s={max(e['s'] for e in s_entries)}) vs DP-SGD (σ=18)",
                     "paper": "PDP-SGD with reduced eigenspace computation still beats DP-SGD (Fig. 6)",
                     "ours": f"worst s={worst['s']}: {_pm(worst['eval_accuracy'])} vs DP-SGD {_pm(dp)}",
                     "reproduced": "yes" if worst["eval_accuracy"]["mean"] - dp["mean"] > 2 * 0.022 * math.sqrt(2 / dp["n"]) else "no"})
    diag = agg["diagnostics"]
    if diag:
        first, last = diag["per_step"][0], diag["per_step"][-1]
        rows.append({
            "claim": f"public top-k (m={diag['public_size']}) ≈ private top-k subspace (k={diag['k']}), σ=18",
            "paper": "‖V̂V̂ᵀ − VVᵀ‖₂ small when the eigengap α_t is large, m ≥ O(ln p / α²) (Thm. 2); no measured value given",
            "ours": (f"principal angles θ_1/θ_25/θ_50 {last['angles_public_deg_mean'][0]:.0f}°/"
                     f"{last['angles_public_deg_mean'][len(last['angles_public_deg_mean']) // 2 - 1]:.0f}°/"
                     f"{last['angles_public_deg_mean'][-1]:.0f}° at the last step; "
                     f"sin θ_max {first['sin_max_public']['mean']:.2f}→{last['sin_max_public']['mean']:.2f} "
                     f"(random {last['sin_max_random']['mean']:.2f}); mean cos² {last['mean_cos2_public']['mean']:.2f} "
                     f"(random {last['mean_cos2_random']['mean']:.4f}); private-gradient energy kept "
                     f"{last['energy_public']['mean']:.2f} (private top-k {last['energy_private_topk']['mean']:.2f}, "
                     f"random {last['energy_random']['mean']:.4f}); rel. eigengap λ_k−λ_k+1 / λ_1 "
                     f"{last['eigengap_private_relative']['mean']:.2g}; ‖M_pub − M_priv‖₂ / (λ_k − λ_k+1) "
                     f"= {last['deviation']['mean'] / last['eigengap_private']['mean']:.0f}, so the Davis–Kahan bound "
                     f"is vacuous ({last['davis_kahan_bound']['mean']:.2f}); mean private gradient kept "
                     f"{last['mean_grad_kept_public']['mean']:.2f}"),
            "reproduced": ("partly: close in energy, not in angle; the theorem's gap condition fails"
                           if last["sin_max_public"]["mean"] > 0.9 and last["energy_public"]["mean"] > 0.5
                           else ("yes" if last["sin_max_public"]["mean"] < 0.9 else "no"))})
    c = agg["controls"]
    rows.append({"claim": "controls: non-private SGD / DP-SGD at PDP's lr (σ=18) / untrained",
                 "paper": "not reported in the paper",
                 "ours": (f"{_pm(c['non_private_sgd']['eval_accuracy'])} / {_pm(c['dp_sgd_at_pdp_lr_sigma18']['eval_accuracy'])}"
                          f" (PDP − it {100 * c['pdp - dp_sgd_at_pdp_lr_sigma18']['mean']:+.1f} ± "
                          f"{100 * c['pdp - dp_sgd_at_pdp_lr_sigma18']['se']:.1f}) / {_pm(c['untrained_eval_accuracy'])}"),
                 "reproduced": "—"})
    for r in rows:
        r["scale"] = at
    return rows


def markdown(rows: list[dict[str, str]]) -> str:
    lines = ["| claim | paper | ours (mean ± s.e. of seed-paired difference; accuracies mean ± std, %) | reproduced? |",
             "|---|---|---|---|"]
    lines += [f"| {r['claim']} | {r['paper']} | {r['ours']} | {r['reproduced']} |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- figures
def figures(rows: list[dict[str, Any]], agg: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gradspec.plot import plot_metric_vs_epsilon, plot_retrain_curves

    written = []
    main = [r for r in rows if r["group"] == "main"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, ("train_accuracy", "eval_accuracy"), strict=True):
        plot_metric_vs_epsilon(main, metric=metric, ax=ax)
        ax.set_title(f"{metric.replace('_', ' ')} vs ε (digits CNN, Table 3 step sizes)")
    fig.savefig(out / "accuracy_vs_epsilon.png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    written.append("accuracy_vs_epsilon.png")

    dyn = [r for r in main if r["sigma"] == SWEEP_SIGMA and r["seed"] == min(x["seed"] for x in main)]
    if dyn:
        fig = plot_retrain_curves(dyn, metric="eval_accuracy")
        fig.axes[0].set_title(f"test accuracy along training, σ={SWEEP_SIGMA:g} (Fig. 4 analogue, one seed)")
        fig.savefig(out / "dynamics_sigma18.png", dpi=90, bbox_inches="tight")
        plt.close(fig)
        written.append("dynamics_sigma18.png")

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    dp = agg["dp_sgd_sigma18"]["eval_accuracy"]
    for ax, key in zip(axes, ("k", "m", "s"), strict=True):
        entries = agg[f"sweep_{key}"]
        if entries:
            xs = [e[key] for e in entries]
            ax.errorbar(xs, [e["eval_accuracy"]["mean"] for e in entries],
                        yerr=[e["eval_accuracy"]["std"] for e in entries], marker="o", label="PDP-SGD")
            ax.axhline(dp["mean"], color="black", linestyle="--", label="DP-SGD")
        ax.set_xlabel(key)
        ax.set_ylabel("test accuracy")
        ax.set_title(f"sweep over {key}, σ={SWEEP_SIGMA:g}")
        ax.legend(frameon=False)
    fig.savefig(out / "sweeps.png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    written.append("sweeps.png")

    diag = agg["diagnostics"]
    if diag:
        steps = [d["step"] for d in diag["per_step"]]
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
        for d in (diag["per_step"][0], diag["per_step"][-1]):
            angles = d["angles_public_deg_mean"]
            axes[0].plot(range(1, len(angles) + 1), angles, marker=".", label=f"public, step {d['step']}")
        axes[0].axhline(90, color="grey", linestyle=":", label="random k-subspace (≈ 90°)")
        axes[0].set_title("principal angles (deg), public vs private top-k")
        axes[0].set_ylim(0, 95)
        for key, label in (("energy_private_topk", "private top-k (optimum)"), ("energy_public", "public top-k"),
                           ("energy_random", "random k"), ("mean_grad_kept_public", "mean grad kept, public")):
            axes[1].plot(steps, [d[key]["mean"] for d in diag["per_step"]], marker="o", label=label)
        axes[1].set_title("private gradient energy in the subspace")
        for key, label in (("eigengap_private_relative", "private (λ_k − λ_k+1)/λ_1"),
                           ("eigengap_public_relative", "public (λ_k − λ_k+1)/λ_1")):
            axes[2].plot(steps, [d[key]["mean"] for d in diag["per_step"]], marker="o", label=label)
        axes[2].set_yscale("log")
        axes[2].set_title("relative eigengap at k")
        axes[0].set_xlabel("index i of θ_i")
        for ax in axes[1:]:
            ax.set_xlabel("step")
        for ax in axes:
            ax.legend(frameon=False, fontsize=7)
        fig.savefig(out / "subspace_diagnostics.png", dpi=90, bbox_inches="tight")
        plt.close(fig)
        written.append("subspace_diagnostics.png")
    return written


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
