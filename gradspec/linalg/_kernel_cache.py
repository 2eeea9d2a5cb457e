"""The Gram-kernel choice's cache file: where it lives, what a valid entry holds, reading it
(a regular file of at most ``MAX_CACHE_BYTES``, opened without blocking) and writing it whole.
What is cached, and when it is measured again, is ``_kernel_choice``'s."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from gradspec._files import read_regular
from gradspec.linalg._kernels import GRAM_KERNELS

logger = logging.getLogger(__name__)

CACHE_ENV = "GRADSPEC_CACHE_DIR"
CACHE_FILE = "gram_kernels.json"
CACHE_VERSION = 1
#: The largest cache file read (bytes); an entry is about 1 KB.
MAX_CACHE_BYTES = 1 << 20


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


def _panel_ok(panel: Any) -> bool:
    return isinstance(panel, list) and len(panel) == 2 and all(type(n) is int and n > 0 for n in panel)


def valid_entry(entry: Any) -> bool:
    """Whether a cache entry holds what a choice reads: a known kernel per dtype, chosen among
    its measured rates (finite, > 0), and the panel they were measured on."""
    if not isinstance(entry, dict):
        return False
    # everything a choice reads (found by review: a chosen kernel without a rate, or no panel,
    # stopped pca with a KeyError instead of being measured again)
    choice, rates, panel = entry.get("choice"), entry.get("rates"), entry.get("panel")
    if not isinstance(choice, dict) or not isinstance(rates, dict) or not _panel_ok(panel):
        return False
    for dname in ("float32", "float64"):
        if choice.get(dname) not in GRAM_KERNELS or choice.get(dname) not in (rates.get(dname) or {}):
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


def read_cache(path: Path) -> dict[str, Any] | None:
    """The cache file's entries, or None (absent; or damaged, not a regular file or over
    ``MAX_CACHE_BYTES``, with a warning). Opened without blocking, checked on the open file."""
    try:
        raw = read_regular(path, max_bytes=MAX_CACHE_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring the Gram-kernel cache %r (%s); measuring again", str(path), exc)
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
            raise ValueError(f"not a version-{CACHE_VERSION} kernel cache")
        entries = data.get("entries")
        if not isinstance(entries, dict):
            raise ValueError("no entries")
        return entries
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        logger.warning("ignoring the damaged Gram-kernel cache %r (%s); measuring again", str(path), exc)
        return None


def write_cache(path: Path, entries: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not write the Gram-kernel cache %r (%s); the choice holds for this process",
                       str(path), exc)
