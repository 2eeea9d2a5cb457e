"""`gradspec replay` on MiniLM q/v (issue 37 §4): the replayed directions against the exact V.

One seeded DP-SGD run of the text task (MiniLM, the attention query/value weights, p = 1,769,472)
collected twice, per-step rows: exact, and sketched (``--sketch M``). pca of both (every
direction, k = r). One replay of the sketched run with K = r accumulates A = Hᵀ·U_K for every K
at once (its columns are Hᵀ·u_j); the directions a replay with the first K sketched directions
gives (Rayleigh–Ritz on span(Hᵀ·U_K), see ``gradspec.train._replay``) are computed from A here,
and compared with the exact top-k V by principal angles. Also: the replay's wall time against the
sketched collection's (same machine, one after the other), and how many rows replayed bit for bit.

    OMP_NUM_THREADS=1 python benchmarks/bench_replay.py --steps 128 --out /tmp/bench_replay
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sketch", type=int, default=2**14)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_replay"))
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from gradspec.collect import collect
    from gradspec.linalg import pca
    from gradspec.spectrum import principal_angles
    from gradspec.store import GradientStore, SpectrumStore
    from gradspec.train import TrainConfig, replay

    shutil.rmtree(a.out, ignore_errors=True)
    a.out.mkdir(parents=True)
    base = dict(task="text", steps=a.steps, batch_size=a.batch_size, sampling="shuffle", noise_multiplier=1.0,
                eval_every=0, seed=0)
    times = {}
    for name, extra in (("exact", {}), ("sketch", {"sketch": a.sketch})):
        t0 = time.perf_counter()
        collect(TrainConfig(**base, **extra), out=a.out / name)
        times[f"collect_{name}"] = time.perf_counter() - t0
    r = a.steps
    for name in ("exact", "sketch"):
        pca(source=str(a.out / name / "gradients.zarr"), k=r, out=a.out / f"spec_{name}", progress=False)
    t0 = time.perf_counter()
    res = replay(a.out / "sketch" / "gradients.zarr", a.out / "spec_sketch", out=a.out / "v", keep_raw=True)
    times["replay"] = time.perf_counter() - t0
    exact = SpectrumStore.open(a.out / "spec_exact")
    sk = SpectrumStore.open(a.out / "spec_sketch")
    k = a.k
    v_exact = exact.read_v()[:, :k].astype(np.float64)
    s_exact = exact.sigma
    A = res.raw * sk.sigma  # Hᵀ·U_K, every K
    rows = []
    for K in sorted({k, 2 * k, 4 * k, r} & set(range(k, r + 1))):
        g = A[:, :K].T @ A[:, :K]
        lam, w = np.linalg.eigh(g)
        lam, w = lam[::-1], w[:, ::-1]
        v = A[:, :K] @ (w[:, :k] / np.sqrt(lam[:k]))
        ang = principal_angles(v, v_exact)
        # direction by direction: |<v_i, v_exact_i>| (the ordered directions, not only the span)
        cos = np.abs(np.sum(v / np.linalg.norm(v, axis=0) * v_exact, axis=0))
        rows.append({"K": K, "max_angle_deg": float(np.degrees(ang.max())), "sin_max": float(np.sin(ang.max())),
                     "median_angle_deg": float(np.degrees(np.median(ang))),
                     "min_cos_per_direction": float(cos.min()),
                     "sigma_rel_err_max": float(np.max(np.abs(np.sqrt(lam[:k]) / s_exact[:k] - 1)))})
    # the sketched spectrum's own sigma error, and the raw formula's span (the V, K = k)
    raw_k = res.raw[:, :k]
    sketch_sigma_err = float(np.max(np.abs(sk.sigma[:k] / s_exact[:k] - 1)))
    out = {
        "task": "text (MiniLM, attention query/value weights)", "p": int(GradientStore.open(
            a.out / "exact" / "gradients.zarr").p), "r": r, "M": int(GradientStore.open(
            a.out / "sketch" / "gradients.zarr").p), "k": k,
        "rows_checked": res.rows_checked, "rows_bit_exact": res.rows_exact,
        "max_relative_difference": res.max_relative_difference,
        "sketch_sigma_rel_err_max_topk": sketch_sigma_err,
        "issue_formula_K_eq_k_max_angle_deg": float(np.degrees(principal_angles(raw_k, v_exact).max())),
        "ritz": rows, "seconds": {key: round(v, 1) for key, v in times.items()},
        "replay_over_collect": times["replay"] / times["collect_sketch"],
        "threads": a.threads,
    }
    print(json.dumps(out, indent=2))
    (a.out / "result.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
