"""Write-behind, chunk-aligned writing of a 2-D Zarr array that arrives in row blocks.

The spectral engine streams V (p×k) in panels whose row counts need not match
V's chunks. Writing each panel straight into Zarr makes it read, modify and
rewrite every chunk a panel boundary cuts (several times per chunk), on the
compute thread. :class:`RowBlockWriter` instead gathers rows into whole
chunks and hands each complete chunk to one background thread, so every chunk
is written once while the next panels are computed.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

_STOP = object()


class RowBlockWriter:
    """``writer(offset, rows)`` stores ``rows`` at ``array[offset:offset+len(rows)]``.

    Rows may arrive in any partition and order. A chunk is written when all of
    its rows have arrived; :meth:`flush` writes incomplete chunks (the rows
    never given keep the array's fill value) and waits for every write;
    :meth:`close` flushes and stops the thread. Used as a context manager, it
    closes on success and discards pending writes on an exception. A failed
    write is raised, as it happened, on the next call. A block that covers
    whole chunks is queued without a copy: do not modify it after the call.

    Args:
        array: a 2-D ``zarr.Array`` opened for writing.
        depth: chunks queued for the writer thread before a call waits.
    """

    def __init__(self, array: Any, depth: int = 4) -> None:
        if len(array.shape) != 2:
            raise ValueError(f"RowBlockWriter writes 2-D arrays, not shape {array.shape}")
        self._a = array
        self._n, self._w = int(array.shape[0]), int(array.shape[1])
        self._rows = int(array.chunks[0])
        self._dtype = np.dtype(array.dtype)
        self._pending: dict[int, list[Any]] = {}  # chunk -> [buffer, rows filled]
        self._q: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gradspec-v-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is _STOP:
                    return
                if self._error is None:
                    start, rows = item
                    self._a[start : start + rows.shape[0]] = rows
            except BaseException as exc:  # re-raised on the caller's thread
                self._error = exc
            finally:
                self._q.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            raise OSError(f"writing {self._a.name or 'the array'} failed: {self._error}") from self._error

    def _put(self, start: int, rows: np.ndarray) -> None:
        self._raise()
        self._q.put((start, rows))

    # ------------------------------------------------------------------ writing
    def __call__(self, offset: int, block: np.ndarray) -> None:
        if self._closed:
            raise ValueError("this writer is closed")
        block = np.asarray(block)
        b = block.shape[0]
        if block.ndim != 2 or block.shape[1] != self._w or not 0 <= offset <= self._n - b:
            raise ValueError(
                f"rows of shape {block.shape} at offset {offset} do not fit an array of shape "
                f"({self._n}, {self._w})"
            )
        i, end = int(offset), int(offset) + b
        while i < end:
            c = i // self._rows
            c0, c1 = c * self._rows, min((c + 1) * self._rows, self._n)
            take = min(c1, end) - i
            part = block[i - offset : i - offset + take]
            if i == c0 and take == c1 - c0 and c not in self._pending:
                self._put(c0, np.asarray(part, dtype=self._dtype))
            else:
                entry = self._pending.get(c)
                if entry is None:
                    entry = self._pending[c] = [np.zeros((c1 - c0, self._w), self._dtype), 0]
                entry[0][i - c0 : i - c0 + take] = part
                entry[1] += take
                if entry[1] >= c1 - c0:
                    del self._pending[c]
                    self._put(c0, entry[0])
            i += take

    def flush(self) -> None:
        """Write incomplete chunks too and wait until every write has landed."""
        for c in sorted(self._pending):
            self._put(c * self._rows, self._pending.pop(c)[0])
        self._q.join()
        self._raise()

    def close(self) -> None:
        """Flush and stop the writer thread (idempotent)."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._stop()

    def abort(self) -> None:
        """Drop what is not yet written and stop the writer thread."""
        self._pending.clear()
        self._error = self._error or RuntimeError("aborted")
        self._stop()

    def _stop(self) -> None:
        if not self._closed:
            self._closed = True
            self._q.put(_STOP)
            self._thread.join()

    def __enter__(self) -> RowBlockWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
