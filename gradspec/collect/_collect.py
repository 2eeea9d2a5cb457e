"""`collect`: train with gradspec's DP-SGD trainer and record its clipped gradients in a store.

The trainer is :func:`gradspec.train.train`; this is the recording entry point the CLI's
``gradspec collect`` calls: the trainer run with ``write_store=True``, its rows going into a
:class:`~gradspec.collect.GradientRecorder` (``GradientRecorder.for_trainer``), the recorder
every other training loop records through.
"""

from __future__ import annotations

from pathlib import Path

from gradspec.collect._recorder import GradientRecorder
from gradspec.tasks import Task
from gradspec.train import StepHooks, TrainConfig, TrainResult, train

__all__ = ["collect"]


def collect(
    config: TrainConfig | None = None,
    *,
    out: str | Path,
    task: Task | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    writer: bool = True,
    stop_after: int | None = None,
    hooks: StepHooks | None = None,
    write_store: bool = True,
    allow_larger_epsilon: bool = False,
) -> TrainResult:
    """Train with DP-SGD and stream clipped gradients into ``out/gradients.zarr``.

    The run owns ``out`` while it runs: a second writer (another process, or another
    thread) is refused with a :class:`~gradspec.store.DirectoryBusyError`
    naming the owner's pid. The lock cannot go stale: the kernel drops it when the
    owner exits or is killed.

    Args:
        config, out, task, resume, overwrite, progress, writer, stop_after, hooks,
            allow_larger_epsilon: as in :func:`gradspec.train.train` (one place documents
            them; ``config`` defaults to ``CollectConfig()``, the text task).
        write_store: write the gradient store (the point of ``collect``); ``False`` only
            trains, as :func:`gradspec.train.train` does by default.

    Returns:
        A :class:`~gradspec.train.TrainResult` (also known as ``CollectResult``).

    Raises:
        ValueError: bad settings, a resume whose settings or task differ from the saved run,
            a damaged run, non-finite gradients.
        FileExistsError: ``out`` holds a run and neither resume nor overwrite was asked, or
            ``out`` is not empty and not a run directory.
        DirectoryBusyError: another process is writing to ``out``.
    """
    return train(config, out=out, task=task, resume=resume, overwrite=overwrite, progress=progress,
                 writer=writer, stop_after=stop_after, hooks=hooks, write_store=write_store,
                 allow_larger_epsilon=allow_larger_epsilon, sink=GradientRecorder.for_trainer)
