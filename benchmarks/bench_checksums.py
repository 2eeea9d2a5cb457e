"""What per-chunk crc32c checksums cost a pca pass (issue 34 §2).

Two gradient stores of the same content (float32, seeded Gaussian rows, gradspec's default
chunks) are written side by side: one as gradspec writes it now (codecs ``bytes``,
``crc32c``: every chunk file ends with its CRC-32C, which the direct chunk reader checks),
one as gradspec wrote it before checksums (``bytes`` only). Both are read once to be in the
page cache. Three variants are timed: ``plain`` (the store without checksums), ``crc32c`` (the
checksummed one, read as gradspec reads it) and ``unchecked`` (the checksummed one with the
direct reader's check turned off: what the file format alone costs). In one process,
interleaved (each variant first, second and third in turn):

- ``read``: one pass of ``GradientStore.iter_col_blocks`` over every column, nothing else
  (the read path alone: the most the check can cost);
- ``pca``: ``gradspec.pca(source=store, k=K, method="gram")``, V kept in memory: two
  streaming passes over H (the Gram, then V = HᵀUΣ⁻¹) with pca's defaults;
- ``inline``: the read pass with no read-ahead thread (``prefetch=0``), timed by the CPU
  seconds of the calling thread alone (``time.thread_time``), ``--inline-repeats`` times: the
  work one pass's reads (and checks) cost, which other processes' load hardly changes.

The table gives each one's median and fastest wall time over the repeats, the ratio of
median wall times to ``plain``, the median of the repeats' own ratios to ``plain`` (a
repeat's variants run a minute apart at most, so this follows the machine's load less), the
same for CPU seconds (every thread of the process: the work the check adds, less sensitive
than wall time to what else the machine runs), and the CRC-32C rate of google_crc32c on one
8 MiB chunk.

    python benchmarks/bench_checksums.py                       # r = 1000, p = 400,000 (1.6 GB a store)
    python benchmarks/bench_checksums.py --r 200 --p 50000 --repeats 3   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec
from _emit import emit  # noqa: E402  benchmarks/_emit.py (this script's folder is on sys.path)


def build(path: Path, r: int, p: int, *, checksums: bool, seed: int = 0) -> None:
    """A complete store of r seeded rows (the same rows for any ``checksums``)."""
    import gradspec.store._checksum as checksum
    from gradspec.store import META_FIELDS, GradientStore, ParamLayout

    original = checksum.checksum_codecs
    if not checksums:  # gradspec before checksums: the codec chain ends with the bytes codec
        checksum.checksum_codecs = lambda compressors=None: list(compressors or []) or None
    try:
        store = GradientStore.create(path, layout=ParamLayout.from_shapes([("w", (p,))]))
    finally:
        checksum.checksum_codecs = original
    rng = np.random.default_rng(seed)
    for start in range(0, r, 32):
        b = min(32, r - start)
        rows = rng.standard_normal((b, p), dtype=np.float32)
        store.append(rows, {f: np.arange(start, start + b) for f in META_FIELDS})
    store.set_status("complete")


def read_pass(path: Path) -> tuple[float, float]:
    """Wall and CPU seconds (every thread of the process) of one read of every column block."""
    from gradspec.store import GradientStore

    store = GradientStore.open(path)
    t, c = time.perf_counter(), time.process_time()
    for _ in store.iter_col_blocks():
        pass
    return time.perf_counter() - t, time.process_time() - c


def inline_pass(path: Path) -> float:
    """CPU seconds of this thread for one read of every column block, read inline."""
    from gradspec.store import GradientStore

    store = GradientStore.open(path)
    c = time.thread_time()
    for _ in store.iter_col_blocks(prefetch=0):
        pass
    return time.thread_time() - c


def pca_pass(path: Path, k: int) -> tuple[float, float, np.ndarray]:
    """Wall and CPU seconds of a two-pass exact pca, and its sigma."""
    from gradspec import pca

    t, c = time.perf_counter(), time.process_time()
    res = pca(source=str(path), k=k, method="gram")
    return time.perf_counter() - t, time.process_time() - c, np.asarray(res.sigma)


def crc_rate() -> float:
    """GB/s of google_crc32c on an 8 MiB float32 chunk (a numpy array, as the reader checks it)."""
    import google_crc32c

    a = np.random.default_rng(1).standard_normal(2**21, dtype=np.float32)
    best = min(_timed(lambda: google_crc32c.value(a)) for _ in range(20))
    return a.nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@contextlib.contextmanager
def check(on: bool):
    """The direct reader's CRC check on (as gradspec reads) or off (the file format alone)."""
    import gradspec.store._fastread as fastread

    real = fastread.raw_matches
    if not on:
        fastread.raw_matches = lambda raw: True
    try:
        yield
    finally:
        fastread.raw_matches = real


