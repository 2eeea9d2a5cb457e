"""The PDP-SGD reproduction's statistics: per-setting mean ± std over seeds, seed-paired
differences, the step size each method would pick, and the subspace diagnostics per step
(`run.py` trains the grid, `report.py` turns these numbers into the table and figures)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from analyses._common import seed_stats
from analyses.zhou2021_pdp_sgd.config import K_PDP, M_PUBLIC, PAPER_EPS, SWEEP_SIGMA, Scale


def stats(values: list[float]) -> dict[str, float]:
    """Mean, std over seeds (0 for one seed) and n: the shape of every summary in results.json."""
    s = seed_stats(values, single=0.0)
    return {"mean": s["mean"], "std": s["std"], "n": s["n"]}


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
        per_step.append({"step": step, **{k: stats([r[k] for r in recs if r.get(k) is not None])
                                          for k in DIAG_KEYS},
                         "angles_public_deg_mean": [float(a) for a in angles]})
    return {"k": runs[0][0]["k"], "public_size": runs[0][0]["public_size"],
            "private_size": runs[0][0]["private_size"], "seeds": len(runs), "per_step": per_step}


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
    st = stats(diffs)
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
            "eval_accuracy": stats([r["eval_accuracy"] for r in groups[best]]), "rows": groups[best]}


def aggregate(rows: list[dict[str, Any]], scale: Scale, seeds: list[int], untrained_acc: list[float]) -> dict[str, Any]:
    grid = []
    for sigma in scale.sigmas:
        entry: dict[str, Any] = {"sigma": sigma, "paper_epsilon": PAPER_EPS[sigma]}
        groups = {m: _group(rows, group="main", method=m, sigma=sigma) for m in ("dp-sgd", "pdp-sgd", "rpdp-sgd")}
        entry["epsilon"] = float(np.mean([r["epsilon"] for r in groups["dp-sgd"]]))
        for m, g in groups.items():
            entry[m] = {metric: stats([r[metric] for r in g]) for metric in ("train_accuracy", "eval_accuracy")}
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
                        "eval_accuracy": stats([r["eval_accuracy"] for r in g]),
                        "train_accuracy": stats([r["train_accuracy"] for r in g])})
        return out

    dp18 = _group(rows, group="main", method="dp-sgd", sigma=SWEEP_SIGMA)
    pdp18 = _group(rows, group="main", method="pdp-sgd", sigma=SWEEP_SIGMA)
    lr_ctrl = _group(rows, group="control", method="dp-sgd")
    nonpriv = _group(rows, group="control", method="sgd")
    controls = {
        "non_private_sgd": {m: stats([r[m] for r in nonpriv]) for m in ("train_accuracy", "eval_accuracy")},
        "dp_sgd_at_pdp_lr_sigma18": {m: stats([r[m] for r in lr_ctrl]) for m in ("train_accuracy", "eval_accuracy")},
        "pdp - dp_sgd_at_pdp_lr_sigma18": paired(pdp18, lr_ctrl, "eval_accuracy"),
        "untrained_eval_accuracy": stats(untrained_acc),
    }
    diag = [r["diagnostics"] for r in pdp18 if r.get("diagnostics")]
    diagnostics = summarize_diagnostics(diag)
    return {"grid": grid, "sweep_k": sweep("sweep_k", "k", scale.ks, K_PDP),
            "sweep_m": sweep("sweep_m", "m", scale.ms, M_PUBLIC), "sweep_s": sweep("sweep_s", "s", scale.ss, 1),
            "dp_sgd_sigma18": {m: stats([r[m] for r in dp18]) for m in ("train_accuracy", "eval_accuracy")},
            "controls": controls, "diagnostics": diagnostics}

