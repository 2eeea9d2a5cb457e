"""Read ahead: run block reads on a background thread while the consumer computes."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def prefetch_iter(tasks: Sequence[Callable[[], T]], depth: int = 2) -> Iterator[T]:
    """Yield ``task()`` for each task in order, keeping ``depth`` of them in flight.

    With ``depth=0`` the tasks run inline. Reading is I/O and decoding that
    releases the GIL, so one background thread overlaps it with compute.
    """
    if depth <= 0:
        for task in tasks:
            yield task()
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gradspec-prefetch")
    pending: deque[Future[T]] = deque()
    it = iter(tasks)
    try:
        for task in it:
            pending.append(pool.submit(task))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