#: variant -> (store, check on): gradspec now; before checksums; a checksummed store, check off
VARIANTS = {"plain": ("plain", True), "crc32c": ("crc32c", True), "unchecked": ("crc32c", False)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--r", type=int, default=1000)
    ap.add_argument("--p", type=int, default=400_000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inline-repeats", type=int, default=21)
    ap.add_argument("--no-pca", action="store_true", help="time the read passes only")
    ap.add_argument("--dir", type=Path, default=None, help="where the two stores go (a temporary folder)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    names = list(VARIANTS)
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}

    def record(what: str, name: str, t: float, c: float) -> None:
        times.setdefault((what, name), []).append(t)
        cpu.setdefault((what, name), []).append(c)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        stores = {"crc32c": Path(tmp) / "crc.zarr", "plain": Path(tmp) / "plain.zarr"}
        for name, path in stores.items():
            build(path, args.r, args.p, checksums=name == "crc32c")
        from gradspec.store import GradientStore

        assert GradientStore.open(stores["crc32c"])._direct is not None  # both on the direct path
        for path in stores.values():  # into the page cache
            read_pass(path)
        sigmas = {}
        for rep in range(args.repeats):
            order = names[rep % 3:] + names[: rep % 3]  # each variant first, second and third in turn
            for name in order:
                store, on = VARIANTS[name]
                with check(on):
                    record("read", name, *read_pass(stores[store]))
            for name in order if not args.no_pca else ():
                store, on = VARIANTS[name]
                with check(on):
                    t, c, sigmas[name] = pca_pass(stores[store], args.k)
                record("pca", name, t, c)
            print(f"repeat {rep + 1}/{args.repeats}: " + "  ".join(
                f"{w} {n} {times[(w, n)][-1]:.2f}s" for w in ("read", "pca") for n in order if (w, n) in times),
                file=sys.stderr)
        for rep in range(args.inline_repeats):
            for name in names[rep % 3:] + names[: rep % 3]:
                store, on = VARIANTS[name]
                with check(on):
                    c = inline_pass(stores[store])
                record("inline", name, c, c)
        if not args.no_pca:
            assert all(np.array_equal(sigmas[n], sigmas["plain"]) for n in names), "the stores gave different sigma"
    gb = args.r * args.p * 4 / 1e9
    lines = [f"per-chunk crc32c cost: r = {args.r:,}, p = {args.p:,} float32 ({gb:.2f} GB a store, "
             f"page cache), k = {args.k}, {args.repeats} interleaved repeats ({args.inline_repeats} of inline); "
             f"google_crc32c {crc_rate():.1f} GB/s on an 8 MiB chunk",
             "plain: written without checksums; crc32c: with them, read as gradspec reads; unchecked: the "
             "crc32c store with the direct reader's check turned off (the file format alone)",
             "ratio: of medians to plain; paired: median over repeats of each repeat's ratio to plain",
             f"{'pass':<6} {'store':<9} {'median s':>9} {'fastest s':>10} {'ratio':>7} {'paired':>7} "
             f"{'CPU s':>8} {'CPU ratio':>10}"]
    for what in ("read", "pca", "inline"):
        if (what, "plain") not in times:
            continue
        base, cbase = statistics.median(times[(what, "plain")]), statistics.median(cpu[(what, "plain")])
        for name in names:
            ts, cs = times[(what, name)], cpu[(what, name)]
            med, cmed = statistics.median(ts), statistics.median(cs)
            paired = statistics.median(a / b for a, b in zip(ts, times[(what, "plain")], strict=True))
            lines.append(f"{what:<6} {name:<9} {med:>9.3f} {min(ts):>10.3f} {med / base:>7.3f} {paired:>7.3f} "
                         f"{cmed:>8.2f} {cmed / cbase:>10.3f}")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
