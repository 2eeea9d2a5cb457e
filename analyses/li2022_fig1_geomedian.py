"""Li et al. 2022, §4.1 and Figure 1: dimension-independent DP-SGD when G_k decays.

DP-SGD on the generalised geometric median f_i(x) = ||x - x_i||_A for growing dimension d
and A in {A_const, A_sqrt, A_linear}. The excess empirical loss F(x_T) - F(x*) grows with d
for A_const (constant restricted-Lipschitz coefficients) and levels off for A_sqrt and
A_linear (coefficients decaying like k^-1/2 and k^-1).

Usage:
    python analyses/li2022_fig1_geomedian.py [--dims 10 100 1000] [--n 1000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch


def full_loss(task) -> float:
    with torch.no_grad():
        batch = task.train.batch(slice(None))
        return float(task.loss(task.forward(task.model, batch), batch).mean())


def minimum(task, steps: int = 2000) -> float:
    """F(x*) by full-batch non-private gradient descent with a decaying step."""
    x = task.model.x if hasattr(task.model, "x") else next(task.model.parameters())
    saved = x.detach().clone()
    opt = torch.optim.SGD([x], lr=0.5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    batch = task.train.batch(slice(None))
    for _ in range(steps):
        opt.zero_grad()
        task.loss(task.forward(task.model, batch), batch).mean().backward()
        opt.step()
        sched.step()
    best = full_loss(task)
    with torch.no_grad():
        x.copy_(saved)
    return best


def main() -> None:
    from gradspec.collect import CollectConfig, collect
    from gradspec.tasks import make_task

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--epochs", type=float, default=5.0)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--out", default="runs/li2022-fig1")
    args = ap.parse_args()
    out = Path(args.out)
    results = []
    for spectrum in ("const", "sqrt", "linear"):
        for d in args.dims:
            task = make_task("geomedian", d=d, spectrum=spectrum, d_min=10, n_train=args.n, n_eval=10, seed=0)
            f_star = minimum(task)
            run = out / f"{spectrum}-d{d}"
            shutil.rmtree(run, ignore_errors=True)
            cfg = CollectConfig(task="geomedian", epochs=args.epochs, steps=None, batch_size=args.n // 10,
                                noise_multiplier=None, target_epsilon=args.epsilon, max_grad_norm=1.0,
                                optimizer="sgd", lr=args.lr, eval_every=0, log_every=10**6)
            res = collect(cfg, out=run, task=task, write_store=False)
            excess = full_loss(task) - f_star
            results.append({"spectrum": spectrum, "d": d, "excess_loss": excess, "epsilon": res.epsilon})
            print(f"A_{spectrum:<6} d = {d:<6} excess empirical loss {excess:.4f}  (epsilon {res.epsilon:.2f})")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5))
    ax = fig.add_subplot()
    for spectrum in ("const", "sqrt", "linear"):
        rows = [r for r in results if r["spectrum"] == spectrum]
        ax.plot([r["d"] for r in rows], [r["excess_loss"] for r in rows], marker="o", label=f"A_{spectrum}")
    ax.set_xscale("log")
    ax.set_xlabel("dimension d")
    ax.set_ylabel("excess empirical loss")
    ax.set_title(f"DP-SGD, epsilon = {args.epsilon}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "excess_loss_vs_dimension.png", dpi=150)
    print(f"wrote {out / 'results.json'} and {out / 'excess_loss_vs_dimension.png'}")


if __name__ == "__main__":
    main()
