"""What recording costs an Opacus DP-SGD step: plain step vs step + per-example rows vs step +
per-step rows (``GradientRecorder.attach_opacus``), and where the recording's time goes.

Every model is trained on sklearn's digits (8x8 images, 1,797 examples) with
``PrivacyEngine.make_private`` (hooks, flat clipping, C = 1, no Poisson sampling), batch
``--batch-size``. Three sizes: a small CNN (p ~ 5e3), an MLP of p ~ 1.1e5 and one of p ~ 1.1e6.
One process runs the three configurations of a size in a rotated order, ``--repeats`` rounds
of ``--steps`` steps each (after a warm-up round), and takes the median, so the load of a
shared machine hits all alike and the ratios come from the same rounds. A recorded round's
time runs until every row is committed (``commit(wait=True)`` drains the background writer);
``close()`` (a once-per-run cost: shrinking the arrays, checking every chunk exists) is
timed apart, as is the store's creation (not at all).

Then one recorded run per size with the writer on the calling thread (``background=False``)
is profiled: forming the rows (Opacus's clip factor times its grad_sample, into a float32
(b, p) block), the bound re-check (``bound_rows_``: each stored row's float64 norm <= C),
the finiteness check, zarr writes of the gradient chunks and of the per-row metadata
(meta/*, param_norms), commits. Last, the disk's own rate: a ``--mb`` MiB file written
(buffered, as the store writes) and with fsync.

Usage:
    python benchmarks/bench_opacus_recording.py [--sizes cnn,mlp100k,mlp1m] [--repeats 3]
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec

MODES = ["plain", "per-example", "per-step"]


def _model(size: str):
    import torch
    from torch import nn

    if size == "cnn":  # p = 5,210
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10))
    hidden = {"mlp100k": [1536], "mlp1m": [1024, 960]}[size]  # p = 115,210 / 1,060,234
    layers: list[nn.Module] = [nn.Flatten()]
    width = 64
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 10))
    torch.manual_seed(0)
    return nn.Sequential(*layers)


def _data():
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8), torch.tensor(y)


def _run(size: str, mode: str, *, steps: int, batch: int, data, tmp: Path, background: bool = True,
         profile: dict | None = None) -> tuple[float, float]:
    """ms per step of ``steps`` steps (after 2 untimed ones) until every row is committed
    (``commit(wait=True)``: the writer's backlog is drained), and the seconds ``close()`` then
    takes (the per-run cost: shrinking the arrays, checking every chunk, the config)."""
    import torch
    from opacus import PrivacyEngine

    from gradspec.collect import GradientRecorder

    x, y = data
    torch.manual_seed(0)
    model = _model(size)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True,
                                         drop_last=True)
    model, opt, loader = PrivacyEngine().make_private(module=model, optimizer=opt, data_loader=loader,
                                                      noise_multiplier=1.0, max_grad_norm=1.0,
                                                      poisson_sampling=False)
    out = Path(tempfile.mkdtemp(dir=tmp))
    rec = None
    if mode != "plain":
        rec = GradientRecorder(out=out, model=model, per_example=mode == "per-example", max_grad_norm=1.0,
                               background=background)
        rec.attach_opacus(opt)
    batches = iter(loader)

    def step() -> None:
        nonlocal batches
        try:
            xb, yb = next(batches)
        except StopIteration:
            batches = iter(loader)
            xb, yb = next(batches)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    if profile is not None:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if rec is not None:
        rec.commit(wait=True)
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    if rec is not None:
        rec.close()
    close_s = time.perf_counter() - t1
    if profile is not None:
        prof.disable()
        profile["stats"] = prof
        profile["bytes"] = rec.store.n_rows * rec.store.p * 4 if rec else 0
    shutil.rmtree(out, ignore_errors=True)
    return dt / steps * 1e3, close_s


class _ZarrTimer:
    """Time zarr ``Array.__setitem__`` by array (grads vs meta/* vs param_norms)."""

    def __init__(self) -> None:
        import zarr

        self.cls, self.orig = zarr.Array, zarr.Array.__setitem__
        self.t: dict[str, float] = collections.defaultdict(float)
        self.n: dict[str, int] = collections.defaultdict(int)
        timer = self

        def setitem(arr, key, value):
            t0 = time.perf_counter()
            try:
                return timer.orig(arr, key, value)
            finally:
                name = "grads" if arr.path.endswith("grads") else ("meta/*" if "meta/" in arr.path else arr.path)
                timer.t[name] += time.perf_counter() - t0
                timer.n[name] += 1

        zarr.Array.__setitem__ = setitem

    def stop(self) -> None:
        self.cls.__setitem__ = self.orig


def _profile(size: str, args, data, tmp: Path) -> None:
    import pstats

    timer = _ZarrTimer()
    prof: dict = {}
    try:
        ms, _ = _run(size, "per-example", steps=args.steps, batch=args.batch_size, data=data, tmp=tmp,
                  background=False, profile=prof)
    finally:
        timer.stop()
    stats = pstats.Stats(prof["stats"])
    total = ms * args.steps / 1e3
    pieces = {
        "form rows (scale grad_sample, copy to float32)": "_on_physical_batch",
        "float64 row norms (finiteness + bound; new path)": "row_norms64",
        "bound re-check (bound_rows_)": "bound_rows_",
        "finiteness check (isfinite)": "isfinite",
        "flat_rows copy": "flat_rows",
        "store.write_rows (all)": "write_rows",
        "store.commit": "commit",
    }
    cum: dict[str, float] = collections.defaultdict(float)
    for (file, _, func), (_, _, _, ct, _) in stats.stats.items():
        for label, name in pieces.items():
            if func == name or func.endswith(f" '{name}' of ") or f"'{name}'" in func or func == f"<built-in method torch.{name}>":
                if name == "commit" and "_gradients_write" not in file:
                    continue
                cum[label] = max(cum[label], ct)
    print(f"  profile of per-example recording, writer on the calling thread ({ms:.1f} ms/step, "
          f"{prof['bytes'] / total / 2**20:.0f} MiB/s of rows):")
    for label in pieces:
        print(f"    {label:<50s} {cum[label] / args.steps * 1e3:7.2f} ms/step")
    for name in sorted(timer.t):
        print(f"    zarr setitem {name:<37s} {timer.t[name] / args.steps * 1e3:7.2f} ms/step "
              f"({timer.n[name] / args.steps:.1f} calls/step)")


def _disk_rate(tmp: Path, mb: int) -> tuple[float, float]:
    import numpy as np

    block = np.random.default_rng(0).random(2**20 // 8 * 8, dtype=np.float64).tobytes()  # 8 MiB
    rates = []
    for sync in (False, True):
        path = tmp / "disk.bin"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(mb // 8):
                f.write(block)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        rates.append(mb / (time.perf_counter() - t0))
        path.unlink()
    return rates[0], rates[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="cnn,mlp100k,mlp1m")
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default: 192 / 32 / 8 by size)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--mb", type=int, default=512, help="MiB written for the disk rate")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="gradspec-bench-", dir=args.dir))
    data = _data()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
          f"{args.threads}, batch {args.batch_size}, {args.repeats} rounds (median)")
    try:
        buffered, synced = _disk_rate(tmp, args.mb)
        print(f"disk: {buffered:.0f} MiB/s buffered, {synced:.0f} MiB/s with fsync ({args.mb} MiB, {tmp})")
        for size in args.sizes.split(","):
            steps = args.steps or {"cnn": 192, "mlp100k": 32, "mlp1m": 8}[size]
            p = sum(q.numel() for q in _model(size).parameters())
            times: dict[str, list[float]] = {m: [] for m in MODES}
            closes: dict[str, list[float]] = {m: [] for m in MODES}
            for r in range(args.repeats + 1):  # round 0 warms up
                for m in MODES[r % 3:] + MODES[: r % 3]:
                    ms, close_s = _run(size, m, steps=steps, batch=args.batch_size, data=data, tmp=tmp)
                    if r:
                        times[m].append(ms)
                        closes[m].append(close_s)
            med = {m: statistics.median(v) for m, v in times.items()}
            rows_mb = args.batch_size * p * 4 / 2**20
            print(f"\n{size}: p = {p:,}, {steps} steps/round, per-example rows {rows_mb:.2f} MiB/step")
            for m in MODES:
                extra = (f"  = {med[m] / med['plain']:.2f}x plain (+{(med[m] / med['plain'] - 1) * 100:.0f}%)"
                         if m != "plain" else "")
                rate = f"  {rows_mb / med[m] * 1e3:.0f} MiB/s of rows" if m == "per-example" else ""
                rate += f"  [close {statistics.median(closes[m]):.2f} s]" if m != "plain" else ""
                print(f"  {m:<12s} {med[m]:8.2f} ms/step   (rounds: "
                      f"{', '.join(f'{v:.1f}' for v in times[m])}){extra}{rate}")
            if not args.no_profile:
                _profile(size, argparse.Namespace(**{**vars(args), "steps": steps}), data, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
