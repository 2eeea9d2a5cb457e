"""The DP-SGD trainer: `train` runs a model, and (for `gradspec.collect`) streams clipped
gradients into a gradient store.

One step (Abadi et al. 2016; Li et al. 2022 §4.2):

1. sample a batch (Poisson with rate q, or a shuffled fixed-size batch);
2. per-example gradients of the selected parameters, in microbatches;
3. flat clipping to norm C over the selected parameters;
4. the row(s) to store: the average of the clipped gradients *before* noise
   (mode ``batch``) or each clipped gradient (mode ``per-example``);
5. Gaussian noise of std sigma*C on the sum, divided by the expected batch
   size (q*n under Poisson sampling, B under shuffling), and an optimizer step;
6. the accountant records the step.

A run directory holds ``gradients.zarr`` (the store), ``metrics.jsonl``,
``config.json`` and ``checkpoint.pt``, and is owned by one process at a time
(:class:`gradspec.store.RunLock`, taken before anything in it is created,
replaced or removed, and held until the run ends). Rows are committed together
with a checkpoint every ``checkpoint_every`` steps, so ``resume=True`` continues
from the last checkpoint and reproduces the rows of an uninterrupted run.

A resume keeps everything that decides what a step computes; it may change only
the settings in :data:`~gradspec.train._config.RESUMABLE` (the run's length,
how often it evaluates, logs and checkpoints, memory use). Changing the length
of a run whose sigma was calibrated for a target epsilon keeps that sigma (the
steps already taken used it): the run becomes a fixed-sigma run, and extending it
past the steps sigma was calibrated for needs ``allow_larger_epsilon=True``
(``--allow-larger-epsilon``), because its epsilon then exceeds the target.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gradspec._device import resolve_device
from gradspec._enums import CollectMode
from gradspec._files import write_text_atomic
from gradspec._json import as_saved
from gradspec.tasks import Task
from gradspec.train._checkpoint import (
    CHECKPOINT_NAME,
    CONFIG_NAME,
    METRICS_NAME,
    RUN_NAME,
    STORE_NAME,
    check_new_run,
    clear_run,
    read_run_config,
    save_checkpoint,
)
from gradspec.train._config import TrainConfig, bind_task
from gradspec.train._distributed import Ranks, process_group
from gradspec.train._hooks import StepHooks
from gradspec.train._result import CollectResult, TrainResult, evaluate, package_versions
from gradspec.train._resume import _prepare_resume, _restore_run
from gradspec.train._run import _Run
from gradspec.train._sink import RowSinkFactory, open_sink

logger = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_NAME", "CONFIG_NAME", "METRICS_NAME", "STORE_NAME", "CollectResult", "TrainResult",
           "evaluate", "package_versions", "resolve_device", "train"]


def train(
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
    write_store: bool = False,
    allow_larger_epsilon: bool = False,
    sink: RowSinkFactory | None = None,
    run_info: dict[str, Any] | None = None,
) -> TrainResult:
    """Train with DP-SGD in the run directory ``out``; with ``write_store``, also stream the
    clipped gradients into ``out/gradients.zarr`` through ``sink`` (what
    :func:`gradspec.collect` does, with a ``GradientRecorder``).

    The run owns ``out`` while it runs: a second writer (another process, or another
    thread) is refused with a :class:`~gradspec.store.DirectoryBusyError`
    naming the owner's pid. The lock cannot go stale: the kernel drops it when the
    owner exits or is killed.

    Args:
        config: run settings (default: ``TrainConfig()``, the text task). On resume:
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
        write_store: write a gradient store; ``False`` (the default) only trains (metrics
            and checkpoints are still written), as ``gradspec retrain`` does.
        sink: with ``write_store``, builds the :class:`~gradspec.train.RowSink` the rows go
            into from the store the trainer created or opened (``gradspec.collect`` passes
            ``GradientRecorder.for_trainer``); required then.
        allow_larger_epsilon: on resume, allow more steps than a target-epsilon run's
            sigma was calibrated for (its epsilon then exceeds the target; it is reported).
        run_info: a caller's own settings (JSON-able), recorded in the run config as
            ``run_info`` and kept across resumes; a resume given one refuses a run that was
            started with another (``gradspec.optim.retrain`` records its algorithm and options).

    Returns:
        A :class:`TrainResult`.

    Raises:
        ValueError: bad settings, a resume whose settings or task differ from the saved run,
            a damaged run, non-finite gradients.
        FileExistsError: ``out`` holds a run and neither resume nor overwrite was asked, or
            ``out`` is not empty and not a run directory.
        DirectoryBusyError: another process is writing to ``out``.
    """
    from gradspec.store import RunLock

    out = Path(out)
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if stop_after is not None and stop_after < 1:
        raise ValueError(f"--stop-after must be >= 1, got {stop_after}")
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if run_info is not None:  # as it is saved, so a resume compares like with like
        run_info = as_saved(run_info)
    if write_store and sink is None:
        raise ValueError("write_store=True needs sink= (a RowSink factory); gradspec.collect.collect passes "
                         "GradientRecorder.for_trainer")
    with process_group() as ranks:
        if not ranks.is_writer:  # another rank of a distributed run: it never writes in ``out``
            return _follow(config, task, out, ranks, resume=resume, hooks=hooks, stop_after=stop_after,
                           write_store=write_store)
        lock = RunLock(out, what="run directory")
        try:
            try:
                run, store, task = _setup(config, task, out, lock, ranks, resume=resume, overwrite=overwrite,
                                          progress=progress, hooks=hooks, write_store=write_store,
                                          allow_larger_epsilon=allow_larger_epsilon, run_info=run_info)
            except BaseException as err:
                ranks.agree(err, what="setting up the run")  # every rank stops with this error
                raise
            # The other ranks build the run from these settings, once the directory is ready.
            ranks.agree(None, what="setting up the run", payload=run.config.to_dict())
            ranks.agree(None, what="setting up the run on the other ranks")
            _start_together(run, ranks)
            return _train(run, store, task, out, progress=progress, writer=writer, stop_after=stop_after,
                          sink=sink, ranks=ranks, stores_rows=store is not None)
        finally:
            lock.release()


def _setup(config: TrainConfig | None, task: Task | None, out: Path, lock, ranks: Ranks, *, resume: bool,
           overwrite: bool, progress: bool, hooks: StepHooks | None, write_store: bool,
           allow_larger_epsilon: bool, run_info: dict[str, Any] | None = None) -> tuple[_Run, Any, Task]:
    """The writer's run: checked, and the run directory created, replaced or rolled back to its
    checkpoint, under ``lock`` (taken here, released by the caller)."""
    from gradspec.sketch import plan_attribute
    from gradspec.store import GradientStore

    # Refuse what can be refused before the lock file is created (a foreign directory gets none).
    if resume:
        read_run_config(out)
    else:
        check_new_run(out, overwrite=overwrite)

    # An existing directory is locked at once (a second writer fails fast); a new one only
    # once the settings have been checked, so that bad settings leave nothing behind.
    if out.is_dir():
        lock.acquire()
    if resume:
        return _prepare_resume(config, task, out, progress, hooks, write_store, allow_larger_epsilon, ranks,
                               run_info)
    config, task = bind_task(config or TrainConfig(), task)
    torch.manual_seed(config.seed)
    run = _Run(config, task, out, progress, hooks, ranks=ranks)
    if run_info is not None:
        run.run_info = run_info
    if write_store and config.every >= run.steps > 1:
        raise ValueError(
            f"--every {config.every} with {run.steps} steps stores step 0 only: "
            f"give --every below {run.steps}"
        )
    run.measure_norm_shares()  # after the cheap checks: it costs a batch of per-example work
    if not lock.held:
        lock.acquire()
    replace_old = check_new_run(out, overwrite=overwrite)  # again: the directory is ours only now
    # Everything that can fail on bad settings has run; only now is the old run removed.
    if replace_old:
        logger.info("replacing the run in %s (%s)", out, ", ".join(clear_run(out)))
    write_text_atomic(out / CONFIG_NAME, config.to_json())  # first: it marks the directory as a run
    store = None
    if write_store:
        store = GradientStore.create(
            out / STORE_NAME, layout=run.store_layout, config=run.run_config(), dtype=str(config.dtype),
            per_example=config.mode == CollectMode.PER_EXAMPLE, compressor=config.compressor,
            sketch=plan_attribute(run.plan) if run.plan is not None else None,
        )
    else:
        write_text_atomic(out / RUN_NAME, json.dumps(run.run_config(), indent=2, default=str))
    (out / METRICS_NAME).write_text("")
    return run, store, task


def _follow(config: TrainConfig | None, task: Task | None, out: Path, ranks: Ranks, *, resume: bool,
            hooks: StepHooks | None, stop_after: int | None, write_store: bool) -> TrainResult:
    """A rank other than the writer: the same run and steps, built from the writer's settings once
    the writer has prepared ``out`` (read only on a resume: the checkpoint), writing nothing."""
    payloads = ranks.agree(None, what="setting up the run")
    error, run = None, None
    try:
        config = TrainConfig.from_dict(payloads[0])
        if resume:
            run, *_, task = _restore_run(config, task, out, False, hooks, ranks)
        else:
            config, task = bind_task(config, task)
            torch.manual_seed(config.seed)
            run = _Run(config, task, out, False, hooks, ranks=ranks)
            run.measure_norm_shares(measure=False)  # the writer measures them
    except BaseException as err:  # noqa: BLE001 - every rank stops with it, this one too
        error = err
    ranks.agree(error, what="setting up the run on the other ranks")
    _start_together(run, ranks)
    return _train(run, None, task, out, progress=False, writer=False, stop_after=stop_after, sink=None,
                  ranks=ranks, stores_rows=write_store)


def _start_together(run: _Run, ranks: Ranks) -> None:
    """Every rank starts from the writer's parameters (a model built without a seed differs
    between processes, as DDP assumes too) and checks that it runs the same run."""
    if not ranks.active:
        return
    ranks.broadcast_([*run.model.parameters(), *run.model.buffers()], what="the starting parameters")
    ranks.check_same(run.fingerprint(), what="the ranks' starting state")


def _train(run: _Run, store, task: Task, out: Path, *, progress: bool, writer: bool,
           sink: RowSinkFactory | None, stop_after: int | None, ranks: Ranks, stores_rows: bool) -> TrainResult:
    """The training loop of a new or resumed run, inside the run directory's lock (on the
    writer; the other ranks of a distributed run take the same steps, ``stores_rows`` as the
    writer does, to hand it their share of per-example rows, and write nothing)."""
    config = run.config
    metrics_path, ckpt_path = out / METRICS_NAME, out / CHECKPOINT_NAME
    rows_sink = open_sink(sink, store, max_queue=config.writer_queue, background=writer)
    lead = ranks.is_writer
    metrics = open(metrics_path, "a") if lead else None  # noqa: SIM115 - closed in finally
    bar = None
    if progress and lead:
        from tqdm.auto import tqdm

        bar = tqdm(total=run.steps, initial=run.step, desc="collect" if store is not None else "train", unit="step", file=sys.stderr, dynamic_ncols=True)

    def log(record: dict[str, Any]) -> None:
        if metrics is None:
            return
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()

    def checkpoint() -> None:
        if ranks.active:  # the ranks still hold the same run, before it is saved
            ranks.check_same(run.fingerprint(), what=f"the ranks' state at step {run.step}")
        if not lead:
            return
        snap = run.snapshot(rows_sink.rows_recorded, metrics.tell())

        def save(n_rows: int) -> None:
            assert n_rows == snap["rows"], (n_rows, snap["rows"])
            save_checkpoint(ckpt_path, snap)

        rows_sink.commit(callback=save)

    start_step, t0 = run.step, time.perf_counter()
    try:
        while run.step < run.steps:
            if stop_after is not None and run.step - start_step >= stop_after:
                break
            step = run.step
            rows, meta, stats = run.train_step(store_row=stores_rows and step % config.every == 0)
            if rows is not None:
                rows_sink.put_rows(rows, meta)
            done = run.step
            if done % config.log_every == 0 or done == run.steps:
                eps = run.accountant.epsilon(run.delta) if run.sigma > 0 else math.inf
                log({"step": done, "epoch": run.sampler.epoch, **stats, "epsilon": eps,
                     "time": round(time.perf_counter() - t0, 3)})
                if bar is not None:
                    bar.set_postfix(loss=f"{stats.get('loss', float('nan')):.3f}", eps=f"{eps:.2f}")
            if lead and ((config.eval_every and done % config.eval_every == 0) or done == run.steps):
                run.last_eval = evaluate(task, run.model, run.device)
                log({"step": done, **run.last_eval})
                logger.info("step %d: %s", done, run.last_eval)
            if done % config.checkpoint_every == 0 or done == run.steps:
                checkpoint()
            if bar is not None and done < run.steps:
                bar.update(1)
            elif bar is not None:  # the last step: close() draws it, once, at the run's average rate
                bar.n = done
        if run.step > start_step and run.step % config.checkpoint_every != 0 and run.step != run.steps:
            checkpoint()  # stopped early (stop_after): make the stopping point resumable
        eps = run.accountant.epsilon(run.delta) if run.sigma > 0 else math.inf
        if run.step >= run.steps:  # finished: the store gets its final epsilon and is complete
            rows_sink.close(complete=True, final_epsilon=eps, final_metrics=run.last_eval)
        else:  # stopped early: the privacy spent so far, for info and the report (metrics.jsonl
            # holds epsilon only every --log-every steps)
            spent = {"spent_epsilon": eps, "spent_at_step": run.step} if run.sigma > 0 else {}
            rows_sink.close(complete=False, **spent)
    except BaseException:
        # Keep what is safely written; never mark an interrupted store complete.
        try:
            rows_sink.close(complete=False)
        except Exception:  # noqa: BLE001 - the original error matters more
            logger.debug("writer close after failure also failed", exc_info=True)
        raise
    finally:
        if metrics is not None:
            metrics.close()
        if bar is not None:
            bar.close()

    return TrainResult(
        out=out, store=out / STORE_NAME if store is not None else None, metrics=metrics_path,
        rows=store.n_rows if store is not None else 0, steps=run.step,
        noise_multiplier=run.sigma, sample_rate=run.q, accounted_sample_rate=run.acct_q, delta=run.delta, epsilon=eps,
        final_metrics=dict(run.last_eval), rank=ranks.rank, world_size=ranks.world_size,
    )
