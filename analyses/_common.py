"""What every reproduction does the same way: statistics over seeds, the claims table,
JSON for ``results.json``, installed versions and the log on stderr.

Each analysis keeps the record shape its committed ``results.json`` has (which keys, and
what a single seed's std is); the arithmetic and the table layout live here once.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["claims_markdown", "installed_version", "json_safe", "log_to_stderr", "seed_stats"]

CLAIM_KEYS = ("claim", "paper", "ours", "reproduced")


def seed_stats(values: Iterable[float], *, single: float | None = math.nan) -> dict[str, Any]:
    """Mean, sample standard deviation (ddof 1), standard error of the mean and count.

    Args:
        values: one number per seed.
        single: what ``std`` and ``se`` are with fewer than two values (each analysis has
            its convention: ``nan``, ``0.0`` or ``None``).

    Returns:
        ``{"mean", "std", "se", "n"}``; ``mean`` is ``nan`` when there are no values.
    """
    a = np.asarray(list(values), dtype=np.float64)
    n = int(a.size)
    std = float(a.std(ddof=1)) if n > 1 else single
    return {"mean": float(a.mean()) if n else math.nan, "std": std,
            "se": std / math.sqrt(n) if n > 1 else single, "n": n}


def claims_markdown(rows: Iterable[Mapping[str, str] | Sequence[str]], *, ours: str = "ours",
                    pipes_to_slashes: bool = False) -> str:
    """The ``| claim | paper | ours | reproduced? |`` table of a reproduction.

    Args:
        rows: dicts with the keys ``claim``, ``paper``, ``ours``, ``reproduced``, or
            sequences of those four cells in that order.
        ours: the header of the third column (what its numbers are).
        pipes_to_slashes: write a ``|`` inside a cell as ``/`` (a cell quoting a norm
            ``||x||`` would otherwise end the cell early).
    """
    lines = [f"| claim | paper | {ours} | reproduced? |", "|---|---|---|---|"]
    for row in rows:
        cells = [row[k] for k in CLAIM_KEYS] if isinstance(row, Mapping) else list(row)
        if pipes_to_slashes:
            cells = [c.replace("|", "/") for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def json_safe(x: Any) -> Any:
    """``x`` as ``json.dumps`` takes it, non-finite floats as ``null`` (an infinite epsilon of a
    non-private run, the std of one seed): numpy values as Python ones, tuples and arrays as
    lists, paths as strings, dict keys as strings. (The stores' ``gradspec.store.jsonable``
    writes non-finite floats as strings instead.)"""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_safe(x.tolist())
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, Path):
        return str(x)
    return x


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name``, None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def log_to_stderr(*, fmt: str = "%(asctime)s %(message)s", quiet: Iterable[str] = ("gradspec",)) -> None:
    """INFO lines with a timestamp on stderr; the loggers in ``quiet`` only from WARNING."""
    logging.basicConfig(level=logging.INFO, format=fmt, stream=sys.stderr)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
