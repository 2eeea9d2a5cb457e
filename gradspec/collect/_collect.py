"""`collect`: train with gradspec's DP-SGD trainer and record its clipped gradients in a store.

The trainer is :func:`gradspec.train.train`; this is the recording entry point the CLI's
``gradspec collect`` calls: the trainer run with ``write_store=True``, its rows going into a
:class:`~gradspec.collect.GradientRecorder` (``GradientRecorder.for_trainer``), the recorder
every other training loop records through.
"""

from __future__ import annotations

import inspect
from typing import Any

from gradspec.collect._recorder import GradientRecorder
from gradspec.train import TrainConfig, TrainResult, train

__all__ = ["collect"]


def collect(config: TrainConfig | None = None, **options: Any) -> TrainResult:
    """Train with DP-SGD and stream clipped gradients into ``out/gradients.zarr``.

    The run owns ``out`` while it runs: a second writer (another process, or another
    thread) is refused with a :class:`~gradspec.store.DirectoryBusyError`
    naming the owner's pid. The lock cannot go stale: the kernel drops it when the
    owner exits or is killed.

    Args:
        config: as in :func:`gradspec.train.train`; defaults to ``CollectConfig()``, the
            text task.
        **options: ``out``, ``task``, ``resume``, ``overwrite``, ``progress``, ``writer``,
            ``stop_after``, ``hooks`` and ``allow_larger_epsilon``, as in
            :func:`gradspec.train.train` (one place documents them); and ``write_store``:
            write the gradient store (the point of ``collect``); ``False`` only trains, as
            :func:`gradspec.train.train` does by default.

    Returns:
        A :class:`~gradspec.train.TrainResult` (also known as ``CollectResult``).

    Raises:
        ValueError: bad settings, a resume whose settings or task differ from the saved run,
            a damaged run, non-finite gradients.
        FileExistsError: ``out`` holds a run and neither resume nor overwrite was asked, or
            ``out`` is not empty and not a run directory.
        DirectoryBusyError: another process is writing to ``out``.
    """
    if "sink" in options:
        raise TypeError("collect() writes through a GradientRecorder; call gradspec.train.train(sink=...) "
                        "for another sink")
    try:  # the trainer's keywords, checked before anything runs
        _SIGNATURE.bind(config, **options)
    except TypeError as err:  # e.g. "collect() got an unexpected keyword argument 'stpes'"
        raise TypeError(f"collect() {err}") from None
    options.setdefault("write_store", True)
    return train(config, sink=GradientRecorder.for_trainer, **options)


def _collect_signature() -> inspect.Signature:
    """`train`'s signature (its one owner) as `collect` takes it: no ``sink``, and
    ``write_store`` on by default."""
    sig = inspect.signature(train)
    params = [p.replace(default=True) if p.name == "write_store" else p
              for p in sig.parameters.values() if p.name != "sink"]
    return sig.replace(parameters=params)


_SIGNATURE = _collect_signature()
collect.__signature__ = _SIGNATURE  # help(collect) and IDEs show the trainer's keywords
