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
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from analyses.li2022_restricted_lipschitz.text_report import (  # noqa: F401 - the report's API, used by the tests
    MAIN_GROUPS,
    _arm,
    paired_differences,
    report,
    summarize_retrain,
)
from analyses.li2022_restricted_lipschitz.text_scale import (  # noqa: F401
    FULL,
    PAPER,
    QUICK,
    Scale,
    _final_eval,
    _jsonable,
    _versions,
    mean_std,
)

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
                checkpoint_every=10_000, seed=0, task_seed=0, backend="ghost")
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
    path.write_text(json.dumps(_jsonable(row), indent=2))
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
            cfg = retrain_config(scale, target_epsilon=None, noise_multiplier=0.0, clip=False, backend="vmap")
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
    info_path.write_text(json.dumps(_jsonable(info), indent=2))
    return info


# --------------------------------------------------------------------------- App. B and Fig. 2a
def _fit(sigma: np.ndarray, k_max: int, scale: str = "singular") -> dict[str, Any]:
    """Power-law fit of σ_k (or of σ_k² with ``scale="eigen"``: exponent 2c) over ranks 1..k_max."""
    from gradspec.spectrum import fit_spectrum

    f = fit_spectrum(sigma, k_range=(1, int(k_max)), scale=scale)
    return {"c": float(f.c), "a": float(f.a), "r2": float(f.r2), "ci": [float(x) for x in f.ci], "stderr": float(f.stderr),
            "k_range": [1, int(k_max)], "object": f}


def _angles(g_ab: np.ndarray, ua, sa, ub, sb, ks) -> dict[str, Any]:
    from gradspec.spectrum import gram_subspace_cosines

    out = {}
    for k in ks:
        if k > min(ua.shape[1], ub.shape[1]):
            continue
        cos = gram_subspace_cosines(g_ab, ua[:, :k], sa[:k], ub[:, :k], sb[:k])
        ang = np.degrees(np.arccos(cos))
        out[str(k)] = {"max_angle_deg": float(ang.max()), "median_angle_deg": float(np.median(ang)),
                       "mean_cos2": float(np.mean(cos**2))}
    return out


