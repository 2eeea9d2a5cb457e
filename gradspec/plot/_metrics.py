"""A run's ``metrics.jsonl`` read back: the one reader of the file for figures and reports.

The trainer appends one JSON object per line (``step`` with the training loss, ε and the
norm statistics every ``log_every`` steps; ``step`` with the evaluation metrics every
``eval_every`` steps) and flushes each line, so a file that a run is still writing ends in
a whole line or in part of one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["RunMetrics", "load_curve", "read_metrics"]


@dataclass(frozen=True)
class RunMetrics:
    """The records of one ``metrics.jsonl``, with the line each came from.

    Attributes:
        path: the file.
        records: the JSON objects, in file order.
        lines: the 1-based line number of each record.
        partial_line: whether a last line still being written was left out.
    """

    path: str
    records: tuple[dict, ...]
    lines: tuple[int, ...]
    partial_line: bool = False

    def names(self) -> list[str]:
        """The metrics the records hold (every key but ``step``), in first-seen order."""
        out: dict[str, None] = {}
        for rec in self.records:
            out.update((k, None) for k in rec if k != "step")
        return list(out)

    def curve(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of ``metric`` (records without it are skipped).

        Raises:
            ValueError: a record of ``metric`` has a step that is not an integer or a value
                that is not a number (the file and line named).
        """
        steps, values = [], []
        for number, rec in zip(self.lines, self.records, strict=True):
            if metric in rec:
                step, value = rec.get("step"), rec[metric]
                if type(step) is not int or type(value) not in (int, float):
                    raise ValueError(
                        f"{self.path!r} is not a run's metrics.jsonl (line {number} has step {step!r:.20} "
                        f"and {metric} {value!r:.20}, not an integer and a number); rerun that run")
                steps.append(step)
                values.append(value)
        return np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float)

    def last(self, metric: str) -> tuple[int, float] | None:
        """The last ``(step, value)`` of ``metric``, None if no record holds it."""
        steps, values = self.curve(metric)
        return (int(steps[-1]), float(values[-1])) if steps.size else None


def read_metrics(metrics_path: str | Path, *, in_progress: bool = False) -> RunMetrics:
    """The records of a run's ``metrics.jsonl`` (blank lines skipped).

    Args:
        metrics_path: the file.
        in_progress: the run may still be writing it: a last line without its newline is a
            record being written, and is left out (a finished file ends every line).

    Raises:
        ValueError: the file is not UTF-8, or a line is not a JSON object (the file and line
            named).
    """
    damaged = f"{str(metrics_path)!r} is not a run's metrics.jsonl (line %d %s); rerun that run"
    with open(metrics_path, encoding="utf-8") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError:
            raise ValueError(damaged % (0, "is not UTF-8 text")) from None
    partial = bool(in_progress and lines and not lines[-1].endswith("\n"))
    if partial:
        lines.pop()
    records, numbers = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            rec = None
        if not isinstance(rec, dict):
            raise ValueError(damaged % (number, "is not a JSON object"))
        records.append(rec)
        numbers.append(number)
    return RunMetrics(str(metrics_path), tuple(records), tuple(numbers), partial)


def load_curve(metrics_path: str | Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of ``metric`` from a run's ``metrics.jsonl``.

    Raises:
        ValueError: a line is not a JSON object, or a record of ``metric`` has a step that
            is not an integer or a value that is not a number (the file and line named).
    """
    return read_metrics(metrics_path).curve(metric)
