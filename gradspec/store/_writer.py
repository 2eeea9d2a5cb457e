"""The background writer: training hands rows over a bounded queue; a thread writes them.

Rows are buffered until a chunk's worth of rows is ready, so each chunk is
written once. A *commit* flushes the buffer, advances the store's committed row
count and then runs an optional callback (the trainer saves its checkpoint
there): the checkpoint never gets ahead of the committed rows, so a kill at any
moment leaves a checkpoint that a resume can continue from (rows committed after
it are truncated and regenerated identically).
An error on the writer thread (a full disk, say) is raised in the training
thread at its next call, naming how many rows are safely committed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from gradspec.store._gradients import GradientStore

logger = logging.getLogger(__name__)

_STOP = object()

#: Bytes of rows that may wait for the writer thread by default.
QUEUE_BYTES = 1 << 30


class WriterError(OSError):
    """The background writer failed; committed rows are intact."""


class BackgroundWriter:
    """Write rows to a :class:`GradientStore` on a background thread.

    Args:
        store: a store open for writing; rows go after its committed rows.
        max_queue: rows that may wait for the thread; the trainer blocks when
            another hand-off would pass it (a batch of per-example rows counts each
            row), or pass ``max_bytes``. A hand-off into an empty queue always goes
            through, so one batch larger than either bound is still written.
        max_bytes: bytes of rows that may wait (default 1 GiB: at p = 22M, 64
            waiting float32 rows would hold 5.6 GB).
        background: ``False`` writes synchronously in the caller (for tests
            and for measuring what the thread saves).

    Example:
        >>> w = BackgroundWriter(store)  # doctest: +SKIP
        >>> w.put(rows, meta); w.commit(); w.close()  # doctest: +SKIP
    """

    def __init__(self, store: GradientStore, *, max_queue: int = 64, max_bytes: int = QUEUE_BYTES,
                 background: bool = True) -> None:
        self.store = store
        self._next = store.n_rows  # next row index to write (writer side)
        self._handed = store.n_rows  # rows handed over by the caller (caller side)
        self._buffer: list[dict[str, np.ndarray]] = []  # metadata of the buffered rows
        self._rowbuf: np.ndarray | None = None  # one row chunk: float32 rows, or a 16-bit store's on-disk rows
        self._buffered = 0
        self._error: BaseException | None = None
        self._background = background
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, max_queue))
        self._max_rows, self._max_bytes = max(1, int(max_queue)), max(1, int(max_bytes))
        self._waiting = [0, 0]  # rows, bytes handed over and not yet written (background only)
        self._room = threading.Condition()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="gradspec-writer", daemon=True)
            self._thread.start()

    # ----------------------------------------------------------- caller side
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            raise WriterError(
                f"writing to {self.store.path!r} failed ({type(err).__name__}: {err}); "
                f"{self.store.n_rows} rows were committed before it (`gradspec info --verify` checks them) — fix "
                "the cause and rerun with --resume"
            ) from err

    def _submit(self, item: Any) -> None:
        self._raise_if_failed()
        if self._background:
            while True:
                try:
                    self._queue.put(item, timeout=0.5)
                    return
                except queue.Full:
                    self._raise_if_failed()
        else:
            self._handle(item)

    def _reserve(self, n: int, nbytes: int) -> None:
        """Wait until ``n`` rows of ``nbytes`` fit within the bounds (an empty queue takes any)."""
        with self._room:
            while self._waiting[0] and (self._waiting[0] + n > self._max_rows
                                        or self._waiting[1] + nbytes > self._max_bytes):
                self._room.wait(0.5)
                self._raise_if_failed()
            self._waiting[0] += n
            self._waiting[1] += nbytes

    def _release(self, n: int, nbytes: int) -> None:
        with self._room:
            self._waiting[0] -= n
            self._waiting[1] -= nbytes
            self._room.notify_all()

    def put(self, rows: np.ndarray, meta: dict[str, Any], release: Callable[[], None] | None = None) -> None:
        """Queue rows (float32, (b, p)) with their metadata (arrays of length b, or (b, k)).

        A 16-bit store's rows may come in its on-disk form (float16, or bfloat16's bits as
        uint16) with ``meta["dtype_stats"]`` (``GradientStore.write_rows``): half the bytes wait.
        ``release`` is called once the rows are copied into the writer's chunk buffer (or the
        writer could not take them): from then on the caller may reuse their memory."""
        n = 1 if np.ndim(rows) == 1 else len(rows)
        nbytes = int(getattr(rows, "nbytes", 0))
        item = ("rows", rows, meta, n, nbytes, release)
        if self._background:
            try:
                self._raise_if_failed()
                self._reserve(n, nbytes)
                self._submit(item)
            except BaseException:
                if release is not None:
                    release()  # never queued: nothing will read them
                raise
        else:
            self._submit(item)  # handled here and now: `_handle` releases, written or not
        self._handed += n

    @property
    def waiting(self) -> tuple[int, int]:
        """(rows, bytes) handed over and not yet written by the thread."""
        with self._room:
            return self._waiting[0], self._waiting[1]

    def commit(self, callback: Callable[[int], None] | None = None, *, wait: bool = False) -> None:
        """Flush queued rows, advance the committed count, then run ``callback(n_committed)``."""
        done = threading.Event()
        self._submit(("commit", callback, done))
        if wait:
            self.wait(done)

    def wait(self, event: threading.Event | None = None) -> None:
        """Block until everything handed over so far is written and committed (or ``event`` is set).

        Raises:
            WriterError: the writer thread failed (its error is the cause); the rows committed
                before it stay safe.
        """
        if event is None:
            event = threading.Event()
            self._submit(("commit", None, event))
        while not event.wait(0.2):
            self._raise_if_failed()
            if self._thread is not None and not self._thread.is_alive():
                break
        self._raise_if_failed()

    def close(self, callback: Callable[[int], None] | None = None) -> None:
        """Commit everything (running ``callback``), stop the thread, re-raise any error.

        Then shrink the store's arrays to its committed rows (``GradientStore.finalize``), so
        that plain zarr reads exactly them; writing more later grows them again.
        """
        self.commit(callback, wait=True)
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
        self._raise_if_failed()
        self.store.finalize()

    @property
    def rows_written(self) -> int:
        """Rows handed to the writer so far (queued, buffered, written or committed)."""
        return self._handed

    # ----------------------------------------------------------- writer side
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                if self._error is not None:
                    if item[0] == "commit":
                        item[2].set()
                    elif item[5] is not None:
                        item[5]()  # never written: the caller's memory is free
                    continue
                self._handle(item)
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                logger.debug("writer failed", exc_info=True)
                self._error = exc
                if item[0] == "commit":
                    item[2].set()
            finally:
                if item[0] == "rows":
                    self._release(item[3], item[4])

    def _handle(self, item: tuple) -> None:
        if item[0] == "rows":
            try:
                self._take_rows(item[1], item[2])
            finally:
                if item[5] is not None:
                    item[5]()  # copied into the chunk buffer (or failed): the caller's memory is free
            return
        _, callback, done = item
        try:
            self._flush()
            # Count first, then the callback (the trainer's checkpoint): a kill between the
            # two leaves committed rows beyond the last checkpoint, which a resume truncates
            # and regenerates identically. The other order left a checkpoint ahead of the
            # committed rows, which no resume could use.
            self.store.commit(self._next)
            if callback is not None:
                callback(self._next)
        finally:
            done.set()

    def _take_rows(self, rows: Any, meta: dict[str, Any]) -> None:
        """Copy rows into the chunk-row buffer, writing each row chunk as it fills."""
        rows = np.asarray(rows)
        if rows.dtype not in (np.float16, np.uint16):  # a 16-bit store's on-disk rows stay so
            rows = rows.astype(np.float32, copy=False)
        if rows.ndim == 1:
            rows = rows[None]
        rpc = self.store.chunks[0]
        # (b,) per field; a field with a value per row and column (param_norms) keeps its rows
        meta = {k: (v.reshape(v.shape[0], -1) if v.ndim > 1 else v.reshape(-1))
                for k, v in ((k, np.asarray(v)) for k, v in meta.items())}
        # Copy rows into a chunk-row buffer; flush whenever it reaches the end of a row chunk,
        # so every chunk is written once and no further concatenation is needed.
        if self._rowbuf is None or self._rowbuf.shape[1] != rows.shape[1] or self._rowbuf.dtype != rows.dtype:
            self._flush()  # (rows of another form than those buffered: they go as a partial chunk)
            self._rowbuf = np.empty((rpc, rows.shape[1]), rows.dtype)
        while rows.shape[0]:
            room = rpc - (self._next + self._buffered) % rpc
            take = min(room, rows.shape[0])
            self._rowbuf[self._buffered : self._buffered + take] = rows[:take]
            self._buffer.append({k: v[:take] for k, v in meta.items()})
            self._buffered += take
            rows, meta = rows[take:], {k: v[take:] for k, v in meta.items()}
            if take == room:
                self._flush()

    def _flush(self) -> None:
        if not self._buffered:
            return
        meta = {k: np.concatenate([m[k] for m in self._buffer]) for k in self._buffer[0]}
        self.store.write_rows(self._next, self._rowbuf[: self._buffered], meta)
        self._next += self._buffered
        self._buffer.clear()
        self._buffered = 0
