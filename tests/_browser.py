"""Headless Chromium for the tests that render pages (the run report, the documentation site):
find the browser, load a page, return its DOM and its console.

Chromium prints every console message of the page (errors, failed loads, Content-Security-
Policy refusals, uncaught exceptions) to stderr as ``...:CONSOLE:<line>] "message", source:
...`` when started with ``--enable-logging=stderr --v=0``; ``--dump-dom`` prints the DOM once
the page has loaded. Plain subprocesses: no driver, nothing to install but the browser.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")


def chromium() -> str | None:
    """The browser to use: $GRADSPEC_CHROMIUM, else chromium on PATH or /usr/bin/chromium."""
    for candidate in (os.environ.get("GRADSPEC_CHROMIUM"), shutil.which("chromium"),
                      shutil.which("chromium-browser"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def load(page: Path, profile: Path, *, extra: tuple[str, ...] = (), timeout: float = 300) -> tuple[str, list[str]]:
    """``(DOM, console lines)`` of ``page`` opened from disk in a fresh profile (``extra``: more
    flags, e.g. ``--virtual-time-budget=5000`` to let a page's scripts run first)."""
    exe = chromium()
    assert exe, "no chromium"
    proc = subprocess.run(
        [exe, *FLAGS, *extra, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def screenshot(page: Path, png: Path, profile: Path, *, size: str = "1200,2400", timeout: float = 300) -> None:
    exe = chromium()
    assert exe, "no chromium"
    subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={size}",
                    page.resolve().as_uri()], capture_output=True, timeout=timeout, check=True)
