"""Calling something that must not block (a FIFO in a file's place): fail, never hang the suite."""

from __future__ import annotations

import threading
from typing import Any


def returns_within(call, seconds: float = 30.0) -> tuple[str, Any]:
    """``("ok", result)`` or ``("raised", exception)`` of ``call()``; the test fails if ``call`` is
    still blocked after ``seconds`` (it runs in a daemon thread, so the suite still ends)."""
    box: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            box.append(("ok", call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(("raised", exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "blocked on a name that is not a regular file"
    return box[0]
