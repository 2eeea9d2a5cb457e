"""Who writes a spectrum store: its one-writer lock, the owner it records, and whether
that writer is gone.

One writer per spectrum store, as for runs (``_lock``): ``gradspec pca`` holds
:func:`writer_lock` for its whole run, resumes included. The lock file sits *beside*
the store (``.NAME.lock`` next to ``NAME``), so it outlives an ``--overwrite`` that
replaces the store, and it keeps the pid and host of the last process that took it
when that process is killed. The store itself records the process that created it
(``gradspec.owner``).

A ``running`` store whose writer is gone (killed, or the machine restarted) is reported
as such (:func:`gone_writer`): `gradspec info` says so and how to continue, and a plain
rerun may replace it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from gradspec.store._lock import RunLock
from gradspec.store._zarr import is_url

OWNER_KEY = "gradspec.owner"


def this_process() -> dict[str, Any]:
    """The owner record of the calling process (what a new store records)."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def writer_lock(path: str | os.PathLike) -> RunLock | None:
    """The (not yet taken) one-writer lock of the spectrum store at ``path``; None for a URL.

    Take it before creating, resuming or replacing the store, and hold it until the store
    is finished (or given up): a second writer is refused with
    :class:`~gradspec.store.DirectoryBusyError` naming the first.
    """
    if is_url(path):
        return None
    where = Path(path)
    # was: "spectrum store 'sp.zarr' 'pe' is in use" (the store's name, then its parent folder)
    return RunLock(where.parent, name=f".{where.name}.lock", what=f"spectrum store {where.name!r}",
                   subject=f"the spectrum store {str(path)!r}")


def alive(owner: dict[str, Any] | None) -> bool:
    """Whether the process an owner record names may still be running.

    True unless it ran on this host and its pid is gone (another host: unknown, assume alive).
    """
    owner = _record(owner)
    if owner is None or owner["host"] != socket.gethostname():
        return True  # no pid to ask about, or another host's: unknown
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs, as another user
        return True
    return True


def _record(owner: Any) -> dict[str, Any] | None:
    """An owner record as data from someone else: a host and a pid, else None (no record)."""
    if not isinstance(owner, dict) or not isinstance(owner.get("host"), str):
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
        return None
    return owner


def _is_this_process(owner: dict[str, Any]) -> bool:
    return owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()


def gone_writer(path: str | os.PathLike, recorded: dict[str, Any] | None) -> dict[str, Any] | None:
    """The owner record of a store's writer when that writer is known to be gone, else None.

    The writer is the process that last took the store's lock (:func:`writer_lock`; a
    resumed run takes it anew, so it is the resuming process), or, when the lock names no
    one else (no lock file, released, or held by this very process: a pca deciding whether
    it may replace the store), the process that created it (``recorded``, the store's
    ``gradspec.owner``). Call it for a ``running`` store only: any other status has no writer.
    """
    lock = writer_lock(path)
    holder = _record(lock.owner()) if lock is not None else None
    if holder is None or _is_this_process(holder):
        holder = _record(recorded)
    return None if holder is None or alive(holder) else holder
