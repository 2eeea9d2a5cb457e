"""One writer per directory: an advisory lock that a crash cannot leave stale.

A writer (a `collect` run, a PCA writing its output, a gradient recorder) owns its
directory for as long as it writes there::

    with RunLock(out):
        ...  # create, overwrite, append, delete inside ``out``

The lock is ``flock(2)`` on ``<directory>/.gradspec.lock``. The kernel drops it
when the holder closes the file or dies, SIGKILL and power loss included, so a
lock is never stale and there is nothing to clean up by hand. The file itself
stays (it is tiny); while the lock is held it names its owner (pid, host, start
time), which is what a second writer is told.

Take the lock *before* touching anything in the directory, and lock a directory
that outlives the work (the run directory, not a store inside it that an
overwrite deletes). ``flock`` is honoured on local filesystems and on NFSv4
(Linux maps it to byte-range locks there); on filesystems that do not lock at
all, acquiring fails with an ``OSError`` rather than pretending.

The lock is re-entrant for the thread that holds it (a writer may call another
function that locks the same directory); any other thread or process is refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["LOCK_NAME", "DirectoryBusyError", "RunLock"]

LOCK_NAME = ".gradspec.lock"
#: The most of a lock file :meth:`RunLock.owner` reads (an owner record is ~200 bytes).
_MAX_OWNER_BYTES = 2**16

# Locks this process holds: path -> [fd, owning thread id, depth]. Guarded by _GUARD.
_HELD: dict[str, list[int]] = {}
_GUARD = threading.Lock()


def _drop_inherited() -> None:
    # A forked child shares the parent's open file description (and so its lock);
    # closing the child's copy keeps the lock from outliving a killed parent.
    global _GUARD
    _GUARD = threading.Lock()  # another thread may have held it at the fork
    for fd, _thread, _depth in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited)


class DirectoryBusyError(OSError):
    """Another process (or thread) holds the directory's lock.

    Attributes:
        owner: what the holder wrote into the lock file (``pid``, ``host``,
            ``started``, ``argv``), or an empty dict if it could not be read.
    """

    def __init__(self, message: str, owner: dict[str, Any]) -> None:
        super().__init__(message)
        self.owner = owner


class RunLock:
    """Exclusive ownership of a directory by one process at a time.

    Args:
        directory: the directory to own; created (with parents) if missing.
        name: the lock file's name inside ``directory``.
        timeout: seconds to wait for a busy lock (0: fail at once).
        what: how messages call the directory (e.g. ``"run directory"``).
        subject: how the busy message names what the lock guards, when that is not the
            directory itself (a spectrum store's lock lives in its parent); default: ``what``
            and the directory.

    Raises (from :meth:`acquire`):
        DirectoryBusyError: another process or thread holds the lock; the
            message names its pid, host and start time.

    Example:
        >>> with RunLock(tmp_path / "run"):  # doctest: +SKIP
        ...     write_everything()
    """

    def __init__(
        self, directory: str | os.PathLike, *, name: str = LOCK_NAME, timeout: float = 0.0,
        what: str = "directory", subject: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.path = self.directory / name
        self.timeout = float(timeout)
        self.what = what
        self.subject = subject
        self._key: str | None = None

    # ------------------------------------------------------------------ queries
    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._key is not None

    def owner(self) -> dict[str, Any]:
        """What the current (or a killed) holder wrote into the lock file ({} if none or
        unreadable). Read as data from a folder that may come from someone else: never
        through a link, never from anything but a regular file, at most 64 KiB."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return {}
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return {}
            text = os.read(fd, _MAX_OWNER_BYTES).decode("utf-8", errors="replace")
        except OSError:
            return {}
        finally:
            os.close(fd)
        try:
            data = json.loads(text) if text.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return {}
        return data if isinstance(data, dict) else {}

    # ------------------------------------------------------------------ acquire / release
    def acquire(self) -> RunLock:
        """Take the lock, or raise :class:`DirectoryBusyError` naming its owner."""
        import fcntl

        if self._key is not None:
            raise RuntimeError(f"this RunLock already holds {str(self.path)!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(self.path)
        me = threading.get_ident()
        with _GUARD:
            entry = _HELD.get(key)
            if entry is not None:
                if entry[1] != me:
                    raise self._busy({"pid": os.getpid(), "host": socket.gethostname(),
                                      "thread": "another thread of this process"})
                entry[2] += 1
                self._key = key
                return self
        try:  # O_NOFOLLOW: a lock file linked elsewhere is never written through (nor emptied)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, f"{str(self.path)!r} is a symbolic link: gradspec takes "
                              f"no lock through a link; remove it (the {self.what} is not "
                              "written)") from None
            raise
        try:
            deadline = time.monotonic() + self.timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise self._busy(self._read_owner()) from None
                    time.sleep(0.05)
            info = {"pid": os.getpid(), "host": socket.gethostname(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": _argv()}
            data = (json.dumps(info) + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)  # closing drops the lock if it was taken
            raise
        with _GUARD:
            _HELD[key] = [fd, me, 1]
        self._key = key
        return self

    def release(self) -> None:
        """Give the lock up (idempotent). The lock file stays, emptied."""
        key, self._key = self._key, None
        if key is None:
            return
        with _GUARD:
            entry = _HELD.get(key)
            if entry is None:
                return
            entry[2] -= 1
            if entry[2] > 0:
                return
            del _HELD[key]
        fd = entry[0]
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no owner any more; done before the kernel lets the next one in
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self if self.held else self.acquire()  # ``with RunLock(...).acquire():`` too

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RunLock({str(self.directory)!r}, held={self.held})"

    # ------------------------------------------------------------------ messages
    def _read_owner(self) -> dict[str, Any]:
        # The owner writes its details right after locking; give it a moment.
        for _ in range(10):
            owner = self.owner()
            if owner:
                return owner
            time.sleep(0.02)
        return {}

    def _busy(self, owner: dict[str, Any]) -> DirectoryBusyError:
        pid = owner.get("pid", "unknown")
        where = f" on {owner['host']}" if owner.get("host") else ""
        since = f" since {owner['started']}" if owner.get("started") else ""
        who = f" ({owner['thread']})" if owner.get("thread") else ""
        subject = self.subject or f"{self.what} {str(self.directory)!r}"
        return DirectoryBusyError(
            f"{subject} is in use by pid {pid}{where}{since}{who}: "
            "one writer at a time; wait for it to finish (or stop it), or choose another directory",
            owner,
        )


def _argv() -> list[str]:
    import sys

    return [str(a) for a in sys.argv[:8]]
