"""Shared CLI plumbing: one-line errors, logging levels, progress switch."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

# Errors a user can fix: the library raises these with a message that says what to do.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    OSError,
    KeyError,
)


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` on one line to stderr and exit."""
    first = str(message).strip().splitlines()[0] if str(message).strip() else "failed"
    typer.echo(f"error: {first}", err=True)
    raise typer.Exit(code)


def user_errors(fn: F) -> F:
    """Turn the library's user errors into one readable line and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, BrokenPipeError):  # a closed stdout is cli.main's to handle, quietly
            raise
        except KeyboardInterrupt:
            typer.echo("interrupted: committed rows are kept; rerun with --resume", err=True)
            raise typer.Exit(130) from None
        except USER_ERRORS as exc:  # noqa: B014
            if logging.getLogger("gradspec").isEnabledFor(logging.DEBUG):
                raise
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            if isinstance(exc, OSError) and exc.strerror and exc.args[1:2] != ():
                msg = f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
            fail(str(msg))

    return wrapper  # type: ignore[return-value]


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(verbose: bool, quiet: bool) -> None:
    # The other ranks of a torchrun run (RANK > 0) run the same steps as rank 0: they log
    # warnings and errors only, unless --verbose.
    follower = os.environ.get("RANK", "0") not in ("", "0")
    level = logging.DEBUG if verbose else logging.WARNING if quiet or follower else logging.INFO
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("gradspec")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False  # libraries that call logging.basicConfig() must not print our lines twice
    # Libraries we drive: their warnings (e.g. transformers' load report of the
    # freshly initialised classifier head, which is intended) only with --verbose.
    # transformers sets its own level when first imported, from TRANSFORMERS_VERBOSITY.
    if not verbose:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in ("transformers", "opacus"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.ERROR)


def echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))
