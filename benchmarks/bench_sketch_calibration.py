"""Calibration of the sketched spectrum's stated error, and its accuracy against M (issue 37).

Real per-example gradients of small real models on real data (scikit-learn's 8x8 digits):
``mixed`` (Conv2d + GroupNorm + Embedding of pixel intensities + LayerNorm + transformers'
Conv1D + Linear + a 4-class head), ``mlp`` (10 classes) and ``cnn`` (10 classes), each trained
150 SGD steps, then the clipped per-example gradients of max(r) examples computed once
(torch.func). Each seeded case applies a sketch plan (``make_plan``, the ghost rules' kinds) to
those rows with the float64 reference ``sketch_rows`` — what ``collect --sketch M`` stores,
without retraining — and states the error from its J block Grams (``block_bootstrap`` then
``state``: what ``pca`` reports for a version-2 store, ``block_error``), beside the old
jackknife-t (``jackknife_error``). A smaller r takes the *last* r examples' rows, whose Gram
is a sub-block of the same sketch draw. Beside it, a dense Gaussian sketch of the same width
and J (drawn as (U S) Z, Z r x M Gaussian: the same law as H P^T for Gaussian P).

Prints, per model / M / r: RMS relative error of sigma_1..10 (version-1 plan, version-2 plan,
dense), coverage of the top-k intervals (k = min(100, r/4)), the median half-width over the
RMS actual error (per i over the row's cases, median over i), and the angle bounds; then the
pooled coverage of all, the fit seeds (< --fit-seeds, where the multipliers were chosen) and
the held-out seeds; writes a markdown table and a PNG of error against M.

With ``--cache DIR`` every model's rows, case's Grams and bootstrap summary are kept there, so
an interrupted run resumes (seeds run outermost) and ``--cached-only`` tabulates what is
cached under the module's current multipliers without computing anything.

Usage:
    python benchmarks/bench_sketch_calibration.py [--seeds 12] [--M 1024,4096,16384]
        [--r 400,200] [--weights sqrt-size|energy] [--version 2|3|4] [--cache DIR] [--cached-only] [--out table.md]
        [--png docs/sketch_calibration.png]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402


def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    return torch.as_tensor(d.images, dtype=torch.float64), torch.as_tensor(d.target)

class Mixed(nn.Module):
    """Conv2d + GroupNorm + Embedding (pixel intensities) + LayerNorm + Conv1D + Linear + 4-class head."""
    def __init__(self, width=128, hidden=256, classes=4):
        super().__init__()
        from transformers.pytorch_utils import Conv1D
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.gn = nn.GroupNorm(4, 16)
        self.emb = nn.Embedding(17, 32)
        self.ln = nn.LayerNorm(48)
        self.proj = Conv1D(width, 48)
        self.fc = nn.Linear(width, hidden)
        self.head = nn.Linear(hidden, classes)
    def forward(self, x):
        img = x.unsqueeze(1) / 16.0
        h = torch.tanh(self.gn(self.conv(img))).flatten(2).transpose(1, 2)  # (B, 64, 16)
        e = self.emb(x.long().flatten(1))  # (B, 64, 32)
        t = self.ln(torch.cat([h, e], -1))
        t = torch.tanh(self.proj(t)).mean(1)
        return self.head(torch.tanh(self.fc(t)))

class MLP(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.l1 = nn.Linear(64, 256)
        self.l2 = nn.Linear(256, 128)
        self.l3 = nn.Linear(128, classes)
    def forward(self, x):
        x = x.flatten(1) / 16.0
        return self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))

class CNN(nn.Module):  # gradspec's cnn task architecture on 8x8 digits upsampled? keep native 8x8
    def __init__(self, classes=10):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32 * 16, 64)
        self.head = nn.Linear(64, classes)
    def forward(self, x):
        h = torch.tanh(self.c1(x.unsqueeze(1) / 16.0))
        h = torch.tanh(self.c2(h))
        return self.head(torch.tanh(self.fc(h.flatten(1))))

MODELS = {"mixed": (Mixed, 4), "mlp": (MLP, 10), "cnn": (CNN, 10)}

def rows(name, r=400, steps=150, seed=0):
    cls, classes = MODELS[name]
    torch.manual_seed(seed)
    x, y = digits()
    keep = y < classes
    x, y = x[keep], y[keep]
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    x, y = x[perm], y[perm]
    model = cls().double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (64,), generator=g)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = {k: v.detach() for k, v in model.named_parameters()}
    def f(p, xi, yi):
        return nn.functional.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])
    gs = vmap(grad(f), in_dims=(None, 0, 0))(params, x[:r], y[:r])
    h = torch.cat([gs[k].reshape(r, -1) for k in params], 1)
    c = h.norm(dim=1).median()
    h = h * torch.clamp(c / h.norm(dim=1), max=1.0)[:, None]
    return model, list(params), h, (x[:r], y[:r])

def kinds_layout(model):
    from gradspec.train import GhostClipping, select_parameters
    names = select_parameters(model, ["*"])
    gh = GhostClipping(model, lambda call, b: call(b["x"]), lambda out, b: nn.functional.cross_entropy(out, b["labels"], reduction="none"), names)
    return gh.layout, gh.sketch_kinds()



def blocks_of(y: torch.Tensor, exact: int, J: int) -> tuple[list[np.ndarray], np.ndarray | None]:  # noqa: N803
    """The J block Grams and the exact columns' Gram of sketched rows y (exact columns first)."""
    width = (y.shape[1] - exact) // J
    grams = [(b @ b.T).numpy() for b in (y[:, exact + j * width : exact + (j + 1) * width] for j in range(J))]
    return grams, ((y[:, :exact] @ y[:, :exact].T).numpy() if exact else None)


