"""Where the trainer's gradient rows go: a :class:`RowSink`.

The trainer computes each row it stores (the step's clipped sum before noise over the
expected batch size, or each clipped per-example gradient) and its metadata; it does not
write them itself. It creates the run's store (or opens it on a resume and checks it
against the checkpoint), then hands it to a sink factory and puts its rows into the sink.
``gradspec.collect.collect`` passes ``GradientRecorder.for_trainer``: the recorder that
takes rows from any training loop takes gradspec's own trainer's too, so one object owns
writing, commits and the ``complete`` status of every gradient store. The trainer knows
nothing of ``gradspec.collect``: it only knows this protocol.

Crash safety is the sink's contract: a row counts once :meth:`RowSink.commit` has made it
durable, and the commit's callback runs with the committed row count before the trainer's
checkpoint is saved, so a checkpoint never names rows that are not on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    import numpy as np

    from gradspec.store import GradientStore


class RowSink(Protocol):
    """Takes the trainer's rows and makes them durable."""

    @property
    def rows_recorded(self) -> int:
        """Rows in the store once everything handed over is committed (earlier rows included)."""

    def put_rows(self, rows: np.ndarray, meta: Mapping[str, np.ndarray]) -> None:
        """Hand over rows (b, p) and their per-row metadata, written in order."""

    def commit(self, *, callback: Callable[[int], None] | None = None, wait: bool = False) -> None:
        """Make every row handed over durable; then call ``callback(committed rows)``."""

    def close(self, *, complete: bool = True, **config: Any) -> None:
        """Commit what was handed over; merge ``config`` into the store's run config and mark
        it complete when ``complete`` (a run stopped early or failed stays ``writing``)."""


#: Builds a run's sink from its store: ``factory(store, max_queue=..., background=...)``,
#: ``max_queue`` rows waiting for the writer at most, ``background`` writing on a thread.
RowSinkFactory = Callable[..., RowSink]


class NoRows:
    """The sink of a run that only trains (no store): takes no rows, commits at once."""

    rows_recorded = 0

    def put_rows(self, rows, meta) -> None:
        raise RuntimeError("this run writes no store")

    def commit(self, *, callback: Callable[[int], None] | None = None, wait: bool = False) -> None:
        if callback is not None:
            callback(0)

    def close(self, *, complete: bool = True, **config: Any) -> None:
        pass


def open_sink(factory: RowSinkFactory | None, store: GradientStore | None, *, max_queue: int,
              background: bool) -> RowSink:
    """The sink of a run: ``factory(store)``, or :class:`NoRows` when it writes no store."""
    if store is None:
        return NoRows()
    if factory is None:
        raise ValueError("a run that writes a gradient store needs a row sink; use gradspec.collect.collect "
                         "(or pass sink=gradspec.collect.GradientRecorder.for_trainer)")
    return factory(store, max_queue=max_queue, background=background)


class StepRows:
    """A step's per-example rows, filled microbatch by microbatch into one CPU float32 buffer.

    Keeping each microbatch's rows and concatenating them at the end held every row twice
    (at p = 22.7M and 45 examples a step, 4 GB more at the step's peak)."""

    def __init__(self, n: int, width: int) -> None:
        self.rows = torch.empty((n, width), dtype=torch.float32)
        self.n = 0

    def add(self, rows: torch.Tensor) -> None:
        self.rows[self.n : self.n + rows.shape[0]].copy_(rows)
        self.n += rows.shape[0]

    def full(self) -> torch.Tensor:
        if self.n != self.rows.shape[0]:
            raise RuntimeError(f"a step's per-example rows: {self.n} formed, {self.rows.shape[0]} expected")
        return self.rows
