"""Whether a Gram kernel leaves Python's GIL to other threads while it runs.

A pass reads its next column blocks on a read-ahead thread (``store._prefetch``) whose Python
needs the GIL between reads. numpy's and torch's products release it; scipy's f2py BLAS
wrappers (``ssyrk``, ``dsyrk``) hold it for the whole call. Timed alone such a kernel can lead
(on a quiet 2-core EPYC, 2026-12-02, 1,500 × 8,192 float32 panels: scipy's syrk 144-166
GFLOP/s against numpy's 153-158), yet in a pass it starves the reads: the Gram pass of a
1,500 × 4e5 store took 7.4-8.4 s with scipy's syrk, its products waiting 0.7-1.2 s for reads,
against 6.3-6.9 s and 0.22-0.25 s with numpy's. A thread that yields the GIL in a loop (as a
reader does between reads) advanced 4,300 times a second during scipy's update against
16,300-17,000 during the others' and 18,000 idle.

``gil_share`` measures that share on one update; ``_kernel_choice`` chooses the fastest
kernel among those that leave at least :data:`GIL_MIN` of it (the fastest of all where none
does), since every large pass reads ahead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: The share of the GIL a kernel must leave other threads to be chosen by measurement.
GIL_MIN = 0.5
#: How long the idle rate of the yielding thread is measured (seconds).
IDLE_S = 0.05


def _ticks(run: Callable[[], object]) -> tuple[float, float]:
    """(iterations a second of a thread yielding the GIL in a loop while ``run()`` runs, the
    seconds ``run`` took)."""
    done = threading.Event()
    count = [0]
    started = threading.Event()

    def loop() -> None:
        started.set()
        while not done.is_set():
            count[0] += 1
            time.sleep(0)  # give the GIL up and take it back, as a reader between reads

    thread = threading.Thread(target=loop, name="gradspec-gil-probe", daemon=True)
    thread.start()
    started.wait()
    count[0] = 0
    t0 = time.perf_counter()
    run()
    seconds = time.perf_counter() - t0
    ticks = count[0]
    done.set()
    thread.join()
    return ticks / max(seconds, 1e-9), seconds


def idle_rate() -> float:
    """Iterations a second of the yielding thread while the caller sleeps (``gil_share``'s 1)."""
    return _ticks(lambda: time.sleep(IDLE_S))[0]


def gil_share(run: Callable[[], object], idle: float | None = None) -> tuple[float, float]:
    """-> (the share of the GIL ``run()`` left to another thread, the seconds ``run`` took).

    The share is that thread's iteration rate while ``run`` ran over ``idle`` (its rate while the
    caller slept: ``idle_rate()``, measured here when None), clipped to [0, 1]: 1 all of it, 0 none."""
    idle = idle_rate() if idle is None else idle
    busy, seconds = _ticks(run)
    return (float(min(1.0, max(0.0, busy / idle))) if idle > 0 else 1.0), seconds


def settled_share(first: Callable[[], object], again: Callable[[], object],
                  idle: float | None = None) -> tuple[float, float]:
    """-> (the share of the GIL ``first()`` left, the seconds it took), where a share below
    :data:`GIL_MIN` is measured once more on ``again()`` and the larger kept: other work on the
    machine only lowers a measured share, and one low sample decided the choice. numpy's syrk
    left 0.87-1.0 on a quiet 2-core EPYC (2026-12-02), yet measured 0.47 once on a 2-core Xeon
    (2026-12-03, right after a test run), and a full GEMM at half its rate was chosen instead."""
    share, seconds = gil_share(first, idle)
    if share < GIL_MIN:
        share = max(share, gil_share(again, idle)[0])
    return share, seconds


def choose(rates: dict[str, float], shares: dict[str, float] | None) -> str:
    """The fastest kernel of ``rates`` among those leaving at least :data:`GIL_MIN` of the GIL
    (``shares``; a kernel without a share counts as leaving it); the fastest of all if none does."""
    shares = shares or {}
    free = {name: rate for name, rate in rates.items() if shares.get(name, 1.0) >= GIL_MIN}
    pool = free or rates
    return max(pool, key=pool.get)
