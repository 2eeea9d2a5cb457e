"""Choosing the Gram kernel by measurement, once per machine, and remembering the choice.

On first use on a machine (a Gram pass worth it: ``worth_measuring``),
every CPU kernel of ``_kernels.GRAM_KERNELS`` updates a float64 Gram from a
random panel shaped like the pass's own (``measure_panel``: the pass's r rounded
to a power of two in [256, 2048], ``MEASURE_COLS`` columns), in float32 and in
float64, after one untimed warm-up update each; the fastest of each dtype is
used from then on. The shape matters: on a 2-core Xeon (MKL torch, OpenBLAS
numpy, 2026-11-28) a 1024×768 panel ranked torch's full GEMM first (106 against
numpy ``syrk``'s 101 GFLOP/s), while at the pass's 1500×4096 panels numpy
``syrk`` ran 181 against 121, and the Gram pass of a 1500×4e5 store took 10.3 s
with the kernel the small panel chose and 6.6 s with ``syrk``. The measurement
takes one to five seconds (under a second for r <= 512). It is cached as JSON in
the user's cache directory (``$GRADSPEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/gradspec``, else
``~/.cache/gradspec``), keyed by what decides the answer: the CPU model and core
count, torch's thread count, the BLAS numpy and torch use, the numpy, scipy and
torch versions, and the panel measured (one entry per row bucket). A cache file that cannot
be read, or whose entry is malformed, is ignored with a warning and measured
again — a damaged cache is never trusted. It is read only if it is a regular file
of at most ``MAX_CACHE_BYTES``, opened without blocking (a FIFO in its place hung
every large pass and ``info --machine``; a 512 MiB file cost 1.27 GB of memory
before it was ignored). ``pca(kernel=...)`` / ``--kernel`` overrides the choice;
``gradspec info --machine`` prints it, the rates and how they were measured.

A measurement is one moment of the machine, so each entry records how it was taken
(``conditions``: the 1-minute load average before it, the usable cores, torch's
threads, and the CPU and wall seconds the measurement took). It counts as taken
under load when the load average exceeded ``LOAD_FRACTION`` of the cores and the
measurement got less than ``CPU_SHARE`` of the CPU its threads could use (one
measured torch-blocked at 1.1 GFLOP/s on a shared machine); such an entry, or one
from before conditions were recorded, is measured again once the machine is quiet
(load average at most ``LOAD_FRACTION`` of the cores). An entry is also measured
again when a Gram pass that ran its chosen kernel achieved more than
``CONTRADICTION`` times the rate the measurement gave that kernel (a pass also reads
and casts, so it cannot honestly beat the kernel alone): the pass marks the entry
stale, and the next choice re-measures — once; a re-measurement contradicted again
is kept (the panel measured may simply be slower than the passes' own shape).

The choice is the fastest kernel that leaves the GIL to the pass's read-ahead thread
(``_gil``: scipy's f2py BLAS holds it, and starved the reads of a pass it led alone).

Rates are counted symmetric: a Gram update of an r×w panel is r²w flops
whichever kernel computes it (one triangle is all the answer holds).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
from typing import Any

import numpy as np
import torch

from gradspec.linalg._gil import choose, idle_rate, settled_share
from gradspec.linalg._kernel_cache import (
    CACHE_FILE,
    cache_dir,
    read_cache,
    valid_entry,
    write_cache,
)
from gradspec.linalg._kernels import GRAM_KERNELS, default_kernel, gram_kernel

logger = logging.getLogger(__name__)

#: Columns of the panel the candidates are timed on: a pass over at most 2,048 rows cuts its
#: blocks into 8,192-column panels (at 768 and at 4,096 columns the ranking differed).
MEASURE_COLS = 8192
#: The range of the panel's rows: the pass's r rounded to a power of two, within it.
MEASURE_ROWS = (256, 2048)
#: Rows measured when no pass says how many (``gradspec info --machine``).
DEFAULT_ROWS = 1024
#: A Gram pass below r²p = this many flops, or below ``MEASURE_WORK`` times one update of the
#: panel measured (what a measurement costs: two dtypes, four kernels, up to four updates
#: each; 1-5 s for 512-2,048 rows), takes the default kernel without measuring (or reading the
#: cache): a measurement would cost more than it could save.
MEASURE_MIN_FLOPS = 2e10
MEASURE_WORK = 32
#: Wall-time budget of one dtype's measurement (seconds); a kernel's timed runs after its
#: warm-up only within it.
MEASURE_BUDGET_S = 2.5
#: Bytes of the wide block whose column slices the candidates are timed on (3 to 8 panels of
#: it, each update a fresh one: more than a last-level cache holds, as in a pass).
PANELS_BYTES = 256 * 2**20
DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: A measurement is under load when the load average before it exceeded this fraction of the
#: usable cores (and it got less than ``CPU_SHARE`` of its threads' CPU); a loaded entry is
#: measured again when the load average is at most this fraction of the cores.
LOAD_FRACTION = 0.5
#: CPU seconds per wall second, as a fraction of min(torch threads, cores), below which a
#: measurement did not get the CPU it asked for.
CPU_SHARE = 0.8
#: A Gram pass at more than this many times its kernel's measured rate contradicts the measurement.
CONTRADICTION = 2.0

_memo: dict[tuple[str, str], dict[str, Any]] = {}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def under_load(conditions: dict[str, Any] | None) -> bool:
    """Whether a measurement taken under ``conditions`` (an entry's record) was taken under load:
    the load average before it above ``LOAD_FRACTION`` of the cores and less than ``CPU_SHARE``
    of its threads' CPU got; True too when the record is missing or damaged."""
    if not isinstance(conditions, dict):
        return True
    load, cores = conditions.get("load_1m"), conditions.get("cores")
    cpu, wall, threads = conditions.get("cpu_s"), conditions.get("wall_s"), conditions.get("torch_threads")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (cores, cpu, wall, threads)):
        return True
    if load is None:
        return False  # no load average on this platform: nothing says it was loaded
    if not isinstance(load, (int, float)) or isinstance(load, bool):
        return True
    if load <= LOAD_FRACTION * cores:
        return False
    return cpu / max(wall, 1e-9) < CPU_SHARE * min(threads, cores)