def rms_top(s_hat: np.ndarray, s: np.ndarray, k: int = 10) -> float:
    return float(np.sqrt(np.mean(((s_hat[:k] - s[:k]) / s[:k]) ** 2)))


def model_rows(name: str, r: int, cache: Path | None) -> tuple[Any, Any, torch.Tensor]:
    """(layout, kinds, H) of a model: r clipped per-example rows (cached as .npy under cache)."""
    f = cache / f"rows_{name}_{r}.npy" if cache else None
    if f is not None and f.exists():
        cls, _ = MODELS[name]
        torch.manual_seed(0)
        model = cls().double()
        h = torch.from_numpy(np.load(f))
    else:
        model, _, h, _ = rows(name, r=r)
        if f is not None:
            np.save(f, h.numpy())
    layout, kinds = kinds_layout(model)
    return layout, kinds, h


def energies(layout: Any, rows: torch.Tensor) -> dict[str, float]:
    """Each parameter's mean squared clipped norm over ``rows``: what `collect --sketch`'s warm-up
    measures for per-example rows (`gradspec.train._sketching.warmup_energies`)."""
    return {p.name: float(rows[:, p.offset : p.offset + p.numel].square().sum(1).mean()) for p in layout.params}


#: Rows of the warm-up batch whose energies split an ``energy`` plan's columns (collect's batch size).
WARMUP = 32


