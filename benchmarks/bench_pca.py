"""Benchmark of `gradspec pca` against its peers on one gradient store (issue 3, §9).

Every method runs in its own subprocess (peak RSS = that process's ru_maxrss),
on the same store, and is timed end to end *including reading H from the store*
(peers read it into RAM first; gradspec streams it) and, for gradspec, writing V.
Accuracy is against an independent exact reference (numpy: float64 Gram of the
stored float32 H accumulated in column chunks, then eigh): σ relative error
(max over the top k) and the largest principal angle between top-k left
subspaces U. The floor is measured in the same run: one read of the store
(read bandwidth) and float64 GEMM throughput; floor = max(2 reads, (2r²p +
2rpk) flops / GEMM rate), and each time is reported as a multiple of it.

    python benchmarks/bench_pca.py --quick              # r=500, p=200k, k=100 (~minutes)
    python benchmarks/bench_pca.py                      # r=2000, p=1e6, k=500 (8 GB store)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PEERS = ["sklearn", "torch_lowrank", "scipy_svds", "dask_compressed", "paper_orthogonal"]
OURS = ["gram", "gram_f32", "krylov", "orthogonal"]


# ---------------------------------------------------------------- data
def make_store(path: Path, r: int, p: int, latent: int, seed: int = 0) -> None:
    """H = A·G + noise: `latent` directions with σ ∝ i^-0.6 (Li et al.'s decay) and a 1% noise floor."""
    from gradspec.store import META_FIELDS, GradientStore, ParamLayout

    rng = np.random.default_rng(seed)
    layout = ParamLayout.from_shapes(
        [("encoder.weight", (p // 2,)), ("head.weight", (p - p // 2,))]
    )
    store = GradientStore.create(path, layout=layout, overwrite=True)
    s = np.arange(1, latent + 1) ** -0.6
    a = (np.linalg.qr(rng.standard_normal((r, latent)))[0] * s * np.sqrt(r)).astype(np.float32)
    g = rng.standard_normal((latent, p), dtype=np.float32) / np.sqrt(np.float32(p))
    for i in range(0, r, 32):
        b = min(32, r - i)
        rows = a[i : i + b] @ g + 0.01 * rng.standard_normal((b, p), dtype=np.float32) / np.sqrt(
            np.float32(p)
        )
        store.write_rows(i, rows, {f: np.arange(i, i + b) for f in META_FIELDS})
        store.commit(i + b)
    store.set_status("complete")


def exact_reference(path: Path, k: int) -> tuple[np.ndarray, np.ndarray]:
    from gradspec.store import GradientStore

    store = GradientStore.open(path)
    g = np.zeros((store.n_rows, store.n_rows))
    for _, blk in store.iter_col_blocks():
        for j in range(0, blk.shape[1], 4096):
            x = blk[:, j : j + 4096].astype(np.float64)
            g += x @ x.T
    lam, u = np.linalg.eigh(g)
    return np.sqrt(np.maximum(lam[::-1][:k], 0)), u[:, ::-1][:, :k]


# ---------------------------------------------------------------- the floor
def measure_floor(path: Path, r: int, p: int, k: int) -> dict[str, float]:
    from gradspec.store import GradientStore

    store = GradientStore.open(path)
    t0 = time.perf_counter()
    nbytes = sum(blk.nbytes for _, blk in store.iter_col_blocks(prefetch=2))
    t_read = time.perf_counter() - t0
    a = np.random.default_rng(0).standard_normal((r, 4096))
    a @ a.T
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 2.0:
        a @ a.T
        n += 1
    gemm64 = n * 2 * r * r * 4096 / (time.perf_counter() - t0)
    a32 = a.astype(np.float32)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 2.0:
        a32 @ a32.T
        n += 1
    gemm32 = n * 2 * r * r * 4096 / (time.perf_counter() - t0)
    flops = 2 * r * r * p + 2 * r * p * k
    return {
        "read_s": t_read,
        "read_GBps": nbytes / t_read / 1e9,
        "gemm64_GFLOPs": gemm64 / 1e9,
        "gemm32_GFLOPs": gemm32 / 1e9,
        "flops": flops,
        "floor_s": max(2 * t_read, flops / gemm64),
        "floor32_s": max(2 * t_read, flops / gemm32),
    }


# ---------------------------------------------------------------- one method (child process)
def run_child(method: str, path: Path, k: int, work: Path) -> dict:
    # Imports are not timed (the same heavy set for every method).
    import dask.array  # noqa: F401
    import scipy.sparse.linalg  # noqa: F401
    import sklearn.utils.extmath  # noqa: F401
    import torch  # noqa: F401

    import gradspec.linalg  # noqa: F401
    import gradspec.store  # noqa: F401

    t0 = time.perf_counter()
    if method in OURS:
        from gradspec.linalg import pca

        kw = {
            "gram": dict(method="gram"),
            "gram_f32": dict(method="gram", precision="float32"),
            "krylov": dict(method="krylov", iters=4),
            "orthogonal": dict(method="orthogonal", iters=10),
        }[method]
        res = pca(
            source=path, k=k, out=work / f"spec_{method}.zarr", overwrite=True, memory="3G", **kw
        )
        sigma, u, extra = (
            res.sigma,
            res.U,
            {"passes": res.passes, "max_residual": res.accuracy()["max_residual"]},
        )
    else:
        from gradspec.store import GradientStore

        h = GradientStore.open(path).read()
        extra = {}
        if method == "sklearn":
            from sklearn.utils.extmath import randomized_svd

            u, sigma, _ = randomized_svd(h, k, n_oversamples=10, random_state=0)
            extra["n_iter"] = "auto"
        elif method == "torch_lowrank":
            import torch

            u, sigma, _ = torch.svd_lowrank(torch.from_numpy(h), q=k + 10, niter=4)
            u, sigma = u[:, :k].numpy(), sigma[:k].numpy()
            extra["niter"] = 4
        elif method == "scipy_svds":
            from scipy.sparse.linalg import svds

            u, sigma, _ = svds(h, k=k, random_state=0)
            order = np.argsort(sigma)[::-1]
            u, sigma = u[:, order], sigma[order]
        elif method == "dask_compressed":
            import dask
            import dask.array as da

            x = GradientStore.open(path).to_dask()
            del h
            uu, ss, _ = da.linalg.svd_compressed(x, k=k, n_power_iter=4, seed=0, compute=False)
            with dask.config.set(scheduler="threads"):
                u, sigma = dask.compute(uu, ss)
            extra["n_power_iter"] = 4
        elif method == "paper_orthogonal":
            sigma, u = paper_orthogonal_iteration(h, k, iters=10)
        else:
            raise ValueError(method)
    wall = time.perf_counter() - t0
    np.savez(
        work / f"res_{method}.npz",
        sigma=np.asarray(sigma, dtype=np.float64),
        u=np.asarray(u, dtype=np.float64),
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"method": method, "wall_s": wall, "peak_rss_GB": rss / 1e9, **extra}


def paper_orthogonal_iteration(
    h: np.ndarray, k: int, iters: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Li et al. 2022 App. B as published: all of H in RAM (torch), Q (p×k) ← GS(HᵀH·Q), 10 iterations,
    orthonormalised column by column with (modified) Gram–Schmidt; eigenvalues = diag(QᵀHᵀHQ)."""
    import torch

    ht = torch.from_numpy(h)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(h.shape[1], k, generator=gen)
    for _ in range(iters):
        w = ht.T @ (ht @ q)
        for j in range(k):  # column-wise Gram–Schmidt
            col = w[:, j]
            if j:
                col = col - q[:, :j] @ (q[:, :j].T @ col)
            q[:, j] = col / col.norm()
    hq = (ht @ q).double()
    sigma = hq.norm(dim=0)
    order = torch.argsort(sigma, descending=True)
    sigma, hq = sigma[order], hq[:, order]
    return sigma.numpy(), (hq / sigma).numpy()


# ---------------------------------------------------------------- the table
def max_angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    qa, _ = np.linalg.qr(a)
    qb, _ = np.linalg.qr(b)
    s = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1, 1))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="r=500, p=200,000, k=100")
    ap.add_argument("--r", type=int, default=2000)
    ap.add_argument("--p", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=500)
    ap.add_argument(
        "--latent", type=int, default=None, help="latent directions of the synthetic H (default 2k)"
    )
    ap.add_argument("--workdir", type=Path, default=Path("bench_pca_work"))
    ap.add_argument("--methods", default=",".join(OURS + PEERS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args()
    if args.quick:
        args.r, args.p, args.k = 500, 200_000, 100
    work = args.workdir
    store = work / f"grads_{args.r}x{args.p}.zarr"
    if args.child:
        print(json.dumps(run_child(args.child, store, args.k, work)))
        return
    work.mkdir(parents=True, exist_ok=True)
    if not (store / "zarr.json").exists():
        t0 = time.perf_counter()
        make_store(store, args.r, args.p, args.latent or min(args.r, 2 * args.k))
        print(f"# wrote {store} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    sig_ref, u_ref = exact_reference(store, args.k)
    floor = measure_floor(store, args.r, args.p, args.k)
    rows = []
    for m in args.methods.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            m,
            "--r",
            str(args.r),
            "--p",
            str(args.p),
            "--k",
            str(args.k),
            "--workdir",
            str(work),
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
        )
        if proc.returncode:
            rows.append({"method": m, "error": proc.stderr.strip().splitlines()[-1][:80]})
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        res = np.load(work / f"res_{m}.npz")
        row["sigma_rel_err"] = float(np.max(np.abs(res["sigma"][: args.k] - sig_ref) / sig_ref))
        row["max_angle_deg"] = max_angle_deg(res["u"][:, : args.k], u_ref)
        row["x_floor"] = row["wall_s"] / floor["floor_s"]
        rows.append(row)
        print(f"# {m}: {row['wall_s']:.1f}s", file=sys.stderr)
    print(
        f"\nH: r={args.r} p={args.p} k={args.k} float32 store ({args.r * args.p * 4 / 1e9:.2f} GB)"
    )
    print(
        f"floor: read {floor['read_GBps']:.2f} GB/s ({floor['read_s']:.2f}s/pass), GEMM float64 "
        f"{floor['gemm64_GFLOPs']:.0f} GFLOP/s, float32 {floor['gemm32_GFLOPs']:.0f} GFLOP/s -> "
        f"floor {floor['floor_s']:.1f}s (float32 floor {floor['floor32_s']:.1f}s)"
    )
    print(
        f"{'method':18} {'wall s':>8} {'x floor':>8} {'peak RSS GB':>12} {'sigma rel err':>14} {'max angle deg':>14}"
    )
    for row in rows:
        if "error" in row:
            print(f"{row['method']:18} failed: {row['error']}")
            continue
        print(
            f"{row['method']:18} {row['wall_s']:8.1f} {row['x_floor']:8.2f} {row['peak_rss_GB']:12.2f} "
            f"{row['sigma_rel_err']:14.2e} {row['max_angle_deg']:14.3g}"
        )
    if args.json:
        args.json.write_text(json.dumps({"floor": floor, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
