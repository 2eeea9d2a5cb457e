"""Feasibility: a subsampled randomized Hadamard transform (SRHT) in place of the Kronecker kinds (issue 37 §1),
beside the sign-masked pairs of plan version 3.

The SRHT is not a sketch gradspec makes. The version-2 plan sketches a large layer by independent Kronecker
pairs P_0 G P_1^T, which ghost clipping computes from captured layer inputs and output gradients
without forming G. When a layer's per-example gradient has low rank (an MLP's is rank one, a
transformer's at most its token count) a pair's relative variance is ~(2 m0 + 2 m1 + 4)/m against
a dense Gaussian's 2/m: this is why the plan stays 2.4-3.4x a dense sketch's error on the mlp, on
MiniLM q/v and on whole MiniLM (docs/sketch_calibration.md). An SRHT of the *formed* gradient,
sqrt(N/m) S H D vec(G) / sqrt(N) (D random signs, H the Walsh-Hadamard transform of the length
N = 2^ceil(log2 numel) padding, S m coordinates sampled without replacement), mixes every
coordinate first, whatever G's rank.

On the real clipped per-example rows of `bench_sketch_calibration`'s three models (r = 400), per M
and seed: the plan `collect --sketch` ships (energy split by the first 32 rows), and the same plan
with each Kronecker / CountSketch-Kronecker parameter's J blocks replaced by J independent SRHTs of
the same width (exact and dense parameters as planned, independent Gaussian draws), and the
version-3 plan (the same columns and pairs, each Kronecker-kind gradient sign-masked first) and
the version-4 plan (its columns mixed by a block-diagonal Haar rotation before the mask), beside a dense Gaussian sketch of the plan's width. Prints the RMS relative error of sigma_1..10 and its ratio to
the dense sketch's.

Usage:
    python benchmarks/bench_sketch_srht.py --cache DIR [--models mlp,cnn,mixed] [--M 1024,4096,16384] [--seeds 6]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_sketch_calibration import energies, model_rows  # noqa: E402
from bench_sketch_weights import rms, top_sigma  # noqa: E402

from gradspec.sketch import energy_weights, make_plan, sketch_rows  # noqa: E402


def fwht(x: torch.Tensor) -> torch.Tensor:
    """The unnormalised Walsh-Hadamard transform along the last dimension (a power of two)."""
    n, h, lead = x.shape[-1], 1, x.shape[:-1]
    while h < n:
        x = x.reshape(*lead, n // (2 * h), 2, h)
        x = torch.stack((x[..., 0, :] + x[..., 1, :], x[..., 0, :] - x[..., 1, :]), dim=-2)
        h *= 2
    return x.reshape(*lead, n)


def srht(rows: torch.Tensor, m: int, gen: torch.Generator) -> torch.Tensor:
    """r x n rows -> r x m: sqrt(N/m) S H D x / sqrt(N) (E ||.||^2 = ||x||^2)."""
    r, n = rows.shape
    big = 1 << max(0, (n - 1).bit_length())
    signs = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64) * 2 - 1
    x = torch.zeros(r, big, dtype=torch.float64)
    x[:, :n] = rows * signs
    keep = torch.randperm(big, generator=gen)[:m]
    return fwht(x)[:, keep] * math.sqrt(big / m) / math.sqrt(big)


def with_srht(plan, h: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + seed)
    parts = []
    for ps in plan.params:
        x = h[:, ps.offset : ps.offset + ps.numel]
        if ps.kind == "exact":
            parts.append(x)
            continue
        for _ in range(plan.n_blocks):  # J independent blocks, each scaled by 1/sqrt(J)
            if ps.kind == "dense":
                z = torch.randn(ps.numel, ps.width, generator=gen, dtype=torch.float64) / math.sqrt(ps.width)
                parts.append(x @ z / math.sqrt(plan.n_blocks))
            else:
                parts.append(srht(x, ps.width, gen) / math.sqrt(plan.n_blocks))
    return torch.cat(parts, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,cnn,mixed")
    ap.add_argument("--M", default="1024,4096,16384")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--cache", type=Path, default=None, help="keep each model's rows here (.npy)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.models.split(","):
        layout, kinds, h = model_rows(name, 400, args.cache)
        s = np.linalg.svd(h.numpy(), compute_uv=False)
        u, sv, _ = torch.linalg.svd(h, full_matrices=False)
        us = u * sv
        w = energy_weights(layout, energies(layout, h[:32]))
        for m in (int(x) for x in args.M.split(",")):
            kron, had, dense, signed, mixed = [], [], [], [], []
            for seed in range(args.seeds):
                plan = make_plan(layout, kinds, m, seed=seed, weights=w, version=2)
                kron.append(rms(top_sigma(sketch_rows(plan, h)), s))
                signed.append(rms(top_sigma(sketch_rows(make_plan(layout, kinds, m, seed=seed, weights=w, version=3), h)), s))
                mixed.append(rms(top_sigma(sketch_rows(make_plan(layout, kinds, m, seed=seed, weights=w, version=4), h)), s))
                had.append(rms(top_sigma(with_srht(plan, h, seed)), s))
                gen = torch.Generator().manual_seed(10_000 + seed)
                z = torch.randn(us.shape[1], plan.M, generator=gen, dtype=torch.float64) / math.sqrt(plan.M)
                dense.append(rms(top_sigma(us @ z), s))
            structured = sum(p.kind in ("kronecker", "countsketch-kronecker") for p in plan.params)
            d = float(np.mean(dense))
            k_, s_, g_, x_ = float(np.mean(kron)), float(np.mean(had)), float(np.mean(signed)), float(np.mean(mixed))
            print(f"{name:6s} M = {m:6,d} ({structured} parameters by Kronecker kinds)  plan {k_ * 100:.2f}% "
                  f"({k_ / d:.2f}x)  SRHT in their place {s_ * 100:.2f}% ({s_ / d:.2f}x)  sign-masked pairs "
                  f"(version 3) {g_ * 100:.2f}% ({g_ / d:.2f}x)  mixed, then masked (version 4) {x_ * 100:.2f}% "
                  f"({x_ / d:.2f}x)  dense {d * 100:.2f}%   ({args.seeds} seeds)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
