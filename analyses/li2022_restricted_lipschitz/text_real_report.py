"""The report of Fig. 2a/2b on real text (``text_real.py``): the claims table with the
paper's numbers beside ours, paired differences per seed, per-seed accuracies, the figure."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from analyses._common import json_safe
from analyses.li2022_restricted_lipschitz.text_report import (
    _retrain_rows,
    paired_differences,
    per_seed_markdown,
    plot_fig2b,
    summarize_retrain,
    table_markdown,
)
from analyses.li2022_restricted_lipschitz.text_scale import PAPER, Scale, final_eval, versions


def acc_text(arms: dict[str, Any], key: str) -> str:
    a = (arms.get(key) or {}).get("accuracy") or {"n": 0}
    if not a["n"]:
        return "not run"
    std = "" if a["std"] is None else f" ± {a['std']:.3f}"
    return f"{a['mean']:.3f}{std} (n = {a['n']})"


def two_standard_errors(entry: dict[str, Any]) -> float | None:
    """Twice the standard error of a paired difference's mean over seeds; None below 2 seeds."""
    if entry["n"] < 2 or entry["std"] is None:
        return None
    return 2 * entry["std"] / math.sqrt(entry["n"])


def paired_text(entry: dict[str, Any] | None) -> tuple[str, str]:
    """'+0.012 (2 s.e. 0.020, n = 3)' and a verdict for a paired (other − top-k) difference."""
    if not entry or not entry["n"]:
        return "not run", "pending"
    if entry["n"] < 2:
        return f"{entry['mean']:+.3f} (one seed)", "pending (1 seed)"
    two_se = two_standard_errors(entry)
    verdict = "yes" if entry["mean"] <= two_se else "**no**"
    return f"{entry['mean']:+.3f} (2 s.e. {two_se:.3f}, n = {entry['n']})", verdict


def gain_share(arms: dict[str, Any], key: str) -> float | None:
    """(arm − untrained) / (DP-SGD − untrained) of the means: the share of DP-SGD's gain over
    the untrained model that the arm recovers; None when an arm is missing or DP-SGD gained nothing."""
    mean = {k: ((arms.get(k) or {}).get("accuracy") or {}).get("mean") for k in (key, "dpsgd", "untrained")}
    if any(v is None for v in mean.values()) or mean["dpsgd"] <= mean["untrained"]:
        return None
    return (mean[key] - mean["untrained"]) / (mean["dpsgd"] - mean["untrained"])


def _gain(arms: dict[str, Any], key: str) -> str:
    """'; 89% of DP-SGD's gain over the untrained model', or '' (see :func:`gain_share`)."""
    share = gain_share(arms, key)
    return "" if share is None else f"; {share:.0%} of DP-SGD's gain over the untrained model"


def claims(results: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    fig2a = results.get("fig2a") or {}
    if fig2a:
        h, a = fig2a["fit_top_half"], fig2a["fit_all"]
        law = "a power law" if h["r2"] >= 0.95 else "**not** a clean power law"
        c_ok = f"{law}; exponent {'within' if abs(h['c'] - 0.6) <= 0.1 else '**not** within'} 0.1 of 0.6"
        rows.append(["Fig. 2a: σ_k decays like a power law", "≈ k^-0.6",
                     f"k^-{h['c']:.2f} (95% CI {h['ci'][0]:.3f}–{h['ci'][1]:.3f}, R² {h['r2']:.3f}, ranks "
                     f"1–{h['k_range'][1]} of {fig2a['r']}); all ranks k^-{a['c']:.2f}",
                     c_ok])
        e = fig2a["energy_top_k"]
        rows.append(["a few directions carry the gradients", "qualitative",
                     "share of ‖H‖_F²: " + ", ".join(f"top-{k} {v:.2f}" for k, v in e.items()), "consistent"])
    rt = results.get("retrain") or {}
    arms, paired = rt.get("arms", {}), rt.get("paired", {})
    ranks = results["scale"]["ranks"]
    for k in ranks:
        key = f"topk-k{k}"
        if key not in arms:
            continue
        d, verdict = paired_text(paired.get(key, {}).get("dpsgd"))
        rows.append([f"Fig. 2b: top-{k} retraining ≈ full DP-SGD (3 epochs)",
                     "k = 100 ≈ original accuracy" if k == 100 else "close to full for k ≥ 100",
                     f"top-{k} {acc_text(arms, key)}; random-{k} {acc_text(arms, f'random-k{k}')}; "
                     f"paired full − top-{k} {d}{_gain(arms, key)}", verdict])
    for k in ranks:
        key = f"complement-k{k}"
        if key not in arms:
            continue
        d, _ = paired_text(paired.get(f"topk-k{k}", {}).get(key))
        rows.append([f"control: training in the complement of the top-{k} subspace",
                     "Song, Ahn & Yun 2025 (Hessian subspace): complement ≈ SGD, subspace stalls",
                     f"complement-{k} {acc_text(arms, key)}; paired complement − top-{k} {d}{_gain(arms, key)}",
                     "see README: what it means"])
    rows.append(["baselines", "DP-SGD ≈ 90%, non-private 92% (SST-2, n ≈ 67k)",
                 f"full DP-SGD {acc_text(arms, 'dpsgd')}; non-private {acc_text(arms, 'nonprivate')}; "
                 f"untrained {acc_text(arms, 'untrained')}", "—"])
    return rows


def build_report(scale: Scale, out: Path, seeds: list[int]) -> dict[str, Any]:
    """``results.json``, ``table.md``, ``per_seed.md`` and the Fig. 2b figure."""
    from gradspec.store import GradientStore

    runs = _retrain_rows(out)
    store = out / "collect" / "gradients.zarr"
    cfg = out / "collect" / "config.json"
    read = (lambda p: json.loads(p.read_text()) if p.is_file() else None)  # noqa: E731
    results = {
        "paper": PAPER, "dataset": scale.name, "scale": json_safe(dataclasses.asdict(scale)), "seeds": seeds,
        "collect": {"config": read(cfg), "committed_rows": GradientStore.open(store).n_rows if store.exists() else 0,
                    **final_eval(out / "collect")},
        "pca": read(out / "pca.json"), "fig2a": read(out / "fig2a.json"),
        "retrain": {"arms": summarize_retrain(runs), "paired": paired_differences(runs), "runs": runs,
                    "note": "top-k subspace from the private data's own noise-free gradients: a "
                            "diagnostic, not a DP guarantee (dp_guarantee false), as the paper's Fig. 2b"},
        "versions": versions(),
    }
    rows = claims(results)
    results["table"] = rows
    budget = f"{scale.retrain_steps} steps of batch {scale.retrain_batch}, {scale.name}"
    plot_fig2b(results["retrain"], budget, out / "figures", "fig2b_retrain_3epochs")
    (out / "results.json").write_text(json.dumps(json_safe(results), indent=2))
    md = table_markdown(rows)
    (out / "table.md").write_text(md + "\n")
    seed_md = per_seed_markdown(results["retrain"], f"Held-out accuracy per seed, {budget} "
                                "(untrained: one model, shown under every seed)")
    (out / "per_seed.md").write_text(seed_md + "\n")
    print(md)
    print(seed_md)
    return results
