"""Benchmark of `collect`'s I/O: peers side by side in one process, printed as ratios.

1. collect step time with the background writer on vs no store at all
   (same task, same seed, interleaved repeats; target <= 1.15x);
2. gradient-store write throughput vs a raw sequential write of the same
   bytes to the same disk, both followed by os.sync() (target >= 50%).

Usage:
    python benchmarks/bench_collect.py            # text task (MiniLM, q/v weights)
    python benchmarks/bench_collect.py --quick    # tiny-bert, small sizes (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _step_times(metrics: Path, skip: int = 2) -> list[float]:
    """Per-step wall times from the cumulative ``time`` of metrics.jsonl (log_every=1)."""
    times = [json.loads(line)["time"] for line in metrics.read_text().splitlines() if '"time"' in line]
    return list(np.diff(times))[skip:]


def bench_writer(args: argparse.Namespace, tmp: Path) -> None:
    from gradspec.collect import CollectConfig, collect

    model = "tiny-bert" if args.quick else "minilm"
    # sigma = 0 keeps the per-step accounting out of the measured step; clipping stays on.
    base = dict(
        task="text", task_options={"model": model, "n_train": 512, "n_eval": 64}, steps=args.steps,
        batch_size=args.batch_size, noise_multiplier=0.0, eval_every=0, log_every=1,
        checkpoint_every=10**6, microbatch=args.batch_size,
    )
    print(f"\n[1] collect step time, writer on vs no store  (text task, {model}, batch {args.batch_size}, "
          f"{args.steps} steps per run (first 2 dropped), {args.repeats} interleaved repeats)")
    for mode in ("batch", "per-example"):
        times: dict[str, list[float]] = {"off": [], "on": []}
        for rep in range(args.repeats):
            for which in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                out = tmp / f"run-{mode}-{which}-{rep}"
                res = collect(CollectConfig(mode=mode, **base), out=out, write_store=which == "on")
                times[which] += _step_times(res.metrics)
                shutil.rmtree(out, ignore_errors=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        mean = {k: statistics.fmean(v) for k, v in times.items()}
        print(f"    mode {mode:<12} median step off {med['off'] * 1e3:7.1f} ms  on {med['on'] * 1e3:7.1f} ms  "
              f"ratio {med['on'] / med['off']:.3f}   mean ratio {mean['on'] / mean['off']:.3f}   (target <= 1.15)")


def bench_throughput(args: argparse.Namespace, tmp: Path) -> None:
    from gradspec.store import META_FIELDS, BackgroundWriter, GradientStore, ParamLayout

    p = args.p
    rows = args.rows
    rng = np.random.default_rng(0)
    block = rng.standard_normal((32, p)).astype(np.float32)
    total = rows * p * 4
    print(f"\n[2] write throughput: {rows} rows x {p:,} float32 = {total / 2**30:.2f} GiB, each run + os.sync()")
    res: dict[str, list[float]] = {"raw": [], "store": []}
    for rep in range(args.repeats):
        for which in ("raw", "store") if rep % 2 == 0 else ("store", "raw"):
            path = tmp / f"{which}-{rep}"
            t0 = time.perf_counter()
            if which == "raw":
                with open(path, "wb") as f:
                    for i in range(rows):
                        f.write(block[i % 32].tobytes())
            else:
                lay = ParamLayout.from_shapes([("w", (p,))])
                store = GradientStore.create(path, layout=lay)
                w = BackgroundWriter(store)
                meta = {k: np.zeros(1) for k in META_FIELDS}
                for i in range(rows):
                    w.put(block[i % 32 : i % 32 + 1], meta)
                w.close()
            os.sync()
            res[which].append(total / (time.perf_counter() - t0))
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
    raw, st = statistics.median(res["raw"]), statistics.median(res["store"])
    print(f"    raw sequential {raw / 2**20:8.0f} MiB/s   gradient store {st / 2**20:8.0f} MiB/s   "
          f"store/raw = {st / raw:.2f}   (target >= 0.50)")


def main() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model and sizes")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--p", type=int, default=None, help="columns for the throughput test")
    ap.add_argument("--rows", type=int, default=None, help="rows for the throughput test")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    args.steps = args.steps or (8 if args.quick else 12)
    args.p = args.p or (200_000 if args.quick else 1_769_472)
    args.rows = args.rows or (128 if args.quick else 256)
    tmp = Path(tempfile.mkdtemp(prefix="gradspec-bench-", dir=args.dir))
    try:
        bench_throughput(args, tmp)
        bench_writer(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
