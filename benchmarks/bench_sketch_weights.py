"""Accuracy of the sketch plan's column split against a dense Gaussian sketch (issue 37 §1).

On the real per-example gradients of `bench_sketch_calibration`'s three small models (r = 400
clipped rows each, scikit-learn's 8x8 digits), per M and seed: the RMS relative error of
sigma_1..10 of the plan's sketched rows (``--version``: 2, what ghost clipping computes per
example, the default without ``--per-step``; 3, sign-masked, what per-step rows get) (no bias correction, all J blocks pooled) with
the columns split

* ``sqrt-size``: by sqrt(numel) (no data seen; ``--sketch-weights sqrt-size``);
* ``energy``: by `gradspec.sketch.energy_weights` of the first 32 rows' per-parameter energies
  (what ``collect --sketch`` does with its warm-up batch; ``--sketch-weights energy``);
* ``oracle``: by the energies of all r rows, no prior (the split the warm-up estimates);

beside a dense Gaussian sketch of the same rows and width ((U S) Z, the law of H P^T). Prints
one line per model and M with each error and its ratio to the dense sketch's.

``--per-step``: the rows are instead 200 per-step rows, each the mean of 32 of the clipped rows
drawn at random (seeded), and ``energy`` splits by the first of them
(`gradspec.sketch.row_energies`): what ``GradientRecorder(sketch=M)`` does with the first row
it records (and ``collect --sketch`` with its warm-up batch's mean clipped gradient).

Usage:
    python benchmarks/bench_sketch_weights.py [--models mixed,mlp,cnn] [--M 1024,4096,16384]
        [--seeds 6] [--cache DIR] [--per-step] [--version 2|3|4]
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

from gradspec.sketch import energy_weights, make_plan, row_energies, sketch_rows  # noqa: E402


def top_sigma(y: torch.Tensor) -> np.ndarray:
    return np.sqrt(np.maximum(np.linalg.eigvalsh((y @ y.T).numpy())[::-1], 0))


def rms(s_hat: np.ndarray, s: np.ndarray, k: int = 10) -> float:
    return float(np.sqrt(np.mean(((s_hat[:k] - s[:k]) / s[:k]) ** 2)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mixed,mlp,cnn")
    ap.add_argument("--M", default="1024,4096,16384")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=32, help="rows whose energies split the columns")
    ap.add_argument("--cache", type=Path, default=None, help="keep each model's rows here (.npy)")
    ap.add_argument("--per-step", action="store_true",
                    help="200 per-step rows (means of --warmup random clipped rows); energy: the first row's")
    ap.add_argument("--version", type=int, choices=(2, 3, 4), default=None,
                    help="the plan's rules (default: what collect ships for the row kind: 4 per step, 2 per example)")
    args = ap.parse_args(argv)
    version = args.version or (4 if args.per_step else 2)
    torch.set_num_threads(1)
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        layout, kinds, h = model_rows(name, 400, args.cache)
        if args.per_step:
            gen = torch.Generator().manual_seed(0)
            h = h[torch.stack([torch.randperm(h.shape[0], generator=gen)[: args.warmup] for _ in range(200)])].mean(1)
            measured = row_energies(layout, h[0])
        else:
            measured = energies(layout, h[: args.warmup])
        s = np.linalg.svd(h.numpy(), compute_uv=False)
        u, sv, _ = torch.linalg.svd(h, full_matrices=False)
        us = u * sv
        splits = {"sqrt-size": None, "energy": energy_weights(layout, measured),
                  "oracle": energy_weights(layout, energies(layout, h), prior=0.0)}
        for m in (int(x) for x in args.M.split(",")):
            err = {}
            for label, w in splits.items():
                err[label] = np.mean([rms(top_sigma(sketch_rows(make_plan(layout, kinds, m, seed=seed, weights=w,
                                                                                 version=version), h)), s)
                                      for seed in range(args.seeds)])
            dense = []
            for seed in range(args.seeds):
                gen = torch.Generator().manual_seed(10_000 + seed)
                z = torch.randn(us.shape[1], m, generator=gen, dtype=torch.float64) / math.sqrt(m)
                dense.append(rms(top_sigma(us @ z), s))
            d = float(np.mean(dense))
            cells = "  ".join(f"{k} {v * 100:.2f}% ({v / d:.2f}x)" for k, v in err.items())
            kind = f"{'per-step' if args.per_step else 'per-example'} rows, plan version {version}"
            print(f"{name:6s} M = {m:6,d}  {cells}  dense {d * 100:.2f}%   ({args.seeds} seeds, {kind})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
