"""Benchmark of `gradspec pca` against its peers on one gradient store (issue 3, §9).

Everything runs in one process, one method after another, on the same Zarr
store, and is timed end to end: gradspec streams H from the store and writes
V to a spectrum store; peers read H into RAM first (through gradspec's
reader, their fastest way in) and keep their result in memory. Columns:

- wall time, and its ratio to gradspec's exact method and to the floor;
- peak memory: the highest RSS above the process's RSS when the method
  started, sampled every 10 ms by a thread (page cache not counted);
- σ relative error (max over the top k) and the largest principal angle
  between top-k left subspaces U, both against an exact reference: the
  float64 Gram of the stored float32 H (numpy/OpenBLAS, in column panels)
  and LAPACK's ``eigh`` — an implementation independent of gradspec's.

The floor is measured in the same run: this machine's read bandwidth (every
chunk file of the store read with ``readinto``, page cache warm as for every
method), float64 GEMM throughput (the better of numpy and torch on distinct
r×4096 operands, i.e. no symmetric shortcut) and one ``eigh`` of an r×r
matrix. Floor = max(2 reads, (2r²p + 2rpk) flops / GEMM rate) + eigh: the
issue's count of the exact answer (gradspec's symmetric Gram update does
half of the 2r²p).

Peers that run past ``--cap`` seconds (checked between their Python-level
steps) are stopped, and any method whose process RSS passes ``--mem-limit``
of the RAM is stopped before the kernel kills the benchmark; their rows show
the time reached as a lower bound (">").

    python benchmarks/bench_pca.py --quick      # r=500, p=200k, k=100 (a few minutes)
    python benchmarks/bench_pca.py              # r=2000, p=1e6, k=500: an 8 GB store (~1 h)
    python benchmarks/bench_pca.py --device cuda --methods gram --r 4000 --p 7000000 --k 1000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

OURS = ["gram", "gram_f32", "krylov", "orthogonal"]
PEERS = ["sklearn", "torch_lowrank", "scipy_svds", "dask_compressed", "paper_orthogonal"]


# ---------------------------------------------------------------- data
def make_store(path: Path, r: int, p: int, latent: int, seed: int = 0) -> None:
    """H = A·G + noise: `latent` directions with σ ∝ i^-0.6 (Li et al.'s decay) and a 1% noise floor."""
    from gradspec.store import META_FIELDS, GradientStore, ParamLayout

    rng = np.random.default_rng(seed)
    layout = ParamLayout.from_shapes([("encoder.weight", (p // 2,)), ("head.weight", (p - p // 2,))])
    store = GradientStore.create(path, layout=layout, overwrite=True)
    s = np.arange(1, latent + 1) ** -0.6
    a = (np.linalg.qr(rng.standard_normal((r, latent)))[0] * s * np.sqrt(r)).astype(np.float32)
    g = rng.standard_normal((latent, p), dtype=np.float32) / np.sqrt(np.float32(p))
    for i in range(0, r, 32):
        b = min(32, r - i)
        noise = rng.standard_normal((b, p), dtype=np.float32) / np.sqrt(np.float32(p))
        store.write_rows(i, a[i : i + b] @ g + 0.01 * noise, {f: np.arange(i, i + b) for f in META_FIELDS})
        store.commit(i + b)
    store.set_status("complete")


def exact_reference(path: Path, k: int) -> tuple[np.ndarray, np.ndarray]:
    """σ and U of the stored H from its float64 Gram (numpy, OpenBLAS) and LAPACK eigh."""
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
def read_files(path: Path) -> tuple[int, float]:
    """Read every chunk file of the store's gradient array with readinto: (bytes, seconds)."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(path / "grads" / "c") for f in fs]
    buf = bytearray(16 * 2**20)
    view = memoryview(buf)
    total, t0 = 0, time.perf_counter()
    for name in files:
        with open(name, "rb", buffering=0) as fh:
            while n := fh.readinto(view):
                total += n
    return total, time.perf_counter() - t0


def gemm_rate(r: int, seconds: float = 2.0, device: str = "cpu") -> dict[str, float]:
    """float64 and float32 GEMM throughput on distinct r×4096 operands (best of numpy and torch;
    torch alone on a GPU)."""
    import torch

    on_gpu = device != "cpu" and torch.cuda.is_available()
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    rng = np.random.default_rng(0)
    out = {}
    for name, dt in (("gemm64", np.float64), ("gemm32", np.float32)):
        a = rng.standard_normal((r, 4096)).astype(dt)
        b = rng.standard_normal((r, 4096)).astype(dt)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        fs = [lambda ta=ta, tb=tb: ta @ tb.T]
        if on_gpu:
            ta, tb = ta.cuda(), tb.cuda()
            fs = [lambda ta=ta, tb=tb: ta @ tb.T]
        else:
            fs.append(lambda a=a, b=b: a @ b.T)
        best = 0.0
        for f in fs:
            f()
            sync()
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                f()
                sync()
                n += 1
            best = max(best, n * 2 * r * r * 4096 / (time.perf_counter() - t0))
        out[name] = best
    return out


def measure_floor(path: Path, r: int, p: int, k: int, device: str = "cpu") -> dict[str, float]:
    import scipy.linalg

    read_files(path)  # warm the page cache as every method will find it
    nbytes, t_read = read_files(path)
    rates = gemm_rate(r, device=device)
    x = np.random.default_rng(1).standard_normal((r, r))
    g = x @ x.T
    t0 = time.perf_counter()
    scipy.linalg.eigh(g, subset_by_index=[r - k, r - 1], driver="evr", check_finite=False)
    t_eigh = time.perf_counter() - t0
    flops = 2 * r * r * p + 2 * r * p * k
    return {
        "read_s": t_read,
        "read_GBps": nbytes / t_read / 1e9,
        "gemm64_GFLOPs": rates["gemm64"] / 1e9,
        "gemm32_GFLOPs": rates["gemm32"] / 1e9,
        "eigh_s": t_eigh,
        "flops": flops,
        "floor_s": max(2 * t_read, flops / rates["gemm64"]) + t_eigh,
    }


# ---------------------------------------------------------------- measuring one method
class OverMemory(Exception):
    pass


class Capped(Exception):
    pass


def _over_memory(signum, frame):
    raise OverMemory


def _alarm(signum, frame):
    raise Capped


class PeakRSS:
    """Highest RSS above the starting RSS while the block runs (a 10 ms sampling thread).

    Past ``limit`` bytes of RSS the thread interrupts the main thread (``OverMemory``) so
    that a peer that would be killed by the kernel fails alone, not the whole benchmark.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit

    def __enter__(self) -> PeakRSS:
        import psutil

        self._proc = psutil.Process()
        gc.collect()
        self.base = self._proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        fired = False
        while not self._stop.wait(0.01):
            rss = self._proc.memory_info().rss
            self.peak = max(self.peak, rss)
            if self.limit and rss > self.limit and not fired:
                fired = True
                os.kill(os.getpid(), signal.SIGUSR1)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def extra_gb(self) -> float:
        return (self.peak - self.base) / 1e9


def run_method(method: str, path: Path, k: int, work: Path, device: str = "cpu") -> dict:
    from gradspec.store import GradientStore

    extra: dict = {}
    if method in OURS:
        from gradspec.linalg import pca

        kw = {
            "gram": dict(method="gram"),
            "gram_f32": dict(method="gram", precision="float32"),
            "krylov": dict(method="krylov", iters=4),
            "orthogonal": dict(method="orthogonal", iters=10),
        }[method]
        res = pca(
            source=path, k=k, out=work / f"spec_{method}.zarr", overwrite=True, memory="3G", device=device, **kw
        )
        acc = res.accuracy()
        extra = {"passes": res.passes, "max_residual": acc["max_residual"]}
        return {"sigma": res.sigma, "u": res.U, **extra}
    h = GradientStore.open(path).read()
    if method == "sklearn":
        from sklearn.utils.extmath import randomized_svd

        u, sigma, _ = randomized_svd(h, k, n_oversamples=10, random_state=0)
        extra["settings"] = "n_iter=auto, n_oversamples=10"
    elif method == "torch_lowrank":
        import torch

        u, sigma, _ = torch.svd_lowrank(torch.from_numpy(h), q=k + 10, niter=4)
        u, sigma = u[:, :k].numpy(), sigma[:k].numpy()
        extra["settings"] = "q=k+10, niter=4"
    elif method == "scipy_svds":
        from scipy.sparse.linalg import svds

        u, sigma, _ = svds(h, k=k, random_state=0)
        order = np.argsort(sigma)[::-1]
        u, sigma = u[:, order], sigma[order]
        extra["settings"] = "ARPACK, tol=0"
    elif method == "dask_compressed":
        import dask
        import dask.array as da

        del h
        x = GradientStore.open(path).to_dask()
        uu, ss, _ = da.linalg.svd_compressed(x, k=k, n_power_iter=4, seed=0, compute=False)
        with dask.config.set(scheduler="threads"):
            u, sigma = dask.compute(uu, ss)
        extra["settings"] = "n_power_iter=4, from the Zarr store"
    elif method == "paper_orthogonal":
        sigma, u = paper_orthogonal_iteration(h, k, iters=10)
        extra["settings"] = "10 iterations, column-wise Gram-Schmidt"
    else:
        raise ValueError(method)
    return {"sigma": np.asarray(sigma, dtype=np.float64), "u": np.asarray(u, dtype=np.float64), **extra}


def paper_orthogonal_iteration(h: np.ndarray, k: int, iters: int = 10) -> tuple[np.ndarray, np.ndarray]:
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
    ap.add_argument("--latent", type=int, default=None, help="latent directions of the synthetic H (default 2k)")
    ap.add_argument("--workdir", type=Path, default=Path("bench_pca_work"))
    ap.add_argument("--methods", default=",".join(OURS + PEERS))
    ap.add_argument("--cap", type=float, default=600.0, help="seconds before a peer is stopped")
    ap.add_argument("--mem-limit", type=float, default=0.8,
                    help="fraction of RAM a method's process RSS may reach before it is stopped")
    ap.add_argument("--device", default="cpu", help="device of gradspec's methods: cpu | cuda | auto")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args()
    if args.quick:
        args.r, args.p, args.k = 500, 200_000, 100
    import warnings

    warnings.filterwarnings("ignore")
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"grads_{args.r}x{args.p}.zarr"
    if not (store / "zarr.json").exists():
        t0 = time.perf_counter()
        make_store(store, args.r, args.p, args.latent or min(args.r, 2 * args.k))
        print(f"# wrote {store} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    # Heavy imports once, before anything is timed.
    import dask.array  # noqa: F401
    import scipy.sparse.linalg  # noqa: F401
    import sklearn.utils.extmath  # noqa: F401
    import torch  # noqa: F401

    import gradspec.linalg  # noqa: F401

    t0 = time.perf_counter()
    sig_ref, u_ref = exact_reference(store, args.k)
    print(f"# exact reference in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    floor = measure_floor(store, args.r, args.p, args.k, args.device)
    print(f"# floor {floor['floor_s']:.1f}s", file=sys.stderr)
    import psutil

    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGUSR1, _over_memory)
    limit = int(args.mem_limit * psutil.virtual_memory().total)
    rows = []
    for m in args.methods.split(","):
        row: dict = {"method": m}
        with PeakRSS(limit) as mem:
            t0 = time.perf_counter()
            try:
                if m in PEERS:
                    signal.setitimer(signal.ITIMER_REAL, args.cap)
                out = run_method(m, store, args.k, work, args.device)
            except Capped:
                out, row["capped"] = None, True
            except (OverMemory, MemoryError):
                out, row["out_of_memory"] = None, True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            row["wall_s"] = time.perf_counter() - t0
        row["peak_GB"] = mem.extra_gb
        if out is not None:
            sigma, u = out.pop("sigma"), out.pop("u")
            row.update(out)
            row["sigma_rel_err"] = float(np.max(np.abs(sigma[: args.k] - sig_ref) / sig_ref))
            row["max_angle_deg"] = max_angle_deg(u[:, : args.k], u_ref)
        rows.append(row)
        out = None
        gc.collect()
        note = " (capped)" if row.get("capped") else " (out of memory)" if row.get("out_of_memory") else ""
        print(f"# {m}: {row['wall_s']:.1f}s{note} {json.dumps(row)}", file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "floor": floor, "rows": rows}, indent=2))
    base = next((r["wall_s"] for r in rows if r["method"] == "gram"), None)
    print(f"\nH: r={args.r} p={args.p} k={args.k}, float32 store of {args.r * args.p * 4 / 1e9:.2f} GB "
          f"(page cache warm), {os.cpu_count()} CPU cores, gradspec on {args.device}")
    print(f"floor: read {floor['read_GBps']:.2f} GB/s ({floor['read_s']:.2f}s a pass), GEMM float64 "
          f"{floor['gemm64_GFLOPs']:.0f} GFLOP/s (float32 {floor['gemm32_GFLOPs']:.0f}), eigh {floor['eigh_s']:.1f}s "
          f"-> floor {floor['floor_s']:.1f}s")
    head = f"{'method':18} {'wall s':>8} {'/ gram':>7} {'/ floor':>8} {'peak GB':>8} {'sigma rel err':>14} {'max angle deg':>14}"
    print(head)
    for row in rows:
        wall = row["wall_s"]
        rel = f"{wall / base:7.2f}" if base else f"{'':7}"
        if row.get("capped") or row.get("out_of_memory"):
            why = "(stopped at the time cap)" if row.get("capped") else "(stopped: RSS over the limit)"
            print(f"{row['method']:18} {'>' + format(wall, '.0f'):>8} {'>' + rel.strip():>7} "
                  f"{'>' + format(wall / floor['floor_s'], '.1f'):>8} {row['peak_GB']:8.2f} {why:>29}")
            continue
        print(f"{row['method']:18} {wall:8.1f} {rel} {wall / floor['floor_s']:8.2f} {row['peak_GB']:8.2f} "
              f"{row['sigma_rel_err']:14.2e} {row['max_angle_deg']:14.3g}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "floor": floor,
                                         "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
