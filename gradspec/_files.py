"""Reading a small file gradspec keeps for itself (a cache) without trusting what is at its name.

A cache lives in a folder anyone with the user's rights can change: a FIFO at its name blocked
a plain ``open`` forever, and a huge file was read whole before it was found wrong.
:func:`read_regular` opens without blocking, checks the opened file (``fstat``: no race
between the check and the read) and reads at most the bytes asked for.
"""

from __future__ import annotations

import os
import stat


class NotRegularFile(ValueError):
    """What is at the name is not a regular file (a FIFO, a directory, a device)."""


class FileTooLarge(ValueError):
    """The file holds more bytes than the reader takes; ``size`` says how many."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


def read_regular(path: str | os.PathLike, *, max_bytes: int) -> bytes:
    """The bytes of ``path``, read only if it is a regular file of at most ``max_bytes``.

    Links are followed (a user may link their cache elsewhere); what they lead to is checked.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        OSError: it cannot be opened or read.
        NotRegularFile: it is not a regular file ("not a regular file").
        FileTooLarge: it holds more than ``max_bytes`` ("N bytes, over the M ...").
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO: no wait for a writer
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile("not a regular file")
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
    finally:
        os.close(fd)
