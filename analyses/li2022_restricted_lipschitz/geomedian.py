"""Li et al. 2022, §4.1 and Figure 1: DP-SGD on the generalised geometric median as d grows.

Claim (Fig. 1 and its caption): with epsilon = 2, delta = 1e-6, n = 10^4, the excess
empirical (1a) and population (1b) losses of DP-SGD grow with the dimension d when the
restricted Lipschitz coefficients are constant (A_const) and stay almost constant when they
decay (A_sqrt, A_linear). The coefficients are ``G_k = lambda_{k+1}(A^{1/2})``
(§4.1), i.e. ``G_k = 1`` (A_const), ``(k+1)^{-1/4}`` (A_sqrt) and ``(k+1)^{-1/2}``
(A_linear). (Theorem 3.3's dimension-free rate (2) needs ``G_k <= G_0 k^{-c}`` with
c > 1/2: neither A_sqrt (c = 1/4) nor A_linear (c = 1/2) meets it strictly; bound (1) grows
like ~ d^{1/4} for A_sqrt and polylogarithmically for A_linear.)

What runs (the paper's Algorithm 1 as written, `gradspec.optim.dp_sgd_averaged`):
one uniformly drawn example per step, the ridge term ``alpha (x - x0)`` and the averaged
iterate, G = G_0 = 1 (every per-example gradient has norm <= lambda_1(A^{1/2}) = 1, so the
clipping at G never binds). Privacy: `gradspec.privacy.calibrate_uniform_sampling` gives the
sigma with replace-one (2, 1e-6)-DP for T steps of one uniformly sampled example out of n
(sensitivity 2G; proof in `gradspec.privacy._uniform`). Data: `gradspec.tasks.geomedian`
(Appendix A: first 10 coordinates N(1, 1), the rest 0).

Measured, for each A, d in {10, 100, 1000, 10000}, each seed, epsilon = 2 and the
non-private control (sigma = 0):
* (a) excess empirical loss F(x_bar; D) - min_x F(x; D). The minimiser is exact up to
  float64: it is zero beyond the first d_min coordinates (any non-zero there increases every
  term), and in those it is the fixed point of Weiszfeld's iteration
  x = sum_i w_i x_i / sum_i w_i, w_i = 1 / ||x - x_i||_A (A cancels from the stationarity
  condition), iterated until the gradient norm is below 1e-10.
* (b) excess population loss E_z ||x_bar - z||_A - min_x E_z ||x - z||_A. The population
  minimiser is x* = (1, ..., 1, 0, ..., 0) exactly: the law of z is symmetric about x*
  (z - x* -> -(z - x*)), so F_P(x* + y) = F_P(x* - y) and, F_P being convex, x* is a
  minimiser. The difference is estimated on ``n_pop`` fresh points (a draw independent of the
  training data) as the mean of the paired differences ||x_bar - z||_A - ||x* - z||_A, with
  its standard error.

Step size and alpha: one grid for every A, d and privacy level; for each (A, d, privacy) the
pair with the smallest excess empirical loss on a *validation draw* (an independent training
set, seed ``--val-seed``, and its own DP-SGD randomness) is used for the reported seeds.
(Non-private control: the lr grid with alpha = 0.)

Scale: T = ``--steps`` steps (default 3n = 3 * 10^4: three passes in expectation), not the
theory's T = Theta(n^2 + d log^2 d) = 10^8, which the paper's experiment does not state it
used: at d = 10^4 one step of the 54-configuration validation grid costs ~8 ms of CPU, and the
shared 2-core machine gave this job about a quarter of a core (load average ~20), so the full
run (T = 3n) took 22 minutes. With more compute, raise ``--steps``: the excess loss at
small d is partly optimisation error at this T (see the README).

``--ablation`` runs the attribution study of the issue instead: the old script's settings
(n = 1000, delta = n^-1.1, batch 100, 50 steps, lr 0.5, last iterate, no alpha) with one
departure changed at a time, and the paper's settings with one departure changed back at a
time, at d in {10, 1000} (writes ablation.json / ablation.md).

Usage:
    python -m analyses.li2022_restricted_lipschitz.geomedian [--quick] [--ablation] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch

from analyses._common import log_to_stderr
from analyses.li2022_restricted_lipschitz.geomedian_report import SPECTRA, render

logger = logging.getLogger("li2022.geomedian")

DEFAULT_OUT = "runs/analyses/li2022_restricted_lipschitz/fig1"
LR_GRID = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
ALPHA_GRID = (0.0, 1e-2, 1e-1)


# ----------------------------------------------------------------------------- problem
def draw_points(*, seed: int, d: int, n: int, d_min: int) -> torch.Tensor:
    """The training points of `gradspec.tasks.geomedian` (float32, (n, d))."""
    from gradspec.tasks import make_task

    task = make_task("geomedian", seed=seed, d=d, spectrum="const", d_min=d_min, n_train=n,
                     n_eval=1, n_public=0)
    return task.train.tensors["points"]


def a_rows(spectra: list[str], d: int) -> torch.Tensor:
    from gradspec.tasks import A_DIAGONALS

    return torch.stack([A_DIAGONALS[s](d) for s in spectra])


def make_grad_fn(points: torch.Tensor, a: torch.Tensor, eps: float):
    """Per-example gradients A (x - x_i) / sqrt(||x - x_i||_A^2 + eps^2) (the task's loss),
    rows of ``a`` per configuration; returns (m, B, d) for x (m, d)."""

    def grad_fn(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        diff = x[:, None, :] - points[idx].to(torch.float64)[None]  # (m, B, d)
        a_diff = a[:, None, :] * diff
        s = torch.linalg.vecdot(a_diff, diff).add_(eps * eps).sqrt_()  # (m, B)
        return a_diff.div_(s[..., None])

    return grad_fn


def losses(x: torch.Tensor, a: torch.Tensor, head: torch.Tensor, eps: float) -> torch.Tensor:
    """mean_i sqrt(||x - p_i||_A^2 + eps^2) per row of x, for points p_i that are zero beyond
    the first ``head.shape[1]`` coordinates (so the cost is O(n d_min + d), not O(n d)).
    Returns (m, n) per-point values."""
    k = head.shape[1]
    tail = (a[:, k:] * x[:, k:].square()).sum(1)  # (m,)
    diff = x[:, None, :k] - head[None]  # (m, n, k)
    q = (a[:, None, :k] * diff.square()).sum(-1) + tail[:, None]
    return (q + eps * eps).sqrt()


def empirical_minimiser(head: torch.Tensor, a_head: torch.Tensor, eps: float, tol: float = 1e-10):
    """Weiszfeld's iteration for argmin mean_i sqrt(||x - p_i||_A^2 + eps^2) (float64, (k,))."""
    x = head.mean(0)
    grad_norm = math.inf
    for _ in range(10_000):
        diff = x - head
        s = ((a_head * diff.square()).sum(1) + eps * eps).sqrt()
        grad = (a_head * diff / s[:, None]).mean(0)
        grad_norm = float(grad.norm())
        if grad_norm < tol:
            break
        w = 1.0 / s
        x = (w[:, None] * head).sum(0) / w.sum()
    if grad_norm >= tol:
        raise RuntimeError(f"Weiszfeld did not converge (gradient norm {grad_norm:.2e})")
    return x, grad_norm


# ----------------------------------------------------------------------------- one batched run
def run_cell(
    *, d: int, seed: int, n: int, d_min: int, steps: int, batch_size: int, configs: list[dict],
    pop_head: torch.Tensor | None, eps: float = 1e-6, progress: bool = False,
) -> list[dict]:
    """Run DP-SGD (Alg. 1) for every config (spectrum, sigma, lr, alpha) on one training draw;
    return the excess losses of the averaged and the last iterates."""
    from gradspec.optim import dp_sgd_averaged

    points = draw_points(seed=seed, d=d, n=n, d_min=d_min)
    if d > d_min and bool(points[:, d_min:].any()):
        raise RuntimeError("geomedian points are not zero beyond d_min; the structured loss would be wrong")
    head = points[:, :d_min].to(torch.float64)
    spectra = [c["spectrum"] for c in configs]
    a = a_rows(spectra, d)
    t0 = time.perf_counter()
    result = dp_sgd_averaged(
        grad_fn=make_grad_fn(points, a, eps), x0=torch.zeros(d), n=n, steps=steps,
        lr=torch.tensor([c["lr"] for c in configs], dtype=torch.float64),
        alpha=torch.tensor([c["alpha"] for c in configs], dtype=torch.float64),
        noise_multiplier=torch.tensor([c["sigma"] for c in configs], dtype=torch.float64), clip=1.0,
        batch_size=batch_size, seed=10_000 + seed, progress=progress,
    )
    seconds = time.perf_counter() - t0
    minima = {}
    for s in set(spectra):
        a_head = a_rows([s], d_min)[0]
        x_hat, gnorm = empirical_minimiser(head, a_head, eps)
        minima[s] = (float(losses(x_hat[None], a_head[None], head, eps).mean()), gnorm)
    x_star = torch.ones(1, d_min, dtype=torch.float64)
    out = []
    for which, x in (("avg", result.average), ("last", result.last)):
        emp = losses(x, a, head, eps).mean(1)
        # population: paired differences on the fresh sample, in chunks of configurations
        for i, c in enumerate(configs):
            row = out[i] if which == "last" else {**c, "d": d, "seed": seed, "seconds": seconds / len(configs)}
            row[f"excess_emp_{which}"] = float(emp[i]) - minima[c["spectrum"]][0]
            if pop_head is not None:  # (validation runs need only the empirical loss)
                a_i = a[i : i + 1]
                diff = (losses(x[i : i + 1], a_i, pop_head, eps)
                        - losses(x_star, a_i[:, :d_min], pop_head, eps))[0]
                row[f"excess_pop_{which}"] = float(diff.mean())
                row[f"excess_pop_{which}_se"] = float(diff.std() / math.sqrt(diff.numel()))
            row["weiszfeld_grad_norm"] = minima[c["spectrum"]][1]
            if which == "avg":
                out.append(row)
    logger.info("d=%d seed=%d: %d configs, %d steps, %.0f s", d, seed, len(configs), steps, seconds)
    return out


def population_head(*, seed: int, n_pop: int, d_min: int) -> torch.Tensor:
    """n_pop fresh points (first d_min coordinates; the rest are 0) from the task's distribution."""
    from gradspec.tasks import make_task

    task = make_task("geomedian", seed=seed, d=d_min, spectrum="const", d_min=d_min, n_train=1,
                     n_eval=n_pop, n_public=0)
    return task.eval.tensors["points"].to(torch.float64)


def grid_configs(sigma: float, *, non_private: bool = True) -> list[dict]:
    cfgs = [{"spectrum": s, "private": True, "sigma": sigma, "lr": lr, "alpha": al}
            for s in SPECTRA for lr in LR_GRID for al in ALPHA_GRID]
    if non_private:
        cfgs += [{"spectrum": s, "private": False, "sigma": 0.0, "lr": lr, "alpha": 0.0}
                 for s in SPECTRA for lr in LR_GRID]
    return cfgs


def choose(rows: list[dict]) -> dict[tuple, dict]:
    """Per (spectrum, private, d): the grid point with the least validation excess empirical loss."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["spectrum"], r["private"], r["d"])
        if key not in best or r["excess_emp_avg"] < best[key]["excess_emp_avg"]:
            best[key] = r
    return best


# ----------------------------------------------------------------------------- main modes
def main_experiment(args, cfg: dict, out: Path) -> dict:
    from gradspec.privacy import calibrate_uniform_sampling

    sigma = calibrate_uniform_sampling(target_epsilon=cfg["epsilon"], n=cfg["n"], batch_size=cfg["batch_size"],
                                       steps=cfg["steps"], delta=cfg["delta"])
    cfg["sigma"] = sigma
    logger.info("sigma = %.4f for replace-one (%g, %g)-DP, n=%d, T=%d", sigma, cfg["epsilon"], cfg["delta"],
                cfg["n"], cfg["steps"])
    pop = population_head(seed=cfg["pop_seed"], n_pop=cfg["n_pop"], d_min=cfg["d_min"])
    common = dict(n=cfg["n"], d_min=cfg["d_min"], steps=cfg["steps"], batch_size=cfg["batch_size"],
                  pop_head=pop, progress=args.verbose)
    validation, rows = [], []
    for d in cfg["dims"]:  # each d in full (validation, then the seeds), smallest first
        # The non-private runs are exactly the same at every d (beyond d_min the gradient
        # a_k x_k / s, the ridge and the noise are all 0, so x_k stays 0): their grid is run
        # once, at the smallest d, and its choice used for every d.
        first = d == cfg["dims"][0]
        validation += run_cell(d=d, seed=cfg["val_seed"], configs=grid_configs(sigma, non_private=first),
                               **{**common, "pop_head": None})
        chosen = choose(validation)
        configs = [{k: best[k] for k in ("spectrum", "private", "sigma", "lr", "alpha")}
                   for (s, p, dd), best in sorted(chosen.items()) if dd == d or (not p and dd == cfg["dims"][0])]
        for seed in cfg["seeds"]:
            rows += run_cell(d=d, seed=seed, configs=configs, **common)
        (out / "partial.json").write_text(json.dumps({"config": cfg, "validation": validation, "runs": rows},
                                                     default=float))
    return render({"config": cfg, "validation": validation, "runs": rows}, out)


def ablation(args, cfg: dict, out: Path) -> dict:
    """The old script's settings, then one departure at a time (averaged iterate, delta, n,
    tuned lr, Algorithm 1's batch of one with T = n, alpha), at dims ``cfg['ab_dims']``."""
    from gradspec.privacy import calibrate_uniform_sampling

    old = {"n": 1000, "delta": 1000 ** -1.1, "batch_size": 100, "steps": 50, "lr": 0.5, "alpha": 0.0}
    paper = {"n": cfg["n"], "delta": cfg["delta"], "batch_size": 1, "steps": cfg["steps"], "lr": "tuned",
             "alpha": "tuned"}
    n_old = old["n"]
    forward = {  # from the old script's settings, one change at a time
        "old script's settings": {},
        "old + delta=1e-6": {"delta": 1e-6},
        f"old + n={cfg['n']} (5 epochs)": {"n": cfg["n"], "steps": 50 * cfg["n"] // n_old},
        "old + lr tuned": {"lr": "tuned"},
        "old + alpha tuned": {"alpha": "tuned"},
        "old + B=1, T=2n (lr tuned)": {"batch_size": 1, "steps": 2 * n_old, "lr": "tuned"},
    }
    backward = {  # from the paper's settings, one change back at a time
        "paper's settings (Alg. 1)": {},
        "paper, alpha=0": {"alpha": 0.0},
        "paper, delta=n^-1.1": {"delta": float(cfg["n"]) ** -1.1},
        f"paper, n={n_old} (T=2n)": {"n": n_old, "steps": 2 * n_old},
        "paper, B=100, 5 epochs (as old; lr tuned)": {"batch_size": 100, "steps": 5 * cfg["n"] // 100},
    }
    variants = {**{k: {**old, **v} for k, v in forward.items()}, **{k: {**paper, **v} for k, v in backward.items()}}
    results = []
    for name, v in variants.items():
        sigma = calibrate_uniform_sampling(target_epsilon=cfg["epsilon"], n=v["n"], batch_size=v["batch_size"],
                                           steps=v["steps"], delta=v["delta"])
        common = dict(n=v["n"], d_min=cfg["d_min"], steps=v["steps"], batch_size=v["batch_size"],
                      pop_head=None)  # the attribution is of the empirical excess loss
        for d in cfg["ab_dims"]:
            lrs = LR_GRID + (0.1, 0.3, 1.0) if v["lr"] == "tuned" else (v["lr"],)
            alphas = ALPHA_GRID if v["alpha"] == "tuned" else (v["alpha"],)
            if len(lrs) * len(alphas) > 1:
                grid = [{"spectrum": s, "private": True, "sigma": sigma, "lr": lr, "alpha": al}
                        for s in SPECTRA for lr in lrs for al in alphas]
                best = choose(run_cell(d=d, seed=cfg["val_seed"], configs=grid, **{**common, "pop_head": None}))
                configs = [{k: b[k] for k in ("spectrum", "private", "sigma", "lr", "alpha")}
                           for b in best.values()]
            else:
                configs = [{"spectrum": s, "private": True, "sigma": sigma, "lr": lrs[0], "alpha": alphas[0]}
                           for s in SPECTRA]
            for seed in cfg["seeds"]:
                for r in run_cell(d=d, seed=seed, configs=configs, **common):
                    results.append({**r, "variant": name, "n": v["n"], "delta": v["delta"],
                                    "batch_size": v["batch_size"], "steps": v["steps"]})
        logger.info("ablation %s done (sigma %.3f)", name, sigma)
    d_lo, d_hi = cfg["ab_dims"][0], cfg["ab_dims"][-1]
    lines = ["| variant | sigma | " + " | ".join(f"A_{s}: growth d={d_lo}->{d_hi}, last / avg (avg: lo -> hi)"
                                                for s in SPECTRA)
             + " |", "|---|---|" + "---|" * len(SPECTRA)]
    summary = {}
    for name in variants:
        rs = [r for r in results if r["variant"] == name]
        cells = []
        for s in SPECTRA:
            g = {}
            for which in ("last", "avg"):
                lo = np.mean([r[f"excess_emp_{which}"] for r in rs if r["spectrum"] == s and r["d"] == d_lo])
                hi = np.mean([r[f"excess_emp_{which}"] for r in rs if r["spectrum"] == s and r["d"] == d_hi])
                g[which] = {"d_lo": float(lo), "d_hi": float(hi), "growth": float(hi / lo)}
            summary.setdefault(name, {})[s] = g
            cells.append(f"x{g['last']['growth']:.1f} / x{g['avg']['growth']:.1f} "
                         f"({g['avg']['d_lo']:.4f} -> {g['avg']['d_hi']:.4f})")
        lines.append(f"| {name} | {rs[0]['sigma']:.3f} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + (f"\nexcess empirical loss, mean over seeds {cfg['seeds']}; growth = mean at "
                               f"d={d_hi} / mean at d={d_lo}; lr/alpha 'tuned' = chosen on the validation draw.")
    return {"runs": results, "summary": summary, "table_markdown": text}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke test: d in {10, 100}, n = 1000, T = 1000")
    ap.add_argument("--ablation", action="store_true",
                    help="run the old-script attribution study instead (writes ablation.json, ablation.md)")
    ap.add_argument("--dims", type=int, nargs="+", default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--val-seed", type=int, default=100)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=None, help="T (default 3n; --quick: n)")
    ap.add_argument("--n-pop", type=int, default=1_000_000)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--from-results", default=None,
                    help="re-render the tables and figure of a saved results.json (or partial.json) into --out")
    args = ap.parse_args(argv)
    log_to_stderr(quiet=())
    torch.set_num_threads(1)
    if len(args.seeds) < 3:
        raise SystemExit("give at least 3 seeds (--seeds): the table reports mean ± std")
    if args.quick:
        dims, n, steps, n_pop = args.dims or [10, 100], 1000, args.steps or 1000, 100_000
        ab_dims = [10, 100]
    else:
        dims, n, steps, n_pop = args.dims or [10, 100, 1000, 10_000], args.n, args.steps or 3 * args.n, args.n_pop
        ab_dims = [10, 1000]
    cfg = {"dims": dims, "n": n, "steps": steps, "batch_size": 1, "epsilon": args.epsilon, "delta": args.delta,
           "d_min": 10, "n_pop": n_pop, "seeds": args.seeds, "val_seed": args.val_seed, "pop_seed": 999_999,
           "lr_grid": list(LR_GRID), "alpha_grid": list(ALPHA_GRID), "ab_dims": ab_dims, "quick": args.quick,
           "accounting": "replace-one, uniform sampling without replacement (gradspec.privacy.uniform_sampling_epsilon)",
           "machine": f"{platform.node()}, torch threads 1, shared 2-core machine"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from gradspec.train import package_versions

    t0 = time.perf_counter()
    if args.from_results:
        saved = json.loads(Path(args.from_results).read_text())
        results = render({k: saved[k] for k in ("config", "validation", "runs")}, out)
        results["versions"] = saved.get("versions") or package_versions()
        results["seconds"] = saved.get("seconds")
        (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
        (out / "table.md").write_text(results["table_markdown"] + "\n")
        print(results["table_markdown"])
        return
    if args.ablation:
        results = {"versions": package_versions(), "config": cfg, **ablation(args, cfg, out)}
        stem = "ablation"
        print("Attribution (old script -> paper, one change at a time):")
    else:
        results = {"versions": package_versions(), **main_experiment(args, cfg, out)}
        stem = "results"
    print(results["table_markdown"])
    results["seconds"] = time.perf_counter() - t0
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=float))
    (out / f"{'table' if stem == 'results' else stem}.md").write_text(results["table_markdown"] + "\n")
    print(f"wrote {out / (stem + '.json')} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
