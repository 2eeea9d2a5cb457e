"""Calibration of the sketched spectrum's stated error, and its accuracy against M (issue 37).

Real per-example gradients of small real models on real data (scikit-learn's 8x8 digits):
``mixed`` (Conv2d + GroupNorm + Embedding of pixel intensities + LayerNorm + transformers'
Conv1D + Linear + a 4-class head), ``mlp`` (10 classes) and ``cnn`` (10 classes), each trained
150 SGD steps, then the clipped per-example gradients of r examples computed once (torch.func).
Each seeded case applies a sketch plan (``make_plan``, the ghost rules' kinds) to those rows
with the float64 reference ``sketch_rows`` — what ``collect --sketch M`` stores, without
retraining — and states the error from its J block Grams (``jackknife_error``, what ``pca``
reports for a version-2 store). Beside it, a dense Gaussian sketch of the same width and J
(drawn as (U S) Z, Z r x M Gaussian: the same law as H P^T for Gaussian P).

Prints, per model / M / r: RMS relative error of sigma_1..10 (version-1 plan, version-2 plan,
dense), coverage of the top-k intervals (k = min(100, r/4)), and the median half-width over
the RMS actual error; writes a markdown table and a PNG of error against M.

Usage:
    python benchmarks/bench_sketch_calibration.py [--seeds 12] [--M 1024,4096,16384]
        [--r 400,200] [--out docs/sketch_calibration.md] [--png docs/sketch_calibration.png]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mixed,mlp,cnn")
    ap.add_argument("--M", default="1024,4096,16384")
    ap.add_argument("--r", default="400,200")
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--png", type=Path, default=None)
    args = ap.parse_args(argv)
    from gradspec.linalg._sketch_jackknife import jackknife_error
    from gradspec.sketch import make_plan, sketch_rows

    J = args.blocks
    lines = ["| model | M | r | k | rel. error σ1..10: v1 plan | v2 plan | dense | v2/dense | coverage v2 | "
             "coverage dense | median half-width / RMS error v2 | dense | angle bounds < 1 where sin < 0.5 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    curve: dict[str, dict[str, list[tuple[int, float]]]] = {}
    t_all = time.time()
    for name in args.models.split(","):
        model, names, h_all, _ = rows(name, r=max(int(v) for v in args.r.split(",")))
        layout, kinds = kinds_layout(model)
        for r in (int(v) for v in args.r.split(",")):
            h = h_all[:r]
            s = torch.linalg.svdvals(h).numpy()
            u, sv, _ = torch.linalg.svd(h, full_matrices=False)
            us = u * sv
            k = min(100, r // 4)
            for m in (int(v) for v in args.M.split(",")):
                err = {"v1": [], "v2": [], "dense": []}
                stats = {"v2": [], "dense": []}
                ang = [0, 0]
                for seed in range(args.seeds):
                    p1 = make_plan(layout, kinds, m, seed=seed, blocks=J, version=1)
                    err["v1"].append(rms_top(torch.linalg.svdvals(sketch_rows(p1, h)).numpy(), s))
                    p2 = make_plan(layout, kinds, m, seed=seed, blocks=J)
                    y2 = sketch_rows(p2, h)
                    gen = torch.Generator().manual_seed(10_000 + seed)
                    width = (p2.M // J) * J
                    yd = us @ (torch.randn(us.shape[1], width, generator=gen, dtype=torch.float64) / math.sqrt(width))
                    for kind, y, exact in (("v2", y2, p2.exact_width), ("dense", yd, 0)):
                        grams, ex = blocks_of(y, exact, J)
                        rep = jackknife_error(grams, ex, k=k, angle_ks=(1, 10))
                        sig = np.asarray(rep["sigma"])
                        err[kind].append(rms_top(sig, s))
                        lo = np.asarray(rep["sigma_lower"])
                        up = np.asarray([np.inf if x is None else x for x in rep["sigma_upper"]])
                        stats[kind].append((sig, lo, up))
                        if kind == "v2":
                            uw = np.linalg.eigh(sum(grams) + (0 if ex is None else ex))[1][:, ::-1]
                            for a in rep["angles"]:
                                q = a["k"]
                                true = float(np.linalg.norm(uw[:, :q] - u[:, :q].numpy() @ (u[:, :q].numpy().T @ uw[:, :q]), 2))
                                if true < 0.5:
                                    ang[0] += 1
                                    ang[1] += int(a["bound"] < 1 and a["bound"] >= true)
                res = {}
                for kind in ("v2", "dense"):
                    sig = np.stack([x[0] for x in stats[kind]])
                    lo = np.stack([x[1] for x in stats[kind]])
                    up = np.stack([x[2] for x in stats[kind]])
                    truth = s[:k][None]
                    cover = float(np.mean((lo <= truth) & (truth <= up)))
                    rms_err = np.sqrt(np.mean((sig - truth) ** 2, axis=0))
                    half = (up - lo) / 2
                    ratio = float(np.median(np.median(half, axis=0) / rms_err))
                    res[kind] = (cover, ratio)
                e = {kk: float(np.sqrt(np.mean(np.square(v)))) for kk, v in err.items()}
                for kk, v in e.items():
                    curve.setdefault(name, {}).setdefault(kk, []).append((m, v)) if r == 400 else None
                lines.append(f"| {name} | {m:,} | {r} | {k} | {e['v1']:.2%} | {e['v2']:.2%} | {e['dense']:.2%} | "
                             f"{e['v2'] / e['dense']:.2f} | {res['v2'][0]:.1%} | {res['dense'][0]:.1%} | "
                             f"{res['v2'][1]:.2f} | {res['dense'][1]:.2f} | {ang[1]}/{ang[0]} |")
                print(lines[-1], flush=True)
    lines.append("")
    lines.append(f"{args.seeds} seeds per row, J = {J}; {time.time() - t_all:.0f} s in all.")
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text + "\n")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for (name, kinds_), color in zip(curve.items(), ["C0", "C1", "C2", "C3"], strict=False):
            for kind, style in (("v1", ":"), ("v2", "-"), ("dense", "--")):
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
