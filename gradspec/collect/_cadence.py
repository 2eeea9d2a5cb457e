"""When a recorder commits on its own: every ``every`` recorded steps, at most once every
``seconds``.

A commit writes each row's metadata arrays (about a dozen small zarr writes) on the writer
thread, whose Python holds the GIL the training loop needs: in a 5 ms Opacus step, recording
with a commit every 32 steps took 1.43x a plain step, with commits a second apart 1.29x (2-core
Xeon, 2026-11-28; docs/bench_opacus_recording.txt). Steps slower than ``seconds / every``
commit every ``every`` steps as before.
"""

from __future__ import annotations

import time


class CommitCadence:
    """Counts recorded steps since the last commit and says when the next one is due."""

    def __init__(self, every: int, seconds: float) -> None:
        if every < 1:
            raise ValueError(f"commit_every must be a positive number of steps, got {every}")
        if not seconds >= 0:
            raise ValueError(f"commit_seconds must be a number of seconds >= 0, got {seconds}")
        self.every, self.seconds = int(every), float(seconds)
        self.steps = 0
        self._last = time.monotonic()

    def stepped(self) -> bool:
        """One more recorded step: whether a commit is due now."""
        self.steps += 1
        return self.steps >= self.every and time.monotonic() - self._last >= self.seconds

    def committed(self) -> None:
        """A commit was asked for (any: automatic or explicit)."""
        self.steps = 0
        self._last = time.monotonic()
