"""Reading a small file gradspec keeps for itself (a cache) without trusting what is at its name.

A cache lives in a folder anyone with the user's rights can change: a FIFO at its name blocked
a plain ``open`` forever, and a huge file was read whole before it was found wrong.
:func:`read_regular` opens without blocking, checks the opened file (``fstat``: no race
between the check and the read) and reads at most the bytes asked for; :func:`check_regular`
does the same for a large file it hashes in pieces against a pinned size and SHA-256.
The writing side: :func:`write_text_atomic` (never a torn file, never through a planted link)
and :func:`json_sha256`, the digest a JSON record carries so that its reader can check it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class NotRegularFile(ValueError):
    """What is at the name is not a regular file (a FIFO, a directory, a device), or is a
    symbolic link where none is followed (``linked``)."""

    def __init__(self, message: str = "not a regular file", *, linked: bool = False) -> None:
        super().__init__(message)
        self.linked = linked


class FileTooLarge(ValueError):
    """The file holds more bytes than the reader takes; ``size`` says how many."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


@contextlib.contextmanager
def open_regular(path: str | os.PathLike, *, follow_links: bool = True) -> Iterator[tuple[int, os.stat_result]]:
    """The descriptor and ``fstat`` of ``path``, opened without blocking and only if it is a
    regular file (the check is of the opened file: no race between it and the reads).
    ``follow_links=False``: a symbolic link at ``path`` is refused, not followed.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        OSError: it cannot be opened.
        NotRegularFile: it is not a regular file ("not a regular file"), or a link not followed.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO: no wait for a writer
    try:
        fd = os.open(path, flags if follow_links else flags | os.O_NOFOLLOW)
    except OSError as exc:
        if follow_links or exc.errno != errno.ELOOP:
            raise
        raise NotRegularFile("a symbolic link", linked=True) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile("not a regular file")
        yield fd, info
    finally:
        os.close(fd)


def read_regular(path: str | os.PathLike, *, max_bytes: int, follow_links: bool = True) -> bytes:
    """The bytes of ``path``, read only if it is a regular file of at most ``max_bytes``.

    Links are followed (a user may link their cache elsewhere); what they lead to is checked.
    ``follow_links=False`` (a store's chunk) refuses a link instead.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        OSError: it cannot be opened or read.
        NotRegularFile: it is not a regular file ("not a regular file").
        FileTooLarge: it holds more than ``max_bytes`` ("N bytes, over the M ...").
    """
    with open_regular(path, follow_links=follow_links) as (fd, info):
        if info.st_size > max_bytes:
            raise FileTooLarge(f"{info.st_size:,} bytes, over the {max_bytes:,} expected", info.st_size)
        chunks, n = [], 0
        while n <= max_bytes:  # the file may grow after fstat: never past max_bytes + 1
            chunk = os.read(fd, max_bytes + 1 - n)
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        if n > max_bytes:
            raise FileTooLarge(f"over the {max_bytes:,} bytes expected", n)
        return b"".join(chunks)


def check_regular(path: str | os.PathLike, *, size: int, sha256: str,
                  skip: Callable[[os.stat_result], bool] | None = None) -> os.stat_result:
    """Raise unless ``path`` is a regular file of ``size`` bytes whose SHA-256 is ``sha256``,
    hashed in 1 MiB pieces (a large file is never held whole; for bytes to parse, hash what
    :func:`read_regular` returns instead). ``skip(fstat)`` true skips the hash (a file already
    checked and unchanged). Returns the opened file's ``fstat``.

    Raises:
        FileNotFoundError, OSError, NotRegularFile: as :func:`open_regular`.
        ValueError: another size ("N bytes, not the M pinned") or hash ("SHA-256 …, not the pinned …").
    """
    with open_regular(path) as (fd, info):
        if skip is not None and skip(info):
            return info
        if info.st_size != size:
            raise ValueError(f"{info.st_size:,} bytes, not the {size:,} pinned")
        digest, n = hashlib.sha256(), 0
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
            n += len(chunk)
        if n != size or digest.hexdigest() != sha256:
            raise ValueError(f"SHA-256 {digest.hexdigest()[:12]}…, not the pinned {sha256[:12]}…")
        return info


def json_sha256(value: Any) -> str:
    """SHA-256 (hex) of ``value`` as canonical JSON (keys sorted): the digest of a record gradspec
    writes as JSON, computed alike when it is written and when it is read back."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, allow_nan=True).encode()).hexdigest()


def unlink_planted(tmp: Path) -> None:
    """Remove whatever sits at the temporary name ``tmp`` first: a link planted there would be
    written through."""
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink()


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` through a temporary file of this process's own, created
    exclusively (``O_EXCL | O_NOFOLLOW``: nothing planted there is written through, and two
    processes writing the same file never share one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a temporary file (never a torn file)."""
    tmp = path.with_name(path.name + ".partial")
    unlink_planted(tmp)
    tmp.write_text(text)
    os.replace(tmp, path)
