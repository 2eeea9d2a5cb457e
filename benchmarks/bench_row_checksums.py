"""What row checksums cost (``gradspec/store/_rowsums.py``): recording them, and checking them.

Writing: the CRC-32C of each row's segments (``segment_crcs``) is computed on the writer's
thread for every row block written. It is timed alone beside ``GradientStore.write_rows`` and
``commit`` of the same rows (which include it; the store in the page cache), at three row shapes:
a 32-example block of a 5,210-wide CNN, of a 1.06M-wide MLP, and one whole-MiniLM bfloat16 row.

Reading: one checksummed store (gradspec's default chunks, seeded float32 rows, in the page
cache) is read column block by column block with no read-ahead thread (``prefetch=0``), with the
row check on and turned off (the direct reader's ``_bound`` removed), interleaved; the CPU seconds
of the calling thread (``time.thread_time``) are the work the reads and their checks cost.

    python benchmarks/bench_row_checksums.py                 # r = 1,000, p = 400,000 (1.6 GB)
    python benchmarks/bench_row_checksums.py --r 200 --p 50000 --repeats 3   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec


def write_cost(repeats: int, work: Path) -> None:
    from gradspec.store import GradientStore, ParamLayout
    from gradspec.store._rowsums import row_crcs, segment_crcs
    from gradspec.store._zarr import to_disk_dtype

    # (name, rows a write, p, dtype, per-example rows): a per-example store also keeps each
    # example's norms (meta/pre_clip_norm, clip_factor, example_index, param_norms), bound too
    shapes = [("cnn block", 32, 5_210, "float32", True), ("mlp1m block", 32, 1_060_170, "float32", True),
              ("whole-MiniLM row", 1, 22_713_986, "bfloat16", False)]
    print(f"{'rows':18} {'MiB':>7} {'write+commit ms':>16} {'of it row sums ms':>18} {'share':>6} {'GB/s':>6}")
    for name, b, p, dtype, per_example in shapes:
        path = work / f"w-{p}"
        layout = ParamLayout.from_shapes([("w", (p // 2,)), ("v", (p - p // 2,))])
        store = GradientStore.create(path, layout=layout, dtype=dtype, per_example=per_example, overwrite=True)
        rows = np.random.default_rng(0).standard_normal((b, p)).astype(np.float32)
        disk = to_disk_dtype(rows, dtype)
        cc = store.chunks[1]
        meta = {f: np.ones(b, dtype=dt) for f, dt in store.meta_fields.items()}
        if per_example:
            meta["param_norms"] = np.ones((b, 2))
        if dtype != "float32":  # what a 16-bit write keeps beside its rows: the rounding's stats
            meta["dtype_stats"] = np.zeros((b, 5))
        beside = [meta[k.removeprefix("meta/")] for k in store._row_sums.small]
        tw, ts = [], []
        for k in range(repeats + 1):
            t = time.perf_counter()
            store.write_rows(b * k, rows, meta)
            store.commit(b * (k + 1))
            t1 = time.perf_counter()
            segment_crcs(disk, cc)
            for v in beside:
                row_crcs(v)
            t2 = time.perf_counter()
            if k:  # the first round warms both
                tw.append(t1 - t)
                ts.append(t2 - t1)
        w, s = statistics.median(tw), statistics.median(ts)
        print(f"{name:18} {disk.nbytes / 2**20:7.1f} {w * 1e3:16.2f} {s * 1e3:18.2f} {s / w:6.3f} "
              f"{disk.nbytes / s / 1e9:6.1f}")


def read_cost(r: int, p: int, repeats: int, work: Path) -> None:
    from gradspec.store import META_FIELDS, GradientStore, ParamLayout

    path = work / "r"
    store = GradientStore.create(path, layout=ParamLayout.from_shapes([("w", (p,))]), overwrite=True)
    rng = np.random.default_rng(0)
    for start in range(0, r, 32):
        b = min(32, r - start)
        store.append(rng.standard_normal((b, p)).astype(np.float32), {f: np.zeros(b) for f in META_FIELDS})
    store.set_status("complete")
    store = GradientStore.open(path)
    bound = store._direct._bound
    assert bound is not None

    def one(check: bool) -> float:
        store._direct._bound = bound if check else None
        t = time.thread_time()
        for _ in store.iter_col_blocks(prefetch=0, reuse=True):
            pass
        return time.thread_time() - t

    one(True), one(False)  # the page cache, and the recorded checksums loaded
    on, off = [], []
    for k in range(repeats):
        for check in ((True, False) if k % 2 == 0 else (False, True)):
            (on if check else off).append(one(check))
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(f"read pass of {r} x {p:,} float32 ({r * p * 4 / 1e9:.2f} GB), CPU s of the reading thread, "
          f"median of {repeats}: checked {statistics.median(on):.3f}, unchecked {statistics.median(off):.3f}, "
          f"paired ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--r", type=int, default=1000)
    ap.add_argument("--p", type=int, default=400_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        write_cost(args.repeats, Path(tmp))
        read_cost(args.r, args.p, args.repeats, Path(tmp))


if __name__ == "__main__":
    main()
