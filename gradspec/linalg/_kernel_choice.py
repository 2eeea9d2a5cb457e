"""Choosing the Gram kernel by measurement, once per machine, and remembering the choice.

On first use on a machine (a Gram pass worth at least ``MEASURE_MIN_FLOPS``),
every CPU kernel of ``_kernels.GRAM_KERNELS`` updates a float64 Gram from one
small random panel (``MEASURE_PANEL``), in float32 and in float64; the fastest
of each dtype is used from then on. The measurement takes about a second. It
is cached as JSON in the user's cache directory (``$GRADSPEC_CACHE_DIR``, else
``$XDG_CACHE_HOME/gradspec``, else ``~/.cache/gradspec``), keyed by what decides
the answer: the CPU model and core count, torch's thread count, the BLAS numpy
and torch use, and the numpy, scipy and torch versions. A cache file that cannot
be read, or whose entry is malformed, is ignored with a warning and measured
again — a damaged cache is never trusted. ``pca(kernel=...)`` / ``--kernel``
overrides the choice; ``gradspec info --machine`` prints it and the rates.

Rates are counted symmetric: a Gram update of an r×w panel is r²w flops
whichever kernel computes it (one triangle is all the answer holds).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradspec.linalg._kernels import GRAM_KERNELS, default_kernel, gram_kernel

logger = logging.getLogger(__name__)

CACHE_ENV = "GRADSPEC_CACHE_DIR"
CACHE_FILE = "gram_kernels.json"
CACHE_VERSION = 1
#: Rows × columns of the panel the candidates are timed on.
MEASURE_PANEL = (1024, 768)
#: A Gram pass below r²p = this many flops takes the default kernel without measuring
#: (or reading the cache): a measurement would cost more than it could save.
MEASURE_MIN_FLOPS = 2e10
#: Wall-time budget of one measurement (seconds); a second timed run of a kernel only within it.
MEASURE_BUDGET_S = 1.5
DTYPES = {"float32": torch.float32, "float64": torch.float64}

_memo: dict[tuple[str, str], dict[str, Any]] = {}


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Where the kernel choice is cached: ``override``, ``$GRADSPEC_CACHE_DIR``,
    ``$XDG_CACHE_HOME/gradspec`` or ``~/.cache/gradspec``."""
    if override is not None:
        return Path(override)
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "gradspec"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    panel: tuple[int, int] = MEASURE_PANEL, budget_s: float = MEASURE_BUDGET_S, seed: int = 0
) -> dict[str, dict[str, float]]:
    """GFLOP/s (symmetric-counted, r²w per update) of every CPU kernel, per panel dtype."""
    r, w = panel
    cpu = torch.device("cpu")
    base = np.random.default_rng(seed).standard_normal((r, w))
    flops = float(r) * r * w
    t_start = time.perf_counter()
    rates: dict[str, dict[str, float]] = {}
    for dname, dtype in DTYPES.items():
        p = torch.from_numpy(base).to(dtype).contiguous()
        rates[dname] = {}
        leader = np.inf  # the best time of this dtype so far
        for name, cls in GRAM_KERNELS.items():
            kern = cls(r, cpu)
            best = np.inf
            for _ in range(3):
                t0 = time.perf_counter()
                kern.update(p)  # the first run also pays G's first touch and thread start-up
                best = min(best, time.perf_counter() - t0)
                if best > 2 * leader or time.perf_counter() - t_start > budget_s:
                    break  # clearly not the fastest, or out of time: its best so far stands
            leader = min(leader, best)
            rates[dname][name] = flops / max(best, 1e-9) / 1e9
    logger.info("Gram kernels measured in %.1fs on a %d×%d panel", time.perf_counter() - t_start, r, w)
    return rates


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    choice, rates = entry.get("choice"), entry.get("rates")
    if not isinstance(choice, dict) or not isinstance(rates, dict):
        return False
    for dname in DTYPES:
        if choice.get(dname) not in GRAM_KERNELS:
            return False
        r = rates.get(dname)
        if not isinstance(r, dict) or not r:
            return False
        for name, v in r.items():
            if name not in GRAM_KERNELS or isinstance(v, bool) or not isinstance(v, (int, float)):
                return False
            if not (np.isfinite(v) and v > 0):
                return False
    return True


def _read_cache(path: Path) -> dict[str, Any] | None:
    """The cache file's entries, or None (absent; or damaged, with a warning)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
            raise ValueError(f"not a version-{CACHE_VERSION} kernel cache")
        entries = data.get("entries")
        if not isinstance(entries, dict):
            raise ValueError("no entries")
        return entries
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        logger.warning("ignoring the damaged Gram-kernel cache %r (%s); measuring again", str(path), exc)
        return None


def _write_cache(path: Path, entries: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not write the Gram-kernel cache %r (%s); the choice holds for this process",
                       str(path), exc)


def machine_kernels(*, cache: str | os.PathLike | None = None, remeasure: bool = False) -> dict[str, Any]:
    """The Gram kernel chosen on this machine for float32 and float64 panels, and the rates.

    Reads the cache, or measures (and writes the cache) when it holds no valid entry for
    this machine's key.

    Args:
        cache: cache directory (default: see :func:`cache_dir`).
        remeasure: measure even when the cache holds an entry.

    Returns:
        ``{"choice": {dtype: kernel}, "rates": {dtype: {kernel: GFLOP/s}}, "panel": [r, w],
        "measured_at", "key", "cache" (the file), "source": "cache" | "measured"}``.
    """
    path = cache_dir(cache) / CACHE_FILE
    key = machine_key()
    skey = json.dumps(key, sort_keys=True)
    memo_key = (str(path), skey)
    if not remeasure and memo_key in _memo:
        return dict(_memo[memo_key])
    entries = _read_cache(path) or {}
    entry = None if remeasure else entries.get(skey)
    if entry is not None and not _valid_entry(entry):
        logger.warning("ignoring a malformed entry of the Gram-kernel cache %r; measuring again", str(path))
        entry = None
    source = "cache"
    if entry is None:
        rates = measure()
        entry = {
            "choice": {d: max(r, key=r.get) for d, r in rates.items()},
            "rates": rates,
            "panel": list(MEASURE_PANEL),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        entries[skey] = entry
        _write_cache(path, entries)
        source = "measured"
    out = {**entry, "key": key, "cache": str(path), "source": source}
    _memo[memo_key] = out
    return dict(out)


def choose_gram_kernel(
    kernel: str,
    *,
    dtype: torch.dtype,
    device: torch.device,
    flops: float,
    cache: str | os.PathLike | None = None,
) -> tuple[str, str]:
    """-> (kernel name, why) for a Gram pass of ``flops`` = r²p on float32/float64 panels.

    ``kernel``: a name of ``GRAM_KERNELS`` (checked for the device) or ``"auto"``: one full
    GEMM on CUDA; on the CPU the measured fastest (cached) when the pass is worth it, else
    the default (:func:`~gradspec.linalg._kernels.default_kernel`).
    """
    if kernel != "auto":
        gram_kernel(kernel, device)
        return kernel, "as requested"
    if device.type != "cpu":
        return default_kernel(dtype, device), f"default on {device.type}"
    if flops < MEASURE_MIN_FLOPS:
        return default_kernel(dtype, device), f"default: a pass of {flops:.2g} flops is not worth measuring"
    dname = "float64" if dtype == torch.float64 else "float32"
    info = machine_kernels(cache=cache)
    name = info["choice"][dname]
    rate = info["rates"][dname][name]
    return name, f"fastest for {dname} panels here, {rate:.0f} GFLOP/s ({info['source']}: {info['cache']})"