def _quiet_now() -> bool:
    load = load_average()
    return load is not None and load <= LOAD_FRACTION * _cores()


def _clocks() -> tuple[float, float]:
    """(CPU seconds of this process, all its threads; wall seconds)."""
    return time.process_time(), time.perf_counter()


def _measure_with_conditions(panel: tuple[int, int]) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """:func:`measure` on ``panel``, and how it was measured (the entry's ``conditions``)."""
    load = load_average()
    cpu0, wall0 = _clocks()
    shares: dict[str, dict[str, float]] = {}
    rates = measure(panel, shares=shares)
    cpu1, wall1 = _clocks()
    conditions = {"load_1m": load, "cores": _cores(), "torch_threads": torch.get_num_threads(),
                  "cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0}
    conditions["under_load"] = under_load(conditions)
    if shares:
        conditions["gil_share"] = shares
    return rates, conditions


def measure_panel(rows: int | None = None) -> tuple[int, int]:
    """(rows, columns) of the panel the kernels are timed on for a pass over ``rows`` rows of H:
    ``rows`` rounded to the nearest power of two within ``MEASURE_ROWS`` (``DEFAULT_ROWS`` when
    None), ``MEASURE_COLS`` columns. Kernels rank differently with r (on contiguous panels of a
    2-core Xeon: at 256 rows numpy's ``syrk`` led, at 2,048 scipy's), so each bucket has its own
    entry."""
    n = DEFAULT_ROWS if rows is None else max(1, int(rows))
    lo, hi = MEASURE_ROWS
    bucket = 2 ** int(round(np.log2(n)))
    return int(min(max(bucket, lo), hi)), MEASURE_COLS


def worth_measuring(flops: float, rows: int | None = None) -> bool:
    """Whether a Gram pass of ``flops`` = r²p over ``rows`` rows is worth a measurement."""
    r, w = measure_panel(rows)
    return flops >= max(MEASURE_MIN_FLOPS, MEASURE_WORK * float(r) * r * w)


def _numpy_blas() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # numpy's config layout is not an API; the key only needs to be stable
        return "unknown"


def machine_key() -> dict[str, Any]:
    """What decides which kernel is fastest on this machine (the cache key)."""
    import scipy

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "numpy_blas": _numpy_blas(),
        "scipy": scipy.__version__,
        "torch": torch.__version__,
        "torch_mkl": bool(torch.backends.mkl.is_available()),
    }