def run_appendix(scale: Scale, out: Path, figures: Path) -> dict[str, Any]:
    """Fig. 2a and App. B (Figs. 3–5) from H·Hᵀ; G_k and the Theorem 3.3/3.5 bounds."""
    from gradspec.linalg import GradientOperator, orthogonal_iteration
    from gradspec.plot import plot_spectrum, save_figure
    from gradspec.spectrum import gram_eigh

    g = np.load(out / "gram.npy")
    r = g.shape[0]
    sigma, u = gram_eigh(g)
    frob2 = float(np.trace(g))
    half = max(2, r // 2)
    res: dict[str, Any] = {"r": r}
    fig2a = _fit(sigma, half)
    res["fig2a"] = {"sigma": sigma, "fit_top_half": {k: v for k, v in fig2a.items() if k != "object"},
                    "fit_all": {k: v for k, v in _fit(sigma, r).items() if k != "object"},
                    "energy_top_k": {str(k): float((sigma[:k] ** 2).sum() / frob2)
                                     for k in (1, 10, 20, 100, 1000) if k <= r}}
    fig = plot_spectrum({f"H ({r} steps)": sigma}, fits={f"H ({r} steps)": fig2a["object"]},
                        title="Fig. 2a: singular values of the average clipped gradients")
    save_figure(fig, figures, "fig2a_spectrum", formats=("png",))

    # Fig. 3: orthogonal iteration after T iterations vs exact, on the factor A (A·Aᵀ = H·Hᵀ)
    kb = min(scale.appb_k, r // 4)  # the paper: top 500 of r = 4000; a block near r converges trivially
    snaps: dict[int, Any] = {}
    iters = sorted(scale.iters)

    def keep(state: Any) -> None:
        if state.iteration in iters:
            snaps[state.iteration] = (np.sqrt(np.maximum(state.theta[:kb], 0.0)), state.u[:, :kb].copy(),
                                      float(state.resid[:kb].max()))

    orthogonal_iteration(GradientOperator(u * sigma), k=kb, iters=iters[-1], oversample=10, seed=0,
                         on_iteration=keep)
    fig3 = {"k": kb, "exact_fit": {k: v for k, v in _fit(sigma[:kb], kb).items() if k != "object"}}
    spectra, fits = {"exact": sigma[:kb]}, {"exact": _fit(sigma[:kb], kb, "eigen")["object"]}
    for t in iters:
        s_t, u_t, resid = snaps[t]
        f = _fit(s_t, kb)
        fig3[f"T={t}"] = {"fit": {k: v for k, v in f.items() if k != "object"},
                          "max_rel_sigma_error": float(np.max(np.abs(s_t - sigma[:kb]) / sigma[:kb])),
                          "max_ritz_residual": resid,
                          "angles_vs_exact": _angles(g, u_t, s_t, u, sigma, scale.angle_ks)}
        spectra[f"T={t}"], fits[f"T={t}"] = s_t, _fit(s_t, kb, "eigen")["object"]
    for t_a, t_b in zip(iters[:-1], iters[1:], strict=True):
        s_a, u_a, _ = snaps[t_a]
        s_b, u_b, _ = snaps[t_b]
        fig3[f"angles_T={t_a}_vs_T={t_b}"] = _angles(g, u_a, s_a, u_b, s_b, scale.angle_ks)
    res["fig3"] = fig3
    fig = plot_spectrum(spectra, fits=fits, scale="eigen", title="Fig. 3: orthogonal iterations T vs exact")
    save_figure(fig, figures, "fig3_iterations", formats=("png",))

    # Figs. 4 and 5: row subsets, each from its principal sub-block of H·Hᵀ
    def subset(a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.arange(a, min(b, r))
        s_, u_ = gram_eigh(g[np.ix_(idx, idx)])
        return idx, s_, u_

    a0, b0 = scale.rows_small
    a1, b1 = scale.rows_late
    if b0 >= r:  # a stopped collection: keep the paper's proportions (r/2 rows first, offset r·3/13)
        b0 = r * 10 // 13
    if b1 > r:
        a1, b1 = r - (b0 - a0), r
    i_small, s_small, u_small = subset(a0, b0)
    i_late, s_late, u_late = subset(a1, b1)
    kf = min(scale.appb_k, len(i_small) // 2)
    comps = {
        "fig4": (f"rows {a0}:{b0} (r={b0 - a0})", s_small, u_small, i_small,
                 f"all rows (r={r})", sigma, u, np.arange(r)),
        "fig5": (f"rows {a0}:{b0}", s_small, u_small, i_small, f"rows {a1}:{b1}", s_late, u_late, i_late),
    }
    for name, (la, sa, ua, ia, lb, sb, ub, ib) in comps.items():
        fa, fb = _fit(sa, kf), _fit(sb, kf)
        res[name] = {"a": la, "b": lb, "k_fit": kf,
                     "fit_a": {k: v for k, v in fa.items() if k != "object"},
                     "fit_b": {k: v for k, v in fb.items() if k != "object"},
                     "angles": _angles(g[np.ix_(ia, ib)], ua, sa, ub, sb, scale.angle_ks)}
        fig = plot_spectrum({la: sa[:kf], lb: sb[:kf]},
                            fits={la: _fit(sa, kf, "eigen")["object"], lb: _fit(sb, kf, "eigen")["object"]},
                            scale="eigen", title=f"{'Fig. 4' if name == 'fig4' else 'Fig. 5'}: {la} vs {lb}")
        save_figure(fig, figures, f"{name}_rows", formats=("png",))
    return res


def run_bounds(scale: Scale, out: Path, figures: Path, p: int, n: int, delta: float) -> dict[str, Any]:
    """Ĝ_k (Definition 3.1) and Theorems 3.3/3.5 at their best k (constants 1, D = 1).

    Two measurements: ``in_sample``, the rows against the top-k subspace of all rows
    (Ĝ_r = 0: every row lies in the span of all rows, so the bound's best k is r, an
    artefact), and ``heldout``, the last quarter of the steps against the subspace of
    the first three quarters, which the bound's hypothesis (a subspace that serves
    gradients it was not computed from) is about.
    """
    from gradspec.plot import plot_lipschitz, save_figure
    from gradspec.spectrum import (
        gram_eigh,
        heldout_projections_from_gram,
        rank_grid,
        restricted_lipschitz,
        restricted_lipschitz_bound,
        row_projections_from_gram,
    )

    g = np.load(out / "gram.npy")
    r = g.shape[0]
    sigma, u = gram_eigh(g)
    r_fit = r * 3 // 4
    curves = {
        f"in sample (rows 0:{r})": restricted_lipschitz(
            row_projections_from_gram(g, rank_grid(r), sigma=sigma, u=u),
            source={"rows": f"0:{r}", "subspace": f"top-k of rows 0:{r}"}),
        f"held out (rows {r_fit}:{r} vs subspace of 0:{r_fit})": restricted_lipschitz(
            heldout_projections_from_gram(g, np.arange(r_fit), np.arange(r_fit, r), rank_grid(r_fit)),
            source={"rows": f"{r_fit}:{r}", "subspace": f"top-k of rows 0:{r_fit}"}),
    }
    res: dict[str, Any] = {"settings": {"n": n, "epsilon": scale.epsilon, "delta": delta,
                                        "diameter": 1.0, "dim": p, "tail": "hold"}}
    for (label, G), key in zip(curves.items(), ("in_sample", "heldout"), strict=True):
        entry: dict[str, Any] = {"label": label, "ks": G.ks, "G_max": G.max, "G_p50": G.quantiles.get("p50")}
        for theorem, population in (("3.3", False), ("3.5", True)):
            b = restricted_lipschitz_bound(ks=G.ks, G=G.max, n=n, epsilon=scale.epsilon, delta=delta,
                                           diameter=1.0, dim=p, population=population, tail="hold")
            entry[theorem] = {"k_star": int(b.k_star), "bound": float(b.bound),
                              "dimension_dependent": float(b.dimension_dependent),
                              "ratio_to_dimension_dependent": float(b.bound / b.dimension_dependent),
                              "hypotheses": b.hypotheses, "k": b.k, "total": b.total}
        res[key] = entry
    fig = plot_lipschitz(curves, title="Ĝ_k = max_i ‖(I − P_k) g_i‖")
    save_figure(fig, figures, "G_k", formats=("png",))
    return res


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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("gradspec.linalg.orthogonal").setLevel(logging.WARNING)  # one line per iteration
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
        (out / "appendix.json").write_text(json.dumps(_jsonable({"appendix": app, "bounds": bounds}), indent=2))
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
