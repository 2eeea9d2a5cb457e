"""Entry point of the `gradspec` console script.

Command modules import only typer at import time; torch, zarr and transformers
are imported inside the commands, so ``gradspec --help`` is instant.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from cli import account, collect, decay, info, pca, replay, report, retrain
from cli._common import setup_logging

app = typer.Typer(
    name="gradspec",
    help="Spectral analysis of gradient subspaces in (differentially private) training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain (click) help: it wraps every column to the terminal. Rich's panels cut long option
    # names at 80 columns ("--noise-multipli…") once a panel holds a long flag pair or metavar.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"gradspec {version('gradspec')}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging (and full tracebacks)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Warnings and errors only."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    setup_logging(verbose, quiet)


# A reader that stops early (`gradspec info STORE | head -4`) closes stdout under us.
CLOSED_STDOUT_EXIT = 141  # what a shell reports for a tool killed by SIGPIPE (128 + 13)


def _quiet_on_closed_stdout(command: Callable[..., Any]) -> Callable[..., Any]:
    """Stop without a word when stdout is closed (exit 141), for every command.

    The command's own error handling (`cli._common.user_errors`) lets BrokenPipeError
    through to here; typer's would exit 1, which `info` uses for a damaged store.
    SIGPIPE stays ignored (as Python sets it), so a broken socket in a long run is still an
    error and not a silent death.
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            # Python flushes stdout again at exit: let that flush go to /dev/null (a test
            # runner's stdout has no file descriptor: nothing to do there).
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(CLOSED_STDOUT_EXIT) from None

    return wrapper


for _name, _command in (
    ("collect", collect.collect_command),
    ("info", info.info_command),
    ("account", account.account_command),
    ("pca", pca.pca_command),
    ("replay", replay.replay_command),
    ("decay", decay.decay_command),
    ("plot", decay.plot_command),
    ("report", report.report_command),
    ("retrain", retrain.retrain_command),
):
    # The first paragraph of the docstring in full: click would cut it at 45 characters ("...").
    _summary = " ".join(inspect.cleandoc(_command.__doc__ or "").split("\n\n")[0].split())
    app.command(_name, short_help=_summary)(_quiet_on_closed_stdout(_command))


# torch's CPU allocator asks the kernel for transparent huge pages for blocks of 2 MiB and more
# when this is "1" (kernels in THP "madvise" mode, the common default, give none otherwise).
# Training fills fresh blocks of that size every step (per-example gradients, rows to store):
# with 4 KiB pages each first touch faults, and an Opacus step at p = 1.06M runs 2.6x slower
# (docs/bench_opacus_recording.txt). torch reads the variable once, at its first allocation.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"


def prefer_huge_pages(environ: dict[str, str] | os._Environ[str] | None = None, platform: str = sys.platform) -> bool:
    """Default torch's CPU allocator to huge pages in gradspec's own process (Linux only).

    A value the user set (``THP_MEM_ALLOC_ENABLE=0`` included) is kept. Returns whether it set
    the default. Called before any command imports torch; the library (`GradientRecorder` in a
    user's loop) never sets it: a process-wide allocator flag is the user's choice there.
    """
    environ = os.environ if environ is None else environ
    if not platform.startswith("linux") or HUGE_PAGES_ENV in environ:
        return False
    environ[HUGE_PAGES_ENV] = "1"
    return True


def main() -> None:
    prefer_huge_pages()
    app()


if __name__ == "__main__":
    main()
