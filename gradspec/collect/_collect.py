"""`collect`: train with gradspec's DP-SGD trainer and record its clipped gradients in a store.

The trainer is :func:`gradspec.train.train`; this is the recording entry point the CLI's
``gradspec collect`` calls, the trainer run with ``write_store=True``.
"""

from __future__ import annotations

from pathlib import Path

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
        config: run settings (default: ``CollectConfig()``, the text task). On resume:
            None (continue as saved), or the saved settings with only those in
            :data:`~gradspec.train.RESUMABLE` changed (e.g. more ``steps``).
        out: run directory (store, metrics, config, checkpoint): new, empty, or a
            gradspec run directory.
        task: a user's own :class:`~gradspec.tasks.Task`; default builds ``config.task``.
            A task not built by the registry is saved as ``custom:<name>``; resume such a
            run by passing the same task again.
        resume: continue the run in ``out`` from its last checkpoint.
        overwrite: replace the run in ``out`` (only its own files; a directory that is
            not a gradspec run directory is never cleared).
        progress: show a progress bar on stderr.
        writer: write rows on a background thread (``False``: synchronously).
        stop_after: stop (with a checkpoint) after this many steps in this call (>= 1);
            for splitting long runs and for tests.
        hooks: changes to the DP-SGD step (the private optimizers of ``gradspec.optim``).
        write_store: write a gradient store; ``False`` only trains (metrics and
            checkpoints are still written), like :func:`gradspec.train.train`.
        allow_larger_epsilon: on resume, allow more steps than a target-epsilon run's
            sigma was calibrated for (its epsilon then exceeds the target; it is reported).

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
                 allow_larger_epsilon=allow_larger_epsilon)
