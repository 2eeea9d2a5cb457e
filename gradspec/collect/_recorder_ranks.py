"""A recorder inside a user's own distributed loop (DDP, Opacus ``DPDDP``, a Hugging Face
``Trainer`` under ``torchrun``): rank 0 records, the other ranks take part in each step's
collectives and write nothing.

Every rank builds its recorder and calls it at the same points (a DDP loop runs the same
code on every rank). Under DDP the gradient a per-step row reads (``.grad``) is already
the average over the ranks, the same on each; what each rank knows alone — its batch size,
its loss, its examples' norms — is combined by :func:`step_over_ranks` so that rank 0's row
names the global batch. The collectives themselves are :class:`gradspec.train.Ranks`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from gradspec.train import Ranks, current_ranks


class NoWriter:
    """The writer of a rank that does not write: takes rows, writes none, commits at once."""

    rows_written = 0

    def put(self, rows: Any, meta: Any, release: Callable[[], None] | None = None) -> None:
        if release is not None:
            release()  # nothing is written here: the rows' memory is free at once

    def commit(self, callback: Callable[[int], None] | None = None, *, wait: bool = False) -> None:
        if callback is not None:
            callback(0)

    def wait(self) -> None:
        pass

    def close(self) -> None:
        pass


def recorder_ranks(distributed: bool | None, *, per_example: bool) -> Ranks:
    """The recorder's :class:`Ranks`: the process group's (``distributed`` None or True), or
    one process (``False``: every process records into its own store).

    Raises:
        ValueError: ``distributed=True`` without an initialised process group; per-example
            rows on several ranks (not supported: each rank's examples are its own).
    """
    if distributed is False:
        return Ranks()
    ranks = current_ranks()
    if distributed and not ranks.active:
        raise ValueError("distributed=True needs an initialised torch.distributed process group of several "
                         "processes (torch.distributed.init_process_group, or torchrun)")
    if ranks.active and per_example:
        raise ValueError(
            f"per-example rows from {ranks.world_size} ranks into one store are not supported: record "
            "per-step rows, or pass distributed=False to give each rank its own run directory (out=)"
        )
    return ranks


def step_over_ranks(ranks: Ranks, *, batch_size: int | None, loss: float, norms: Any,
                    what: str) -> tuple[int | None, float, np.ndarray | None]:
    """The step's global batch size (the sum of the ranks'; None if a rank gave none), loss
    (the ranks' losses weighted by their batch sizes when known, else their mean; NaN ones
    left out) and per-example norms (every rank's, in rank order; None if a rank gave none)."""
    local = (None if batch_size is None else int(batch_size), float(loss),
             None if norms is None else np.asarray(_numpy(norms), dtype=np.float64).reshape(-1))
    reports = ranks.gather(local, what=what)
    sizes = [r[0] for r in reports]
    total = None if any(b is None for b in sizes) else int(sum(sizes))
    known = [(b, value) for b, value in zip(sizes, (r[1] for r in reports), strict=True) if not math.isnan(value)]
    if not known:
        mean = math.nan
    elif total is not None and sum(b for b, _ in known) > 0:
        mean = sum(b * value for b, value in known) / sum(b for b, _ in known)
    else:
        mean = sum(value for _, value in known) / len(known)
    all_norms = None if any(r[2] is None for r in reports) else np.concatenate([r[2] for r in reports])
    return total, mean, all_norms


def _numpy(values: Any) -> np.ndarray:
    detach = getattr(values, "detach", None)
    return detach().to("cpu").double().numpy() if detach is not None else np.asarray(values)
