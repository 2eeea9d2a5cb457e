"""Column mixing (plan version 4) against the sign masks alone (version 3) and a dense Gaussian sketch, on
the first r rows of a real per-example store (issue 37 §1).

A version-3 plan's sign mask keeps every column's norm, so a layer gradient whose energy sits in a few
input columns (MiniLM q/v: BERT's outlier features) stays hard for the Kronecker pairs; version 4 mixes
G's columns by a seeded block-diagonal Haar rotation first. This applies both plans (the ones
``collect --sketch`` makes for the store's parameters: kinds as `bench_sketch_spectrum.plan_kinds`,
columns by the first 32 rows' energies) with `gradspec.sketch.DenseSketch` in float32 to the first
``--rows`` rows held in memory, and compares the sketched σ with the exact σ of those rows (float64
Gram) beside a dense Gaussian sketch of the same width ((U S) Z, Z r x M): σ₁..₁₀'s RMS relative error
and the largest relative error of the top ``--top``, averaged over seeds, and the ratios to the dense
sketch. ``--rotation-block B`` sets version 4's block size for the run (the shipped one is
``gradspec.sketch.ROTATION_BLOCK``; another is an experiment, not a plan gradspec reads back).

Usage:
    python benchmarks/bench_sketch_mixing.py STORE [--rows 256] [--M 16384,65536] [--seeds 3] [--top 50]
        [--rotation-block 512] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--M", default="16384,65536")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--top", type=int, default=50)
    ap.add_argument("--rotation-block", type=int, default=None, help="version 4's block size for this run")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch
    from bench_sketch_calibration import WARMUP, energies
    from bench_sketch_spectrum import plan_kinds
    from bench_sketch_weights import rms, top_sigma

    import gradspec.sketch._factors as factors
    from gradspec.sketch import DenseSketch, energy_weights, make_plan
    from gradspec.store import GradientStore

    torch.set_num_threads(args.threads)
    if args.rotation_block:
        factors.ROTATION_BLOCK = args.rotation_block
    ex = GradientStore.open(args.store)
    kinds = plan_kinds(ex)
    r = min(args.rows, ex.n_rows)
    t0 = time.perf_counter()
    h = torch.from_numpy(np.asarray(ex.read(slice(0, r)), dtype=np.float32))
    print(f"{r} rows of p = {ex.p:,} read in {time.perf_counter() - t0:.0f} s; rotation blocks of "
          f"{factors.ROTATION_BLOCK}", flush=True)
    w = energy_weights(ex.layout, energies(ex.layout, h[:WARMUP].double()))
    hd = h.double()
    lam, u = np.linalg.eigh((hd @ hd.T).numpy())
    s_true = np.sqrt(np.maximum(lam[::-1], 0.0))
    us = u[:, ::-1] * s_true

    def errors(s: np.ndarray) -> tuple[float, float]:
        e = np.abs(s[: args.top] - s_true[: args.top]) / s_true[: args.top]
        return rms(s, s_true), float(e.max())

    print(f"{'M':>7} {'plan':>8} {'rms 1..10':>10} {'max top':>8} {'rms/dense':>10} {'max/dense':>10}", flush=True)
    for m in (int(x) for x in args.M.split(",")):
        res: dict[str, list[tuple[float, float]]] = {}
        for seed in range(args.seeds):
            for version in (3, 4):
                plan = make_plan(ex.layout, kinds, m, seed=seed, weights=w, version=version)
                sketch = DenseSketch(plan, dtype=torch.float32)
                y = torch.cat([sketch(h[a : a + 32]) for a in range(0, r, 32)])
                res.setdefault(f"v{version}", []).append(errors(top_sigma(y.double())))
            z = torch.randn(r, plan.M, generator=torch.Generator().manual_seed(20_000 + seed), dtype=torch.float64)
            g = us @ (z @ z.T).numpy() @ us.T / plan.M
            res.setdefault("dense", []).append(errors(np.sqrt(np.maximum(np.linalg.eigvalsh(g)[::-1], 0.0))))
        d = np.mean(res["dense"], axis=0)
        for name, v in res.items():
            a = np.mean(v, axis=0)
            print(f"{m:>7} {name:>8} {a[0]:>10.4f} {a[1]:>8.4f} {a[0] / d[0]:>10.2f} {a[1] / d[1]:>10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
