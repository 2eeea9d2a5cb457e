"""Run a function on N local processes joined in a gloo process group, as ``torchrun`` would.

Each process gets the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so gradspec joins the group itself
(:func:`gradspec.train.process_group`). What the function returns, or the error it raised,
comes back pickled, by rank.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(target: Callable[..., Any], rank: int, world: int, port: int, results: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    try:
        out: Any = ("ok", target(rank, *args))
    except BaseException as err:  # noqa: BLE001 - reported to the test
        out = ("error", type(err).__name__, str(err), traceback.format_exc())
    Path(results, f"{rank}.pkl").write_bytes(pickle.dumps(out))


#: Imported once, in the fork server, before any rank is forked from it: a rank then starts in
#: milliseconds, where a spawned one re-imported torch and gradspec (~7 s on 2 cores, twice a
#: test). The server is a fresh single-threaded process (no OpenMP pool, no zarr threads), so a
#: fork of it is safe, and every rank still joins its process group itself after the fork.
PRELOAD = ["torch", "numpy", "zarr", "gradspec.collect", "gradspec.train", "gradspec.store"]


def _context(mp: Any) -> Any:
    """The fork-server context where the platform has one (Linux, macOS), else spawn."""
    try:
        ctx = mp.get_context("forkserver")
    except ValueError:
        return mp.get_context("spawn")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_ranks(target: Callable[..., Any], *args: Any, world: int = 2, timeout: float = 120) -> list[tuple]:
    """``target(rank, *args)`` on ``world`` processes (forked from the preloaded server); by rank:
    ("ok", value), ("error", type name, message, traceback), or ("exit", exit code) for a
    process that died."""
    import torch.multiprocessing as mp

    ctx = _context(mp)
    port = free_port()
    with tempfile.TemporaryDirectory() as results:
        procs = [ctx.Process(target=_entry, args=(target, r, world, port, results, args)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        out = []
        for r, p in enumerate(procs):
            path = Path(results, f"{r}.pkl")
            out.append(pickle.loads(path.read_bytes()) if path.exists() else ("exit", p.exitcode))
        return out
