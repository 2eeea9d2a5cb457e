"""Whole-model sketched per-example collection vs plain fine-tuning over the same examples
(issue 22, part 4: ≤ 3× the time, store ≤ 2 GB).

Both runs train every MiniLM parameter on the same task for the same steps at the same
expected batch size (r ≈ steps × batch examples):

* plain: a plain PyTorch loop (mean loss, one backward, Adam) over Poisson batches of the
  same rate q = batch/n, nothing clipped, nothing stored;
* sketched: DP-SGD at ε = 8 with ghost clipping, each clipped per-example gradient of all
  22.7M parameters stored as M sketched columns (``--per-example --sketch M``).

Each run is its own process (peak RSS = its ``ru_maxrss``); the runs alternate
(plain, sketched, plain, sketched, ...) so the load of a shared machine hits both alike, and
the ratio is of the medians.

Usage:
    python benchmarks/bench_sketch_collect.py --work DIR [--steps 125] [--batch 32]
        [--sketch 65536] [--repeats 1] [--out docs/bench_sketch_collect.txt]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's gradspec

TASK_OPTIONS = {"dataset": "movie-reviews", "n_eval": 200}


def child(kind: str, out: str, steps: int, batch: int, sketch: int, dtype: str) -> dict:
    """One run in this process: its wall time, peak RSS and what it wrote."""
    import resource
    import time

    from gradspec.collect import collect
    from gradspec.train import TrainConfig

    common = dict(task="text", task_options=TASK_OPTIONS, steps=steps, batch_size=batch, lr=2e-4,
                  optimizer="adam", eval_every=0, checkpoint_every=10_000, seed=0, params=["*"])
    if kind == "plain":  # a plain loop: the same task, model, optimizer, q and steps
        import torch

        from gradspec.tasks import make_task

        task = make_task("text", seed=0, **TASK_OPTIONS)
        model = task.model.eval()  # as the trainer (dropout off)
        for prm in model.parameters():
            prm.requires_grad_(True)
        opt = torch.optim.Adam(model.parameters(), lr=2e-4)
        n = len(task.train)
        gen = torch.Generator().manual_seed(0)
        t0 = time.perf_counter()
        for _ in range(steps):
            idx = (torch.rand(n, generator=gen) < batch / n).nonzero().squeeze(1)
            if idx.numel():
                b = task.train.batch(idx)
                task.loss(task.forward(model, b), b).mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        res = None
    else:
        cfg = TrainConfig(**common, target_epsilon=8.0, noise_multiplier=None, mode="per-example",
                          backend="ghost", sketch=sketch, dtype=dtype)
        t0 = time.perf_counter()
        res = collect(cfg, out=out, overwrite=True, progress=False)
    wall = time.perf_counter() - t0
    info = {"kind": kind, "wall_s": wall, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "eval_accuracy": (res.final_metrics or {}).get("eval_accuracy") if res is not None else None}
    store = Path(out) / "gradients.zarr"
    if store.exists():
        from gradspec.store import GradientStore

        s = GradientStore.open(store)
        info.update(rows=s.n_rows, M=s.p, p=(s.sketch or {}).get("p"), store_bytes=s.nbytes_on_disk())
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=125)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--sketch", type=int, default=65536)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.steps, args.batch, args.sketch, args.dtype)))
        return 0
    runs: dict[str, list[dict]] = {"plain": [], "sketched": []}
    load0 = os.getloadavg()[0]
    for rep in range(args.repeats):
        for kind in ("plain", "sketched"):
            out = args.work / f"{kind}-{rep}"
            cmd = [sys.executable, __file__, "--child", kind, str(out), "--work", str(args.work), "--steps", str(args.steps), "--batch",
                   str(args.batch), "--sketch", str(args.sketch), "--dtype", args.dtype]
            print(f"[bench] {kind} run {rep + 1}/{args.repeats} ...", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
            runs[kind].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            if kind == "sketched" and rep < args.repeats - 1:
                shutil.rmtree(out, ignore_errors=True)
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    sk = runs["sketched"][-1]
    lines = [f"# bench_sketch_collect: whole-MiniLM sketched per-example collection vs plain fine-tuning, "
             f"{args.steps} steps of expected batch {args.batch} (Poisson), movie reviews",
             f"# command: python benchmarks/bench_sketch_collect.py --steps {args.steps} --batch {args.batch} "
             f"--sketch {args.sketch} --dtype {args.dtype} --repeats {args.repeats}",
             f"# date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
             f"{os.cpu_count()} cores; load average before {load0:.1f}, after {os.getloadavg()[0]:.1f}; "
             "each run its own process, runs alternating", "",
             f"{'run':<10}{'wall s (each)':>22}{'median s':>10}{'x plain':>9}{'peak RSS GB':>13}"]
    for kind, rs in runs.items():
        walls = ", ".join(f"{r['wall_s']:.0f}" for r in rs)
        lines.append(f"{kind:<10}{walls:>22}{med[kind]:>10.0f}{med[kind] / med['plain']:>9.2f}"
                     f"{max(r['peak_rss_gb'] for r in rs):>13.2f}")
    lines += ["", f"sketched store: {sk.get('rows')} rows x M = {sk.get('M'):,} columns ({args.dtype}) of "
              f"p = {sk.get('p'):,} parameters, {sk.get('store_bytes', 0) / 1e9:.2f} GB on disk",
              f"goals: time <= 3x plain: {'met' if med['sketched'] <= 3 * med['plain'] else 'missed'} "
              f"({med['sketched'] / med['plain']:.2f}x); store <= 2 GB: "
              f"{'met' if sk.get('store_bytes', 0) <= 2e9 else 'missed'}"]
    from _emit import emit  # benchmarks/_emit.py (this script's folder is on sys.path)

    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
