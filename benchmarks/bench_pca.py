"""Benchmark of `gradspec pca` against what a user would write instead (issue 14).

Everything runs in one process, one method after another, on the same Zarr
store, and is timed end to end. gradspec streams H from the store and writes
V to a spectrum store; the in-memory peers load H from the store into RAM
(through gradspec's reader, their fastest way in; the load is timed with them)
and keep their result in memory.

Peers (``--methods``; ``--list`` prints them):
- in-memory Gram, what users write first: ``H @ H.T``, ``eigh``, ``V = HᵀU/σ``,
  in numpy and torch, float32 and float64 (float64: H cast whole), and the
  blocked float64 Gram of float32 column panels (the exact in-memory reference);
- ``scipy.linalg.svd(H, full_matrices=False)`` where it fits in the RAM budget;
- scikit-learn ``randomized_svd`` and ``torch.svd_lowrank`` at n_iter 4, 10, 20
  and with 4× more oversampling, so their accuracy–time curve is visible;
- scipy ``svds`` (ARPACK); dask ``svd_compressed`` (n_power_iter 4, from the store);
- gradspec: ``gram`` (the default precision: float32 products, float64 sums,
  Rayleigh-quotient σ), ``gram_f64`` (``--precision float64``), and randomized
  block Krylov at depths q whose basis does *not* span all r rows
  ((q+1)(k+10) < r; at larger q it is exact by construction, which says nothing
  about convergence).

Columns: wall time; ratio to the floor; ratio to the fastest peer whose σ
error is at most this row's (or 1e-8, whichever is larger: "equal accuracy");
peak memory (highest RSS above the RSS at the method's start, sampled every
10 ms, page cache not counted); max σ relative error over the top k and the
largest principal angle between top-k left subspaces, both against the
blocked float64 Gram + LAPACK ``eigh`` of the stored float32 H (numpy, an
implementation independent of gradspec's), which is also a row of the table.

The floor (same run, issue 21): the cheapest arithmetic that meets the
accuracy gradspec reports. The Gram is symmetric, so it needs r²p flops (one
triangle: BLAS ``syrk``), and V = HᵀUΣ⁻¹ needs 2rpk; both are priced at the
fastest float32 kernel measured in this run on r×4096 panels: every Gram kernel
of ``gradspec.linalg.GRAM_KERNELS`` (numpy/scipy ``syrk``, torch blocked and full
GEMMs; r²w counted) and one full float32 GEMM (best of numpy and torch; 2r²w
counted) — plus one read of H at the measured bandwidth, plus writing V (p×k
float32) at the measured write bandwidth, plus one ``eigh``. The Gram pass's
own floor is r²p flops at that rate plus the read; the V pass's is 2rpk flops
at that rate plus writing V. ``gram`` runs pca's defaults (the kernel measured
fastest on the machine, the cheap accuracy check); ``gram_full`` adds the full
H·V check (``--verify full``), the price of the report before issue 21.

Every method has a wall cap (``--cap``; checked between Python-level steps,
so a long BLAS call finishes first) and the process RSS is watched: past
``--mem-limit`` the method is stopped. Peers whose estimated memory exceeds
``--ram-budget`` are not started; their row says why.

    python benchmarks/bench_pca.py --r 200 --p 20000 --k 50   # a tiny smoke run (seconds)
    python benchmarks/bench_pca.py --quick            # r=500, p=200k, k=100
    python benchmarks/bench_pca.py --r 1000 --p 250000 --k 200
    python benchmarks/bench_pca.py                    # r=2000, p=1e6, k=500: an 8 GB store
    python benchmarks/bench_pca.py --scaling --r 1000 --p 250000 --k 200   # docs/bench_pca_scaling.png
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

#: Gaussian probes of the default ``cheap`` check on each side (``gradspec.linalg._verify``).
PROBES = 16


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
        # No training made these rows: steps are their numbers; loss, norms and the clipped share
        # are unknown (NaN, as the store format says), not the row numbers (`info` showed
        # "clipped 99950%").
        meta = {f: np.full(b, np.nan) for f in META_FIELDS}
        meta.update(step=np.arange(i, i + b), epoch=np.zeros(b), batch_size=np.ones(b))
        store.write_rows(i, a[i : i + b] @ g + 0.01 * noise, meta)
        store.commit(i + b)
    store.set_status("complete")


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


def write_rate(work: Path, nbytes: int) -> tuple[float, float]:
    """Write ``nbytes`` of float32 in 64 MB pieces to files under ``work`` (page cache, as V is): (GB/s, s)."""
    piece = np.ones(16 * 2**20, np.float32)
    d = work / "write_probe"
    d.mkdir(exist_ok=True)
    t0, done, i = time.perf_counter(), 0, 0
    while done < nbytes:
        with open(d / f"{i}.bin", "wb") as fh:
            fh.write(memoryview(piece)[: min(piece.nbytes, nbytes - done) // 4])
        done += min(piece.nbytes, nbytes - done)
        i += 1
    dt = time.perf_counter() - t0
    for f in d.iterdir():
        f.unlink()
    return nbytes / dt / 1e9, dt


def gemm_rate(r: int, seconds: float = 3.0, device: str = "cpu") -> dict[str, float]:
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


def kernel_rates(r: int, device: str = "cpu", width: int = 4096, seconds: float = 1.0) -> dict[str, float]:
    """GFLOP/s of every Gram kernel on a float32 r×width panel, counted symmetric (r²w per update)."""
    import torch

    from gradspec.linalg import GRAM_KERNELS

    dev = torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    panel = torch.from_numpy(np.random.default_rng(2).standard_normal((r, width), dtype=np.float32)).to(dev)
    out = {}
    for name, cls in GRAM_KERNELS.items():
        if cls.cpu_only and dev.type != "cpu":
            continue
        kern = cls(r, dev)
        kern.update(panel)
        sync()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds or n < 2:
            kern.update(panel)
            sync()
            n += 1
        out[name] = n * float(r) * r * width / (time.perf_counter() - t0) / 1e9
    return out


def measure_floor(path: Path, r: int, p: int, k: int, device: str, work: Path) -> dict:
    import scipy.linalg

    read_files(path)  # warm the page cache as every method will find it
    nbytes, t_read = read_files(path)
    rates = gemm_rate(r, device=device)
    kernels = kernel_rates(r, device=device)
    best_kernel = max(kernels, key=kernels.get)
    # The fastest float32 kernel: a Gram kernel (r²w counted) or the full GEMM (2r²w counted).
    rate = max(kernels[best_kernel] * 1e9, rates["gemm32"])
    wgbps, t_write = write_rate(work, 4 * p * k)
    x = np.random.default_rng(1).standard_normal((r, r))
    g = x @ x.T
    t0 = time.perf_counter()
    scipy.linalg.eigh(g, subset_by_index=[r - k, r - 1], driver="evr", check_finite=False)
    t_eigh = time.perf_counter() - t0
    flops = r * r * p + 2 * r * p * k
    return {
        "floor_kind": "r²p (Gram, symmetric) + 2rpk (V) flops at the fastest float32 kernel + one read "
                      "of H + writing V + eigh",
        "read_s": t_read,
        "read_GBps": nbytes / t_read / 1e9,
        "write_v_s": t_write,
        "write_GBps": wgbps,
        "gemm64_GFLOPs": rates["gemm64"] / 1e9,
        "gemm32_GFLOPs": rates["gemm32"] / 1e9,
        "kernels_GFLOPs": kernels,
        "fastest": best_kernel if kernels[best_kernel] * 1e9 >= rates["gemm32"] else "float32 GEMM",
        "rate_GFLOPs": rate / 1e9,
        "eigh_s": t_eigh,
        "flops": flops,
        "floor_s": flops / rate + t_read + t_write + t_eigh,
        "gram_floor_s": r * r * p / rate + t_read,
        "vpass_floor_s": 2 * r * p * k / rate + t_write,
        # The default check's own arithmetic in the V pass (``_passes._Project``, ``HtProbes``):
        # s = 16 Gaussian probes ride in V's GEMM (2rps float32 flops) and 16 more from the p
        # side are float64 products (2ps(r + k) flops at the float64 GEMM rate).
        "vpass_check_floor_s": 2 * r * p * k / rate + t_write + 2 * r * p * PROBES / rate
        + 2 * p * PROBES * (r + k) / rates["gemm64"],
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


def krylov_depths(r: int, k: int, oversample: int = 10) -> list[int]:
    """Krylov depths q ≥ 1 whose basis ((q+1)(k+oversample) columns) does not span all r rows."""
    return [q for q in (1, 2, 3, 4, 6) if (q + 1) * (k + oversample) < r]


def method_list(r: int, k: int) -> list[str]:
    ours = ["gram", "gram_full", "gram_f64"] + [f"krylov_q{q}" for q in krylov_depths(r, k)]
    inmem = ["numpy_gram_f32", "torch_gram_f32", "numpy_gram_f64_blocked", "numpy_gram_f64",
             "torch_gram_f64", "scipy_svd"]
    rand = [f"sklearn_it{n}" for n in (4, 10, 20)] + ["sklearn_it4_os4k"]
    rand += [f"torch_lowrank_it{n}" for n in (4, 10, 20)] + ["torch_lowrank_it4_os4k"]
    return ours + inmem + rand + ["scipy_svds", "dask_compressed"]


def mem_estimate(method: str, r: int, p: int, k: int) -> float:
    """Bytes a peer holds at its peak (H in RAM and its largest temporaries), for the RAM budget."""
    h = 4.0 * r * p
    os_ = 4 * k if "os4k" in method else 10
    est = {
        "numpy_gram_f32": h + 4 * p * k,
        "torch_gram_f32": h + 4 * p * k,
        "numpy_gram_f64_blocked": h + 4 * p * k + 8 * r * 8192 * 2,
        "numpy_gram_f64": 3 * h + 8 * p * k,
        "torch_gram_f64": 3 * h + 8 * p * k,
        "scipy_svd": 3 * h + 4 * r * r,
        "scipy_svds": 2 * h,
        "dask_compressed": 2 * h,
    }
    if method.startswith(("sklearn", "torch_lowrank")):
        return h + 3 * 4 * p * (k + os_)
    return est.get(method, 0.0)


def _load(path: Path) -> np.ndarray:
    from gradspec.store import GradientStore

    return GradientStore.open(path).read()


def _gram_eigh_v(h, k: int, lib: str):
    """What a user writes first: G = H·Hᵀ, eigh(G), V = HᵀU/σ (all in H's dtype)."""
    if lib == "torch":
        import torch

        t = torch.from_numpy(h)
        lam, w = torch.linalg.eigh(t @ t.T)
        lam, w = lam.flip(0)[:k], w.flip(1)[:, :k]
        sigma = lam.clamp(min=0).sqrt()
        v = (t.T @ w) / sigma
        return sigma.double().numpy(), w.double().numpy(), v
    lam, w = np.linalg.eigh(h @ h.T)
    lam, w = lam[::-1][:k], w[:, ::-1][:, :k]
    sigma = np.sqrt(np.maximum(lam, 0))
    v = (h.T @ w) / sigma
    return sigma.astype(np.float64), w.astype(np.float64), v


def run_method(method: str, path: Path, k: int, work: Path, device: str = "cpu") -> dict:
    extra: dict = {}
    if method in ("gram", "gram_full", "gram_f64") or method.startswith("krylov"):
        from gradspec.linalg import pca

        if method.startswith("krylov"):
            kw = dict(method="krylov", iters=int(method.split("_q")[1]))
        else:
            kw = dict(method="gram", precision="float64" if method == "gram_f64" else "auto",
                      verify="full" if method == "gram_full" else True)
        res = pca(source=path, k=k, out=work / f"spec_{method}.zarr", overwrite=True, memory="3G",
                  device=device, **kw)
        acc = res.accuracy()
        extra = {"passes": res.passes, "max_residual": acc["max_residual"], "check": acc.get("check"),
                 "check_ok": acc.get("ok"), "precision": res.params.get("precision"),
                 "kernel": res.params.get("kernel"),
                 "rates": [{key: (round(v, 2) if isinstance(v, float) else v) for key, v in e.items()}
                           for e in res.params.get("rates", [])],
                 "timings": {n: round(float(t), 2) for n, t in res.timings.items()}}
        return {"sigma": res.sigma, "u": res.U, **extra}
    if method == "numpy_gram_f64_blocked":
        h = _load(path)
        sigma, u = blocked_gram_eigh(h, k)
        v = np.empty((h.shape[1], k), np.float32)  # V = HᵀU/σ in float64 panels, stored float32
        y = u / sigma
        for j in range(0, h.shape[1], 8192):
            v[j : j + 8192] = h[:, j : j + 8192].T.astype(np.float64) @ y
        return {"sigma": sigma, "u": u}
    if method.startswith(("numpy_gram", "torch_gram")):
        h = _load(path)
        if method.endswith("f64"):
            h = h.astype(np.float64)
        sigma, u, _ = _gram_eigh_v(h, k, method.split("_")[0])
        return {"sigma": sigma, "u": u}
    h = _load(path)
    if method == "scipy_svd":
        import scipy.linalg

        u, sigma, _ = scipy.linalg.svd(h, full_matrices=False)
        u, sigma = u[:, :k], sigma[:k]
    elif method.startswith("sklearn"):
        from sklearn.utils.extmath import randomized_svd

        n_iter = int(method.split("_it")[1].split("_")[0])
        os_ = 4 * k if "os4k" in method else 10
        u, sigma, _ = randomized_svd(h, k, n_oversamples=os_, n_iter=n_iter, random_state=0)
    elif method.startswith("torch_lowrank"):
        import torch

        n_iter = int(method.split("_it")[1].split("_")[0])
        q = k + (4 * k if "os4k" in method else 10)
        u, sigma, _ = torch.svd_lowrank(torch.from_numpy(h), q=min(q, min(h.shape)), niter=n_iter)
        u, sigma = u[:, :k].numpy(), sigma[:k].numpy()
    elif method == "scipy_svds":
        from scipy.sparse.linalg import svds

        u, sigma, _ = svds(h, k=k, random_state=0)
        order = np.argsort(sigma)[::-1]
        u, sigma = u[:, order], sigma[order]
    elif method == "dask_compressed":
        import dask
        import dask.array as da

        from gradspec.store import GradientStore

        del h
        x = GradientStore.open(path).to_dask()
        uu, ss, _ = da.linalg.svd_compressed(x, k=k, n_power_iter=4, seed=0, compute=False)
        with dask.config.set(scheduler="threads"):
            u, sigma = dask.compute(uu, ss)
    else:
        raise ValueError(f"unknown method {method!r}; --list prints them")
    return {"sigma": np.asarray(sigma, dtype=np.float64), "u": np.asarray(u, dtype=np.float64), **extra}


def blocked_gram_eigh(h: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """σ and U from the float64 Gram of float32 column panels (numpy) and LAPACK eigh."""
    g = np.zeros((h.shape[0], h.shape[0]))
    for j in range(0, h.shape[1], 8192):
        x = h[:, j : j + 8192].astype(np.float64)
        g += x @ x.T
    lam, u = np.linalg.eigh(g)
    return np.sqrt(np.maximum(lam[::-1][:k], 0)), u[:, ::-1][:, :k]


def streamed_reference(path: Path, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The judge: σ and U from the float64 Gram of the stored float32 H, streamed from the store in
    column panels (numpy, OpenBLAS; H is never whole in RAM), and LAPACK eigh."""
    from gradspec.store import GradientStore

    store = GradientStore.open(path)
    g = np.zeros((store.n_rows, store.n_rows))
    for _, blk in store.iter_col_blocks():
        for j in range(0, blk.shape[1], 4096):
            x = blk[:, j : j + 4096].astype(np.float64)
            g += x @ x.T
    lam, u = np.linalg.eigh(g)
    return np.sqrt(np.maximum(lam[::-1][:k], 0)), u[:, ::-1][:, :k]


# ---------------------------------------------------------------- the table
def max_angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    qa, _ = np.linalg.qr(a)
    qb, _ = np.linalg.qr(b)
    s = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return float(np.degrees(np.arccos(np.clip(s.min(), -1, 1))))


def measure(m: str, store: Path, k: int, work: Path, args, sig_ref, u_ref, limit: int) -> dict:
    row: dict = {"method": m}
    import psutil

    need = mem_estimate(m, args.r, args.p, k)
    avail = psutil.virtual_memory().available
    if need > args.ram_budget * 1e9:
        row["skipped"] = f"needs ~{need / 1e9:.1f} GB, over the --ram-budget of {args.ram_budget:g} GB"
        return row
    if need > avail - 1e9:
        row["skipped"] = (f"needs ~{need / 1e9:.1f} GB; only {avail / 1e9:.1f} GB was available on the "
                          "shared machine when it was due")
        return row
    gc.collect()
    # Stop the method before it takes memory the other processes on the machine hold.
    limit = int(min(limit, psutil.Process().memory_info().rss + avail - 0.5e9))
    with PeakRSS(limit) as mem:
        t0 = time.perf_counter()
        try:
            ours = m.startswith(("gram", "krylov"))
            signal.setitimer(signal.ITIMER_REAL, args.cap_ours if ours else args.cap)
            out = run_method(m, store, k, work, args.device)
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
        n = min(k, sigma.size)
        row["sigma_rel_err"] = float(np.max(np.abs(sigma[:n] - sig_ref[:n]) / sig_ref[:n]))
        row["max_angle_deg"] = max_angle_deg(u[:, :n], u_ref[:, :n])
    return row


def print_table(rows: list[dict], floor: dict, args) -> None:
    ok = [r for r in rows if "sigma_rel_err" in r]
    ours = ("gram", "krylov")
    # The reference is a row but no peer: it streams from the store and forms no V.
    peers = [r for r in ok if not r["method"].startswith((*ours, "reference"))]
    print(f"\nH: r={args.r} p={args.p} k={args.k}, float32 store of {args.r * args.p * 4 / 1e9:.2f} GB "
          f"(page cache warm), {os.cpu_count()} CPU cores, torch threads {args.threads}, gradspec on {args.device}")
    kern = ", ".join(f"{n} {v:.0f}" for n, v in sorted(floor["kernels_GFLOPs"].items(), key=lambda kv: -kv[1]))
    print(f"floor ({floor['floor_kind']}): read {floor['read_GBps']:.2f} GB/s ({floor['read_s']:.2f}s), "
          f"write V {floor['write_GBps']:.2f} GB/s ({floor['write_v_s']:.2f}s), float32 Gram kernels "
          f"[{kern}] GFLOP/s (r²w counted), float32 GEMM {floor['gemm32_GFLOPs']:.0f} (2r²w counted; float64 "
          f"{floor['gemm64_GFLOPs']:.0f}) -> {floor['rate_GFLOPs']:.0f} GFLOP/s ({floor['fastest']}), eigh "
          f"{floor['eigh_s']:.1f}s -> floor {floor['floor_s']:.1f}s; Gram-pass floor {floor['gram_floor_s']:.1f}s, "
          f"V-pass floor {floor['vpass_floor_s']:.1f}s")
    head = (f"{'method':24} {'wall s':>8} {'/floor':>7} {'/best peer':>10} {'(peer)':24} {'peak GB':>8} "
            f"{'sigma rel err':>13} {'angle deg':>10}")
    print(head)
    for row in rows:
        m = row["method"]
        if "skipped" in row:
            print(f"{m:24} {'-':>8} {'':7} {'':10} {'':24} {'':8} skipped: {row['skipped']}")
            continue
        wall = row["wall_s"]
        if "sigma_rel_err" not in row:
            why = "stopped at the time cap" if row.get("capped") else "stopped: RSS over the limit"
            print(f"{m:24} {'>' + format(wall, '.0f'):>8} {'>' + format(wall / floor['floor_s'], '.1f'):>7} "
                  f"{'':10} {'':24} {row['peak_GB']:8.2f} ({why})")
            continue
        tol = max(row["sigma_rel_err"], 1e-8)
        cands = [r for r in peers if r["sigma_rel_err"] <= tol and r is not row]
        best = min(cands, key=lambda r: r["wall_s"]) if cands else None
        rel = f"{wall / best['wall_s']:10.2f}" if best else f"{'(none)':>10}"
        print(f"{m:24} {wall:8.1f} {wall / floor['floor_s']:7.2f} {rel} {best['method'] if best else '':24} "
              f"{row['peak_GB']:8.2f} {row['sigma_rel_err']:13.2e} {row['max_angle_deg']:10.3g}")
    for row in rows:
        if "timings" in row:
            t = row["timings"]
            extra = ""
            if "gram" in t:
                extra += f"; Gram pass / its floor = {t['gram'] / floor['gram_floor_s']:.2f}"
            if "project" in t:
                extra += (f"; V pass / its floor = {t['project'] / floor['vpass_floor_s']:.2f} "
                          f"({t['project'] / floor['vpass_check_floor_s']:.2f} of the floor with the "
                          f"check's probe products, {floor['vpass_check_floor_s']:.1f} s)")
            print(f"# {row['method']}: phases {t}{extra}; kernel {row.get('kernel')}, check {row.get('check')} "
                  f"(ok {row.get('check_ok')})")
            for e in row.get("rates", []):
                gf = f"{e['gflops']:.1f} GFLOP/s" if e.get("gflops") else "-"
                print(f"#   pass {e['pass']}: {e['seconds']:.2f}s, {gf}, {e['gb_per_s']:.2f} GB/s read, "
                      f"waited {e['read_wait']:.2f}s for reads")


def scaling(args, store: Path, work: Path) -> None:
    """Time of gradspec's default exact method vs p and vs r (subsets of one store), and a plot."""
    from gradspec.linalg import pca

    r, p, k = args.r, args.p, args.k
    runs = []
    for rr, pp in [(r, p // 4), (r, p // 2), (r, p), (r // 4, p), (r // 2, p)]:
        kk = min(k, rr // 2)
        t0 = time.perf_counter()
        res = pca(source=store, k=kk, method="gram", rows=slice(0, rr), col_ranges=[(0, pp)],
                  out=work / "spec_scaling.zarr", overwrite=True, memory="3G")
        wall = time.perf_counter() - t0
        runs.append({"r": rr, "p": pp, "k": kk, "wall_s": wall,
                     "timings": {n: round(float(t), 2) for n, t in res.timings.items()}})
        print(f"# scaling r={rr} p={pp} k={kk}: {wall:.1f}s {runs[-1]['timings']}", file=sys.stderr, flush=True)
    plot_scaling(runs, r, p, k, args.plot)
    print(json.dumps(runs))


def plot_scaling(runs: list[dict], r: int, p: int, k: int, path: str) -> None:
    """Wall time and its phases vs p (at r) and vs r (at p), log-log, with the expected slopes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    vp = sorted((x for x in runs if x["r"] == r), key=lambda x: x["p"])
    vr = sorted((x for x in runs if x["p"] == p), key=lambda x: x["r"])
    for ax, pts, key, slope in ((axes[0], vp, "p", 1), (axes[1], vr, "r", 2)):
        xs = np.array([x[key] for x in pts], float)
        for name, lab in (("wall_s", "total"), ("gram", "Gram pass"), ("project", "V pass"), ("eigh", "eigh")):
            ys = np.array([x["wall_s"] if name == "wall_s" else x["timings"][name] for x in pts])
            fit = np.polyfit(np.log(xs), np.log(ys), 1)[0]
            ax.loglog(xs, ys, "o-", label=f"{lab} (slope {fit:.2f})")
        g = np.array([x["timings"]["gram"] for x in pts])
        ax.loglog(xs, g[-1] * (xs / xs[-1]) ** slope, "k--", lw=0.8, label=f"∝ {key}^{slope}")
        ax.set_xlabel(key)
        ax.set_ylabel("seconds")
        ax.set_title(f"gradspec gram vs {key} (" + (f"r={r}" if key == "p" else f"p={p}") + ")", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"default precision, k=min({k}, r/2); shared 2-core machine, load average ~20 "
                 "(eigh times are contention noise)", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"# wrote {out}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="r=500, p=200,000, k=100")
    ap.add_argument("--r", type=int, default=2000)
    ap.add_argument("--p", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=500)
    ap.add_argument("--latent", type=int, default=None, help="latent directions of the synthetic H (default 2k)")
    ap.add_argument("--workdir", type=Path, default=Path("bench_pca_work"))
    ap.add_argument("--methods", default=None, help="comma-separated (default: all; --list prints them)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--cap", type=float, default=300.0, help="seconds before a peer is stopped")
    ap.add_argument("--cap-ours", type=float, default=1800.0, help="seconds before a gradspec method is stopped")
    ap.add_argument("--mem-limit", type=float, default=0.7,
                    help="fraction of RAM the process RSS may reach before a method is stopped")
    ap.add_argument("--ram-budget", type=float, default=12.0,
                    help="GB: peers estimated to need more are skipped (the machine is shared)")
    ap.add_argument("--threads", type=int, default=2, help="torch/BLAS threads for every method")
    ap.add_argument("--device", default="cpu", help="device of gradspec's methods: cpu | cuda | auto")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    ap.add_argument("--scaling", action="store_true", help="time vs p and vs r of the default method")
    ap.add_argument("--plot", default="docs/bench_pca_scaling.png")
    args = ap.parse_args()
    if args.quick:
        args.r, args.p, args.k = 500, 200_000, 100
    methods = args.methods.split(",") if args.methods else method_list(args.r, args.k)
    if args.list:
        print("\n".join(method_list(args.r, args.k)))
        return
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(args.threads)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    store = work / f"grads_{args.r}x{args.p}.zarr"
    if not (store / "zarr.json").exists():
        t0 = time.perf_counter()
        make_store(store, args.r, args.p, args.latent or min(args.r, 2 * args.k))
        print(f"# wrote {store} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    if args.scaling:
        scaling(args, store, work)
        return
    # Heavy imports once, before anything is timed.
    import dask.array  # noqa: F401
    import scipy.sparse.linalg  # noqa: F401
    import sklearn.utils.extmath  # noqa: F401

    import gradspec.linalg  # noqa: F401

    print(f"# start {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average "
          f"{os.getloadavg()}", file=sys.stderr, flush=True)
    floor = measure_floor(store, args.r, args.p, args.k, args.device, work)
    print(f"# floor {json.dumps(floor)}", file=sys.stderr, flush=True)
    import psutil

    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGUSR1, _over_memory)
    limit = int(args.mem_limit * psutil.virtual_memory().total)
    # The reference first (its σ and U judge every row); it is also a row of the table.
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        sig_ref, u_ref = streamed_reference(store, args.k)
    ref_row = {"method": "reference_f64_blocked_gram", "wall_s": time.perf_counter() - t0,
               "peak_GB": mem.extra_gb, "sigma_rel_err": 0.0, "max_angle_deg": 0.0,
               "note": "blocked float64 Gram + eigh, no V (the judge of every row)"}
    print(f"# reference in {ref_row['wall_s']:.1f}s", file=sys.stderr, flush=True)
    rows = [ref_row]
    for m in methods:
        row = measure(m, store, args.k, work, args, sig_ref, u_ref, limit)
        rows.append(row)
        gc.collect()
        print(f"# {m}: {json.dumps(row)} load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "floor": floor, "rows": rows}, indent=2))
    print(f"# end {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load average {os.getloadavg()}",
          file=sys.stderr)
    print_table(rows, floor, args)


if __name__ == "__main__":
    main()