def measure(
    panel: tuple[int, int] | None = None, budget_s: float = MEASURE_BUDGET_S, seed: int = 0,
    shares: dict[str, dict[str, float]] | None = None,
) -> dict[str, dict[str, float]]:
    """GFLOP/s (symmetric-counted, r²w per update) of every CPU kernel, per panel dtype, on a
    random panel of shape ``panel`` (default: :func:`measure_panel`).

    Each kernel first runs one update untimed (G's first touch, its BLAS threads' start-up:
    a first run once made torch-blocked look 15× slower than it is), then up to three timed
    ones while the dtype's ``budget_s`` lasts (the third only if the best of two is within 2×
    of the fastest so far: the first after a switch of BLAS library can meet the other
    library's threads still spinning); where no timed run fits the budget, the warm-up's
    time stands. ``shares``, when given, receives each kernel's share of the GIL left to
    other threads during its warm-up (``_gil.settled_share``), per dtype."""
    r, w = panel if panel is not None else measure_panel()
    cpu = torch.device("cpu")
    flops = float(r) * r * w
    t_start = time.perf_counter()
    rates: dict[str, dict[str, float]] = {}
    rng = np.random.default_rng(seed)
    idle = idle_rate()
    for dname, dtype in DTYPES.items():
        # Column slices of one wide block, a fresh one each update, as a pass hands them: a kernel
        # that copies a strided panel pays for it, and no panel is still in the cache.
        item = torch.empty((), dtype=dtype).element_size()
        count = int(np.clip(PANELS_BYTES // (r * w * item), 3, 8))
        base = torch.from_numpy(rng.random((r, count * w), dtype=np.float32)).to(dtype)
        panels = [base[:, i * w : (i + 1) * w] for i in range(count)]
        turn = 0
        rates[dname] = {}
        leader = np.inf  # the best time of this dtype so far
        t_dtype = time.perf_counter()
        for name, cls in GRAM_KERNELS.items():
            kern = cls(r, cpu)
            warm_panel = panels[turn % count]
            turn += 1
            share, warm = settled_share(lambda k=kern, q=warm_panel: k.update(q),  # the warm-up, its GIL share
                                        lambda k=kern, q=panels[turn % count]: k.update(q), idle)
            turn += 1
            if shares is not None:
                shares.setdefault(dname, {})[name] = round(share, 3)
            best = np.inf
            for i in range(3):
                if (i >= 2 and best > 2 * leader) or time.perf_counter() - t_dtype > budget_s:
                    break  # clearly not the fastest after two timed runs, or out of time
                t0 = time.perf_counter()
                kern.update(panels[turn % count])
                turn += 1
                best = min(best, time.perf_counter() - t0)
            if not np.isfinite(best):
                best = warm
            leader = min(leader, best)
            rates[dname][name] = flops / max(best, 1e-9) / 1e9
    logger.info("Gram kernels measured in %.1fs on a %d×%d panel", time.perf_counter() - t_start, r, w)
    return rates


def entry_key(rows: int | None = None) -> str:
    """The cache entry's key for passes over ``rows`` rows: the machine's key and the panel
    measured (:func:`measure_panel`), as sorted JSON."""
    return json.dumps({**machine_key(), "panel": list(measure_panel(rows))}, sort_keys=True)


def machine_kernels(
    *, cache: str | os.PathLike | None = None, remeasure: bool = False, rows: int | None = None
) -> dict[str, Any]:
    """The Gram kernel chosen on this machine for float32 and float64 panels of ``rows`` rows
    (None: ``DEFAULT_ROWS``), and the rates.

    Reads the cache, or measures (and writes the cache) when it holds no valid entry for
    this machine's key, or when its entry is stale: contradicted by a pass, or measured under
    load (or with no record of how) while the machine is quiet now (see the module's notes).

    Args:
        cache: cache directory (default: see :func:`cache_dir`).
        remeasure: measure even when the cache holds an entry.

    Returns:
        ``{"choice": {dtype: kernel}, "rates": {dtype: {kernel: GFLOP/s}}, "panel": [r, w],
        "measured_at", "conditions" and "how" (how it was measured: the record, in words),
        "key", "cache" (the file),
        "source": "cache" | "measured", "why" (of a re-measurement, if any)}``.
    """
    path = cache_dir(cache) / CACHE_FILE
    panel = measure_panel(rows)
    skey = entry_key(rows)
    key = json.loads(skey)
    memo_key = (str(path), skey)
    if not remeasure and memo_key in _memo:
        return dict(_memo[memo_key])
    entries = read_cache(path) or {}
    entry = None if remeasure else entries.get(skey)
    if entry is not None and not valid_entry(entry):
        logger.warning("ignoring a malformed entry of the Gram-kernel cache %r; measuring again", str(path))
        entry = None
    why = _stale(entry) if entry is not None else None
    if why is not None:
        logger.info("measuring the Gram kernels again: %s", why)
    source = "cache"
    if entry is None or why is not None:
        rates, conditions = _measure_with_conditions(panel)
        old = entry
        entry = {
            # the fastest that leaves the read-ahead thread the GIL (``_gil``)
            "choice": {d: choose(r, (conditions.get("gil_share") or {}).get(d)) for d, r in rates.items()},
            "rates": rates,
            "panel": list(panel),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "conditions": conditions,
        }
        if old is not None and old.get("stale"):
            entry["after_contradiction"] = old["stale"]
        entries[skey] = entry
        write_cache(path, entries)
        source = "measured"
    out = {**entry, "how": _conditions_text(entry.get("conditions")), "key": key, "cache": str(path),
           "source": source}
    if why is not None:
        out["why"] = why
    _memo[memo_key] = out
    return dict(out)


def _stale(entry: dict[str, Any]) -> str | None:
    """Why a valid cached entry should be measured again now, or None to trust it."""
    stale = entry.get("stale")
    if isinstance(stale, dict):
        return f"a {stale.get('dtype')} Gram pass ran {stale.get('kernel')} at {stale.get('achieved')} GFLOP/s, " \
               f"over {CONTRADICTION:g}x the {stale.get('measured')} measured"
    if under_load(entry.get("conditions")) and _quiet_now():
        cond = entry.get("conditions")
        then = (f"measured under load {cond.get('load_1m')} on {cond.get('cores')} cores"
                if isinstance(cond, dict) else "measured with no record of the load")
        return f"the cached rates were {then}, and the machine is quiet now"
    return None


def check_gram_pass(kernel: str, *, dtype: torch.dtype, device: torch.device, flops: float,
                    gflops: float | None, cache: str | os.PathLike | None = None,
                    rows: int | None = None) -> bool:
    """Whether a Gram pass that ran ``kernel`` (chosen as ``"auto"``) at ``gflops`` contradicts
    the cached measurement, i.e. beat the kernel's measured rate by over ``CONTRADICTION``×.
    Then the cache entry is marked stale (the next choice measures again) and True returned;
    an entry that is itself a re-measurement after a contradiction is kept.
    """
    if device.type != "cpu" or not worth_measuring(flops, rows) or not gflops:
        return False
    path = cache_dir(cache) / CACHE_FILE
    skey = entry_key(rows)
    info = _memo.get((str(path), skey))
    dname = "float64" if dtype == torch.float64 else "float32"
    if info is None or info["choice"][dname] != kernel:
        return False  # not the measured choice (another process's, or overridden)
    measured = float(info["rates"][dname][kernel])
    if gflops <= CONTRADICTION * measured:
        return False
    if info.get("after_contradiction"):
        logger.info("a Gram pass ran %s at %.1f GFLOP/s, %.1fx its re-measured %.1f; keeping the measurement",
                    kernel, gflops, gflops / measured, measured)
        return False
    logger.warning("a Gram pass ran %s at %.1f GFLOP/s, %.1fx the %.1f GFLOP/s the cached measurement gave it "
                   "(%s); the Gram kernels are measured again on the next large pass",
                   kernel, gflops, gflops / measured, measured, _conditions_text(info.get("conditions")))
    entries = read_cache(path) or {}
    entry = entries.get(skey)
    if isinstance(entry, dict) and entry.get("measured_at") == info.get("measured_at"):
        entry["stale"] = {"dtype": dname, "kernel": kernel, "achieved": round(gflops, 1),
                          "measured": round(measured, 1), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_cache(path, entries)
    _memo.pop((str(path), skey), None)
    return True


def _conditions_text(cond: Any) -> str:
    """How a measurement was taken, in words."""
    if not isinstance(cond, dict):
        return "with no record of the load"
    load = cond.get("load_1m")
    text = f"load {load:.2f}" if isinstance(load, (int, float)) else "load unknown"
    with contextlib.suppress(KeyError, TypeError, ZeroDivisionError):
        text += f" on {cond['cores']} cores, {cond['cpu_s'] / cond['wall_s']:.1f} CPU s per s"
    return ("under " if under_load(cond) else "quiet, ") + text


def choose_gram_kernel(
    kernel: str,
    *,
    dtype: torch.dtype,
    device: torch.device,
    flops: float,
    cache: str | os.PathLike | None = None,
    rows: int | None = None,
) -> tuple[str, str]:
    """-> (kernel name, why) for a Gram pass of ``flops`` = r²p on float32/float64 panels of
    ``rows`` rows (r: the panel measured is shaped like the pass's, :func:`measure_panel`).

    ``kernel``: a name of ``GRAM_KERNELS`` (checked for the device) or ``"auto"``: one full
    GEMM on CUDA; on the CPU the measured fastest (cached) when the pass is worth it, else
    the default (:func:`~gradspec.linalg._kernels.default_kernel`).
    """
    if kernel != "auto":
        gram_kernel(kernel, device)
        return kernel, "as requested"
    if device.type != "cpu":
        return default_kernel(dtype, device), f"default on {device.type}"
    if not worth_measuring(flops, rows):
        return default_kernel(dtype, device), f"default: a pass of {flops:.2g} flops is not worth measuring"
    dname = "float64" if dtype == torch.float64 else "float32"
    info = machine_kernels(cache=cache, rows=rows)
    name = info["choice"][dname]
    rate = info["rates"][dname][name]
    cond = info.get("conditions")
    loaded = ", measured under load" if isinstance(cond, dict) and under_load(cond) else ""
    shape = "x".join(str(n) for n in info["panel"])
    lead = max(info["rates"][dname], key=info["rates"][dname].get)
    held = f"; {lead} ran faster but holds the GIL the reads need" if lead != name else ""
    return name, (f"fastest for {dname} panels here, {rate:.0f} GFLOP/s on {shape}{loaded}{held} "
                  f"({info['source']}: {info['cache']})")
