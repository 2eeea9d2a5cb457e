"""The table of docs/bench_paper_scale.txt, from what scripts/paper_scale.sh left behind (issue 21).

Reads the run directory (gradient store, spectrum store, decay report) and its ``-logs``
folder (each phase's ``/usr/bin/time -v`` output, the phase times, the free disk), and the
Gram-kernel rates this machine measured (``gradspec info --machine``; pca measures them
on first use, so in the same run). Prints the rows and the floor:

    floor = r²p (the symmetric Gram) + 2rpk (V) flops at the fastest float32 kernel measured
            (pca's own small-panel measurement, and the kernels timed here at the run's shapes)
            + one read of H at the rate measured by ``--read`` (a pass that only reads)
            + eigh of the r×r Gram as measured in the run

Usage: python benchmarks/paper_scale_report.py [RUN_DIR] [--read]
  --read  also time one read-only pass over the store (the floor's read term), ~minutes
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path


def time_v(path: Path) -> dict[str, float]:
    """Wall seconds, CPU seconds and peak RSS (GB) from a ``/usr/bin/time -v`` file."""
    text = path.read_text()

    def field(name: str) -> str:
        m = re.search(rf"{re.escape(name)}: (.+)", text)
        return m.group(1).strip() if m else ""

    wall = 0.0
    for part in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":"):
        wall = wall * 60 + float(part)
    cpu = float(field("User time (seconds)") or 0) + float(field("System time (seconds)") or 0)
    return {"wall": wall, "cpu": cpu, "rss_gb": float(field("Maximum resident set size (kbytes)") or 0) / 1e6}


def read_pass(store_path: Path) -> tuple[float, int]:
    """Seconds and bytes of one pass that only reads the store, as pca reads it."""
    from gradspec.linalg._sources import StoreSource
    from gradspec.store import GradientStore

    src = StoreSource(GradientStore.open(store_path))
    t0 = time.perf_counter()
    n = 0
    for _, block in src.iter_col_blocks(src.chunk_cols, 2):
        n += block.shape[0] * block.shape[1] * src.read_itemsize
    return time.perf_counter() - t0, n


def rates_at_size(r: int, k: int, w: int = 4096, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of the float32 kernels at this run's own shapes (best of ``repeats``): the Gram
    update of an r×w panel (numpy ``syrk``, symmetric-counted r²w; one torch GEMM, counted the
    same way: what it achieves for the Gram) and the V pass's w×r by r×k GEMM (2rwk)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    panel = rng.standard_normal((r, w), dtype=np.float32)
    y = rng.standard_normal((r, k), dtype=np.float32)
    tp, ty = torch.from_numpy(panel), torch.from_numpy(y)
    cases = {
        "gram numpy-syrk": (lambda: panel @ panel.T, float(r) * r * w),
        "gram torch-gemm": (lambda: tp @ tp.T, float(r) * r * w),
        "V pass torch P^T Y": (lambda: tp.T @ ty, 2.0 * r * w * k),
        "V pass numpy P^T Y": (lambda: panel.T @ y, 2.0 * r * w * k),
    }
    out = {}
    for name, (fn, flops) in cases.items():
        best = min(_timed(fn) for _ in range(repeats))
        out[name] = flops / best / 1e9
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="/work/scratch/paper")
    ap.add_argument("--read", action="store_true", help="time one read-only pass over the store")
    a = ap.parse_args()
    run = Path(a.run)
    logs = Path(f"{run}-logs")
    from gradspec.linalg import machine_kernels
    from gradspec.store import GradientStore, SpectrumStore

    g = GradientStore.open(run / "gradients.zarr")
    s = SpectrumStore.open(run / "spectrum.zarr")
    r, p = g.n_rows, g.p
    k = int(s.params["k"])
    on_disk = sum(f.stat().st_size for f in (run / "gradients.zarr").rglob("*") if f.is_file())
    print(f"store    {r} rows x {p:,} columns, {g.dtype}, {on_disk / 1e9:.1f} GB on disk "
          f"({r * p * 2 / on_disk:.2f}x compression)")
    for line in (logs / "disk.txt").read_text().splitlines():
        print(f"disk     {line}")
    for name in sorted(f.stem for f in logs.glob("*.time")):
        t = time_v(logs / f"{name}.time")
        print(f"phase    {name:<22} wall {t['wall']:8.0f} s ({t['wall'] / 60:5.1f} min)  CPU {t['cpu']:8.0f} s  "
              f"peak RSS {t['rss_gb']:.2f} GB")
    for e in s.params.get("rates", []):
        print(f"pass     {e['pass']:<8} {e['seconds']:7.0f} s  {e.get('gflops') or 0:6.1f} GFLOP/s (symmetric-counted)  "
              f"{e.get('gb_per_s') or 0:.3f} GB/s read  waited for reads {e.get('read_wait') or 0:.0f} s")
    print(f"kernel   {s.params.get('kernel')} ({s.params.get('kernel_reason')})")
    mk = machine_kernels(rows=r)  # the cache entry of this r's panel bucket, as pca chose from it
    rates32 = mk["rates"]["float32"]
    best = max(rates32.values())
    print(f"measured float32 Gram kernels on a {mk['panel'][0]}x{mk['panel'][1]} panel ({mk['measured_at']}): "
          + ", ".join(f"{n} {v:.0f}" for n, v in sorted(rates32.items(), key=lambda kv: -kv[1])) + " GFLOP/s")
    at_size = rates_at_size(r, k)
    print(f"float32 kernels at this run's shapes (r = {r}, panel 4096 columns, k = {k}): "
          + ", ".join(f"{n} {v:.0f}" for n, v in at_size.items()) + " GFLOP/s")
    best = max(best, *at_size.values())
    gram_flops, v_flops = float(r) * r * p, 2.0 * r * p * k
    m = re.search(r"Gram in ([0-9.]+)s, eigh in ([0-9.]+)s", (logs / "pca.log").read_text())
    eigh = float(m.group(2)) if m else 0.0
    floor = (gram_flops + v_flops) / (best * 1e9) + eigh
    line = (f"floor    (r²p + 2rpk) = {(gram_flops + v_flops) / 1e12:.1f} TFLOP at {best:.0f} GFLOP/s "
            f"(the fastest float32 kernel measured) = {floor - eigh:.0f} s")
    if a.read:
        secs, nbytes = read_pass(run / "gradients.zarr")
        floor += secs
        line += f" + one read {secs:.0f} s ({nbytes / secs / 1e9:.2f} GB/s of bfloat16)"
    print(line + f" + eigh {eigh:.0f} s = {floor:.0f} s")
    pca_wall = time_v(logs / "pca.time")["wall"] if (logs / "pca.time").exists() else None
    if pca_wall:
        print(f"pca      {pca_wall:.0f} s = {pca_wall / floor:.2f}x the floor")
    acc = s.accuracy
    print(f"accuracy check {acc.get('check')}: ok={acc.get('ok')}  max residual {acc.get('max_residual'):.2e}")
    report = run / "decay" / "report.json"
    if report.exists():
        fit = json.loads(report.read_text()).get("summary", {})
        print("decay    " + json.dumps({key: fit[key] for key in list(fit)[:6]}, default=str, ensure_ascii=False)[:600])


if __name__ == "__main__":
    main()
