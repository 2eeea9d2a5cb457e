"""Benchmark of `gradspec decay` against the `gradspec pca` it reads (issue 36).

One process, one store: pca (the defaults: exact Gram method, float32 products, float32 V)
writes a spectrum store, then the decay analysis of it runs both ways, alternating:

- ``old``: the spectrum's own rows projected onto V (``decay_analysis(read_rows=True)``: one
  pass over H and V, 2·r·p·k float64 flops; what every decay did before issue 36, and what
  iterative, centred or TF32 spectra still do);
- ``new``: an exact spectrum's own rows from U, σ and the row norms pca recorded (no H read).

``--heldout N`` also measures G_k on the last N rows (held out of the pca), which both ways
project onto V. ``--figures`` adds writing the figures `gradspec decay` writes by default
(png and pdf) to the new path's time. Each row: wall seconds (median of ``--repeats``) and
peak RSS above the RSS at its start (sampled every 10 ms, page cache not counted), and the
ratio of each to pca's. The two paths' numbers are compared in the same run (largest relative
difference over every G_k, explained-variance and per-step number of the report).

    python benchmarks/bench_decay.py --r 200 --p 50000 --k 50      # a smoke run (seconds)
    python benchmarks/bench_decay.py                                # r=600, p=4e5, k=200
"""

from __future__ import annotations

import argparse
import gc
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _emit import emit  # noqa: E402
from bench_pca import PeakRSS, make_store  # noqa: E402


def _numbers(d, path=""):
    """(path, value) of every float under the report's rows."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(d, list):
        for v in d:
            yield from _numbers(v, path)
    elif isinstance(d, float):
        yield path, d


def max_rel_diff(a: dict, b: dict) -> float:
    pairs = list(zip(_numbers(a["rows"]), _numbers(b["rows"]), strict=True))
    return max(abs(x - y) / max(abs(x), 1e-300) for (_, x), (_, y) in pairs)


def run_decay(spec: Path, *, old: bool, heldout: str | None, figures: Path | None) -> tuple[float, float, dict]:
    from gradspec.spectrum import decay_analysis

    gc.collect()
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        analysis = decay_analysis(spectrum=spec, heldout_rows=heldout, read_rows=old)
        report = analysis.to_dict()
        if figures is not None:
            from gradspec.plot import report_figures

            report_figures(analysis, figures, formats=("png", "pdf"))
        wall = time.perf_counter() - t0
    return wall, mem.extra_gb, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--r", type=int, default=600)
    ap.add_argument("--p", type=int, default=400_000)
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--heldout", type=int, default=0, help="last N rows held out of the pca")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--figures", action="store_true", help="also time the new path with its figures")
    ap.add_argument("--work", type=Path, default=None, help="directory for the stores (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()

    from gradspec.linalg import pca

    work = Path(tempfile.mkdtemp(prefix="bench_decay_", dir=args.work))
    try:
        store, spec = work / "g.zarr", work / "spectrum.zarr"
        make_store(store, args.r, args.p, latent=args.r)
        fit = args.r - args.heldout
        heldout = f"{fit}:{args.r}" if args.heldout else None
        gc.collect()
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            res = pca(source=str(store), k=args.k, rows=slice(0, fit), out=str(spec))
            pca_wall = time.perf_counter() - t0
        pca_gb = mem.extra_gb
        rows: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        reports = {}
        for i in range(args.repeats):  # alternate the order, so that drift on a shared machine hits both
            for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
                wall, gb, reports[name] = run_decay(spec, old=name == "old", heldout=heldout, figures=None)
                rows[name].append((wall, gb))
        if args.figures:
            rows["new + figures"] = []
            for _ in range(args.repeats):
                figs = work / "figures"
                shutil.rmtree(figs, ignore_errors=True)
                figs.mkdir()
                wall, gb, _ = run_decay(spec, old=False, heldout=heldout, figures=figs)
                rows["new + figures"].append((wall, gb))
        diff = max_rel_diff(reports["new"], reports["old"])
        import os

        import psutil

        lines = [
            f"bench_decay — gradspec decay vs the pca it reads (issue 36): r = {fit} rows in the spectrum"
            + (f" + {args.heldout} held out" if args.heldout else "")
            + f", p = {args.p:,}, k = {res.k} (method {res.method}, {res.params.get('precision')} products, "
            "float32 V), float32 store",
            f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, load average at the end "
            f"{os.getloadavg()[0]:.1f} (shared: timings are noisy; ratios are of runs in this one process)",
            f"walls: median of {args.repeats} runs, old and new alternating; peak RSS above the RSS at each "
            "start, sampled every 10 ms",
            "",
            f"{'run':<22}{'wall s':>9}{'x pca':>8}{'peak GB':>10}{'x pca':>8}",
            f"{'pca':<22}{pca_wall:>9.2f}{1.0:>8.3f}{pca_gb:>10.3f}{1.0:>8.3f}",
        ]
        for name, got in rows.items():
            wall = statistics.median(w for w, _ in got)
            gb = max(g for _, g in got)
            label = {"old": "decay, old (reads H)", "new": "decay, new"}.get(name, f"decay, {name}")
            lines.append(f"{label:<22}{wall:>9.2f}{wall / pca_wall:>8.3f}{gb:>10.3f}{gb / max(pca_gb, 1e-9):>8.3f}")
        old_w = statistics.median(w for w, _ in rows["old"])
        new_w = statistics.median(w for w, _ in rows["new"])
        lines += [
            "",
            f"new / old: wall {new_w / old_w:.3f}, peak RSS "
            f"{max(g for _, g in rows['new']) / max(max(g for _, g in rows['old']), 1e-9):.3f}",
            f"largest relative difference between the two reports' numbers: {diff:.2e}",
        ]
        emit(lines, args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