def case_grams(name: str, layout: Any, kinds: Any, h: torch.Tensor, us: torch.Tensor, m: int, seed: int,
               J: int, cache: Path | None, weights: str = "sqrt-size", version: int = 2) -> dict[str, np.ndarray]:  # noqa: N803
    """One seeded case of all r rows: the version-2 plan's J block Grams (``grams``, J x r x r) and
    exact Gram (``exact``, r x r, zeros if none), a dense Gaussian J-block sketch's (``dense``), and
    the version-1 plan's sketched sigma (``s_v1``, all r rows). Cached as one .npz per case.
    ``weights="energy"``: the version-2 plan splits its columns by the first WARMUP rows' energies
    (`collect --sketch`'s default); the cache file names it. ``version=3`` or 4: that plan's
    sign-masked (4: column-mixed, then masked; rows given whole) rules in place of version 2's;
    named too."""
    from gradspec.sketch import energy_weights, make_plan, sketch_rows

    tag = ("" if weights == "sqrt-size" else f"_{weights}") + ("" if version == 2 else f"_v{version}")
    f = cache / f"case{tag}_{name}_{h.shape[0]}_{m}_{J}_{seed}.npz" if cache else None
    if f is not None and f.exists():
        with np.load(f) as z:
            return dict(z)
    w = energy_weights(layout, energies(layout, h[:WARMUP])) if weights == "energy" else None
    p2 = make_plan(layout, kinds, m, seed=seed, blocks=J, weights=w, version=version)
    y2 = sketch_rows(p2, h)
    grams, ex = blocks_of(y2, p2.exact_width, J)
    out = {"grams": np.stack(grams), "exact": np.zeros_like(grams[0]) if ex is None else ex, "M": np.asarray(p2.M)}
    base = cache / f"case{tag.removesuffix(f'_v{version}')}_{name}_{h.shape[0]}_{m}_{J}_{seed}.npz" if cache else None
    if version != 2 and base is not None and base.exists():  # the same columns: version 2's v1 and dense parts
        with np.load(base) as z:
            out |= {"dense": z["dense"], "y1": z["y1"]}
    else:
        y1 = sketch_rows(make_plan(layout, kinds, m, seed=seed, blocks=J, version=1), h)
        gen = torch.Generator().manual_seed(10_000 + seed)
        width = (p2.M // J) * J
        yd = us @ (torch.randn(us.shape[1], width, generator=gen, dtype=torch.float64) / math.sqrt(width))
        out |= {"dense": np.stack(blocks_of(yd, 0, J)[0]), "y1": (y1 @ y1.T).numpy()}
    if f is not None:
        tmp = f.with_suffix(".tmp.npz")
        np.savez(tmp, **out)
        tmp.rename(f)
    return out


def case_statement(kind: str, name: str, r: int, m: int, seed: int, J: int, g: dict[str, np.ndarray],  # noqa: N803
                   rows_: slice, s: np.ndarray, u: np.ndarray, k: int, replicates: int, cache: Path | None,
                   tag: str = "") -> dict:
    """The block bootstrap's summary (``block_bootstrap``) of one case's Grams (``kind``: ``v2`` the
    plan's, ``dense`` the dense sketch's), the true sines of its top-q eigenvectors and, for v2,
    the old jackknife-t intervals; cached as one .npz per case."""
    from gradspec.sketch._bootstrap import (
        _top,
        block_bootstrap,
        jackknife_error,
        principal_sines,
    )

    f = cache / f"stat_{kind}{tag}_{name}_{r}_{m}_{J}_{seed}_B{replicates}.npz" if cache else None
    if f is not None and f.exists():
        with np.load(f) as z:
            return dict(z)
    grams = [x[rows_, rows_] for x in g["grams" if kind == "v2" else "dense"]]
    exact = g["exact"][rows_, rows_] if kind == "v2" else None
    boot = block_bootstrap(grams, exact, k=k, angle_ks=(1, 10), replicates=replicates)
    total = np.sum(grams, axis=0) + (0 if exact is None else exact)
    w = _top(total, k)[1]
    out = {key: np.asarray(v) for key, v in boot.items()}
    out["true_sine"] = np.asarray([principal_sines(u[:, :q], w[:, :q]) for q in boot["qs"]])
    out["s"] = s[:k]
    out["seed"] = np.asarray(seed)
    if kind == "v2":
        jk = jackknife_error(grams, exact, k=k, angle_ks=())
        out["jk_lo"] = np.asarray(jk["sigma_lower"])
        out["jk_up"] = np.asarray([np.inf if x is None else x for x in jk["sigma_upper"]])
        out["jk_sig"] = np.asarray(jk["sigma"])
        out["s_v1"] = np.sqrt(np.maximum(np.linalg.eigvalsh(g["y1"][rows_, rows_])[::-1][:10], 0))
    if f is not None:
        tmp = f.with_suffix(".tmp.npz")
        np.savez(tmp, **out)
        tmp.rename(f)
    return out


def summarise(stats: list[dict], with_jk: bool = False, multipliers: dict[str, float] | None = None) -> dict[str, Any]:
    """Coverage, median half-width / RMS error (per i over cases, median over i), the angle
    counts and the fraction of finite intervals of one row's cases, with the module's constants
    (``multipliers``: ``state``'s multipliers, default the widest)."""
    from gradspec.sketch._bootstrap import state

    sig, lo, up, ang = [], [], [], [0, 0, 0]
    for z in stats:
        rep = state(z, **(multipliers or {}))
        sig.append(rep["sigma"])
        lo.append(rep["sigma_lower"])
        up.append([np.inf if x is None else x for x in rep["sigma_upper"]])
        for a, t in zip(rep["angles"], z["true_sine"], strict=True):
            if t < 0.5:
                ang[1] += 1
                ang[0] += int(a["bound"] < 1 and t <= a["bound"])
            ang[2] += int(t > a["bound"])
    sig, lo, up = (np.asarray(v) for v in (sig, lo, up))
    truth = stats[0]["s"][None]
    rms = np.sqrt(np.mean((sig - truth) ** 2, axis=0))
    out = {"n": len(stats), "cover": float(np.mean((lo <= truth) & (truth <= up))),
           "inside": int(np.sum((lo <= truth) & (truth <= up))), "total": int(truth.size * len(stats)),
           "ratio": float(np.median(np.median((up - lo) / 2, axis=0) / rms)),
           "finite": float(np.mean(np.isfinite(up))), "angles": ang,
           "err": float(np.sqrt(np.mean([rms_top(x, truth[0]) ** 2 for x in sig])))}
    if with_jk:
        jlo, jup = np.stack([z["jk_lo"] for z in stats]), np.stack([z["jk_up"] for z in stats])
        out["jk_cover"] = float(np.mean((jlo <= truth) & (truth <= jup)))
        out["v1_err"] = float(np.sqrt(np.mean([rms_top(z["s_v1"], truth[0]) ** 2 for z in stats])))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mixed,mlp,cnn")
    ap.add_argument("--M", default="1024,4096,16384")
    ap.add_argument("--r", default="400,200")
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--dense-seeds", type=int, default=None, help="seeds of the dense column (default: all)")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--weights", choices=("sqrt-size", "energy"), default="sqrt-size",
                    help="the version-2 plan's column split (energy: by the first 32 rows, collect's default)")
    ap.add_argument("--version", type=int, choices=(2, 3, 4), default=2,
                    help="the plan's rules: 2 (per-example rows, ghost clipping), 3 (sign-masked), 4 (mixed and masked: per-step rows)")
    ap.add_argument("--cache", type=Path, default=None, help="folder of cached rows and cases (resumable)")
    ap.add_argument("--cached-only", action="store_true", help="tabulate the cached cases only; compute none")
    ap.add_argument("--fit-seeds", type=int, default=4,
                    help="the seeds the multipliers were chosen on (the rest are reported as held out)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args(argv)
    from gradspec.sketch._bootstrap import REPLICATES, multipliers_for

    J, B = args.blocks, REPLICATES
    mult = multipliers_for(args.version)  # the plan's, as pca states it (the dense column: the same)
    tag = ("" if args.weights == "sqrt-size" else f"_{args.weights}") + ("" if args.version == 2 else f"_v{args.version}")
    dense_tag = "" if args.weights == "sqrt-size" else f"_{args.weights}"  # the same dense sketch in every version
    plan_label = f"v{args.version}"
    models = args.models.split(",")
    ms = [int(v) for v in args.M.split(",")]
    rs = [int(v) for v in args.r.split(",")]
    r_all = max(rs)
    dense_seeds = args.seeds if args.dense_seeds is None else args.dense_seeds
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    data = {}
    for name in models:
        layout, kinds, h = model_rows(name, r_all, args.cache)
        parts = {}
        u_all, s_all, _ = torch.linalg.svd(h, full_matrices=False)
        for r in rs:  # r < r_all: the last r rows (other examples), sketched by the same draw
            sl = slice(r_all - r, r_all)
            u, s, _ = torch.linalg.svd(h[sl], full_matrices=False)
            parts[r] = (sl, s.numpy(), u.numpy())
        data[name] = (layout, kinds, h, u_all * s_all, parts)

    def have(kind: str, name: str, r: int, m: int, seed: int) -> bool:
        t = tag if kind == "v2" else dense_tag
        return bool(args.cache and (args.cache / f"stat_{kind}{t}_{name}_{r}_{m}_{J}_{seed}_B{B}.npz").exists())

    stats: dict[tuple, dict[str, list]] = {}
    for seed in range(args.seeds):  # seeds outermost: an interrupted run has every row
        for name in models:
            layout, kinds, h, us, parts = data[name]
            for m in ms:
                g = None
                for r in rs:
                    sl, s, u = parts[r]
                    k = min(100, r // 4)
                    for kind in ("v2", "dense"):
                        if kind == "dense" and seed >= dense_seeds:
                            continue
                        if args.cached_only and not have(kind, name, r, m, seed):
                            continue
                        if g is None:
                            t = time.time()
                            g = case_grams(name, layout, kinds, h, us, m, seed, J, args.cache, args.weights,
                                           args.version)
                        z = case_statement(kind, name, r, m, seed, J, g, sl, s, u, k, B, args.cache,
                                           tag if kind == "v2" else dense_tag)
                        stats.setdefault((name, m, r), {}).setdefault(kind, []).append(z)
                if g is not None and not args.cached_only:
                    print(f"seed {seed} {name} M={m}: {time.time() - t:.0f} s", flush=True)

    v = plan_label
    lines = [f"| model | M | r | k | cases | rel. error σ1..10: v1 plan | {v} plan | dense | {v}/dense | "
             f"coverage {v} | coverage dense | old jackknife-t coverage | median half-width / RMS error {v} | "
             "dense | angle bounds < 1 and hold where sin < 0.5 | bounds below the true sin |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    curve: dict[str, dict[str, list[tuple[int, float]]]] = {}
    split: dict[str, list] = {"fit": [0, 0, [], 0], "held out": [0, 0, [], 0]}
    tot = {"v2": [0, 0, [0, 0, 0]], "dense": [0, 0, [0, 0, 0]]}
    for name in models:
        for r in rs:
            for m in ms:
                row = stats.get((name, m, r))
                if not row or "v2" not in row:
                    continue
                v2 = summarise(row["v2"], with_jk=True, multipliers=mult)
                dn = summarise(row["dense"], multipliers=mult) if row.get("dense") else None
                for part, sub in (("fit", [z for z in row["v2"] if z["seed"] < args.fit_seeds]),
                                  ("held out", [z for z in row["v2"] if z["seed"] >= args.fit_seeds])):
                    if sub:
                        res = summarise(sub, multipliers=mult)
                        split[part][0] += res["inside"]
                        split[part][1] += res["total"]
                        split[part][2].append(res["ratio"])
                        split[part][3] += len(sub)
                for kind, res in (("v2", v2), ("dense", dn)):
                    if res:
                        tot[kind][0] += res["inside"]
                        tot[kind][1] += res["total"]
                        tot[kind][2] = [a + b for a, b in zip(tot[kind][2], res["angles"], strict=True)]
                if r == r_all:
                    curve.setdefault(name, {}).setdefault("v1", []).append((m, v2["v1_err"]))
                    curve[name].setdefault(plan_label, []).append((m, v2["err"]))
                    if dn:
                        curve[name].setdefault("dense", []).append((m, dn["err"]))
                def d(key: str, fmt: str, dn: dict | None = dn) -> str:
                    return format(dn[key], fmt) if dn else "–"

                lines.append(
                    f"| {name} | {m:,} | {r} | {min(100, r // 4)} | {v2['n']} | {v2['v1_err']:.2%} | {v2['err']:.2%} | "
                    f"{d('err', '.2%')} | {v2['err'] / dn['err'] if dn else float('nan'):.2f} | {v2['cover']:.1%} | "
                    f"{d('cover', '.1%')} | {v2['jk_cover']:.1%} | {v2['ratio']:.2f} | {d('ratio', '.2f')} | "
                    f"{v2['angles'][0]}/{v2['angles'][1]} | {v2['angles'][2]} |")
                print(lines[-1], flush=True)
    lines.append("")
    n_v2 = sum(len(v.get("v2", [])) for v in stats.values())
    n_dn = sum(len(v.get("dense", [])) for v in stats.values())
    for kind, n in (("v2", n_v2), ("dense", n_dn)):
        inside, total, ang = tot[kind]
        if total:
            lines.append(f"All {plan_label if kind == 'v2' else kind} cases: {n} cases, {inside:,}/{total:,} σ inside ({inside / total:.1%}); angle "
                         f"bounds < 1 and holding {ang[0]}/{ang[1]} where the true sin < 0.5, {ang[2]} below the true sin.")
    for part, (inside, total, ratios, n) in split.items():
        if total:
            lines.append(f"{part.capitalize()} {plan_label} cases (seeds {'<' if part == 'fit' else '>='} {args.fit_seeds}): {n} cases, "
                         f"{inside / total:.1%} of σ inside, median over rows of the width ratio {np.median(ratios):.2f}.")
    lines.append(f"J = {J}, {B} bootstrap replicates, σ multiplier {mult['multiplier']:g}, angle multiplier {mult['angle_multiplier']:g}; {time.time() - t_all:.0f} s for this table "
                 "(cases from the cache are not recomputed).")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for (name, kinds_), color in zip(curve.items(), ["C0", "C1", "C2", "C3"], strict=False):
            for kind, style in (("v1", ":"), (plan_label, "-"), ("dense", "--")):
                if kind in kinds_:
                    pts = np.asarray(kinds_[kind])
                    ax.loglog(pts[:, 0], pts[:, 1], style, color=color, marker="o", label=f"{name} {kind}")
        ax.set_xlabel("M (stored columns)")
        ax.set_ylabel("RMS relative error of σ1..10")
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
