"""A sweep folder's summary: ``summary.csv`` and ``summary.json`` of every finished run in it."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from gradspec.optim._result import RESULT_NAME, read_result

logger = logging.getLogger(__name__)

SUMMARY_CSV, SUMMARY_JSON = "summary.csv", "summary.json"


def _earlier_runs(out: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of finished runs in ``out`` that this sweep did not run or reuse (an earlier
    sweep's, e.g. other arms), so the folder's summary lists every run in it; a damaged one
    is left out with a warning (the sweep's own runs are done by then)."""
    mine = {Path(r["out"]).resolve() for r in rows if r.get("out")}
    extra = []
    for result in sorted(out.glob(f"*/{RESULT_NAME}")):
        if result.parent.resolve() in mine:
            continue
        try:
            extra.append(read_result(result.parent).to_row())
        except ValueError as err:
            logger.warning("summary.csv leaves out %s: %s", result.parent.name, err)
    return extra


def write_summary(rows: list[dict[str, Any]], out: Path) -> None:
    """``summary.csv`` (columns: the union of the rows' keys) and ``summary.json``: ``rows``, then
    the folder's other finished runs (``<run>/retrain.json``, each checked as a resumed sweep checks
    it)."""
    rows = rows + _earlier_runs(out, rows)
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    _replace(out / SUMMARY_CSV, table.getvalue())
    clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
             for r in rows]
    _replace(out / SUMMARY_JSON, json.dumps(clean, indent=2))


def _replace(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: two sweeps finishing into one folder (other seeds,
    other arms) each leave a complete summary, the later one's."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    tmp.unlink(missing_ok=True)  # a link planted there would be written through
    tmp.write_text(text, newline="")
    os.replace(tmp, path)
