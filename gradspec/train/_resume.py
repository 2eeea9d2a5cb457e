"""Resuming a run: check everything a resume depends on, then roll the run directory back
to its last checkpoint (see ``gradspec.train._loop`` for what a resume may change)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch

from gradspec._files import write_text_atomic
from gradspec.tasks import Task
from gradspec.train._checkpoint import (
    CHECKPOINT_NAME,
    CONFIG_NAME,
    METRICS_NAME,
    RUN_NAME,
    STORE_NAME,
    load_checkpoint,
    open_resumable,
    read_run_config,
    saved_run_config,
)
from gradspec.train._config import (
    RESUMABLE,
    TrainConfig,
    bind_task,
    flag,
    merge_resume,
)
from gradspec.train._distributed import Ranks
from gradspec.train._hooks import StepHooks
from gradspec.train._run import _Run
from gradspec.train._sketching import plan_of_store

logger = logging.getLogger(__name__)


def _restore_run(
    config: TrainConfig | None, task: Task | None, out: Path, progress: bool, hooks: StepHooks | None,
    ranks: Ranks | None = None, run_info: dict[str, Any] | None = None,
):
    """The run in ``out`` rebuilt at its last checkpoint, reading only: (run, checkpoint state,
    saved settings, saved run config, settings, task). Every rank of a distributed resume
    does this; the writer then checks and rolls back the directory (:func:`_prepare_resume`)."""
    saved = read_run_config(out)
    if task is None and saved.custom_task:
        bind_task(saved, None)  # raises, saying how to resume such a run from Python
    if config is not None:
        given = (bind_task(config, task)[0] if task is not None else config).to_dict()
    elif task is not None:
        bound = bind_task(saved, task)[0]
        given = {"task": bound.task, "task_options": bound.task_options}
    else:
        given = {}
    config = merge_resume(saved, given)
    config, task = bind_task(config, task) if task is None else (config, task)
    required = ("step", "rows", "model", "optimizer", "metrics_offset", "layout")
    state = load_checkpoint(out / CHECKPOINT_NAME, required=required)
    run_cfg = saved_run_config(out)
    _same_as_recorded(saved, run_cfg.get("collect"), out, given)
    run_info = _same_run_info(run_cfg.get("run_info"), run_info, out)
    sigma = state.get("noise_multiplier", run_cfg.get("noise_multiplier"))
    torch.manual_seed(config.seed)
    run = _Run(config, task, out, progress, hooks, sigma=sigma, ranks=ranks, plan=_store_plan(out, config))
    run.restore(state)
    run.run_info = run_info
    run.norm_shares = run_cfg.get("norm_shares")  # measured when the run began
    return run, state, saved, run_cfg, config, task


def _store_plan(out: Path, config: TrainConfig) -> Any:
    """The sketch plan a resumed run continues with: its store's, when the store was written
    with the run's sketch settings (its new rows must share the old rows' map, even one made
    by rules this gradspec no longer makes, a version-1 plan, or by a warm-up batch that need
    not run again); None otherwise (other settings are refused by `_check_sketch`)."""
    if config.sketch is None or not (out / STORE_NAME).exists():
        return None
    from gradspec.store import GradientStore

    try:
        plan = plan_of_store(GradientStore.open(out / STORE_NAME, mode="r").sketch, config)
    except (OSError, ValueError):  # a damaged store: open_resumable says what is wrong
        return None
    if plan is not None:
        logger.info("resume: the store's sketch plan (version %s, columns by %s) is kept",
                    plan.to_dict().get("version"), plan.weighting)
    return plan


def _same_run_info(saved: dict[str, Any] | None, given: dict[str, Any] | None, out: Path) -> dict[str, Any] | None:
    """The run's recorded ``run_info``, after checking that a resume given one was started with it."""
    if given is None:
        return saved
    saved = saved or {}  # ``given`` arrives as it is saved (train() normalises it)
    keys = sorted(k for k in {*saved, *given} if saved.get(k) != given.get(k))
    if keys:
        raise ValueError(f"{str(out)!r} was started with other caller settings (run_info {keys[0]!r}: "
                         f"{saved.get(keys[0])!r:.80} -> {given.get(keys[0])!r:.80}); resume it as it was "
                         "started, or start it anew with --overwrite")
    return saved


def _prepare_resume(
    config: TrainConfig | None, task: Task | None, out: Path, progress: bool, hooks: StepHooks | None,
    write_store: bool, allow_larger_epsilon: bool, ranks: Ranks | None = None,
    run_info: dict[str, Any] | None = None,
):
    """Check everything a resume depends on, then (and only then) roll the run back to its checkpoint."""
    run, state, saved, run_cfg, config, task = _restore_run(config, task, out, progress, hooks, ranks, run_info)
    store = open_resumable(out, state, saved, run.store_layout.to_list(), write_store=write_store, run_config=run_cfg)
    if store is not None:  # the same sketch, and what the resume keeps verified, before training a step
        _check_sketch(store, run)
        kept = int(state["rows"])
        store.check_resumable(kept, "the run's store", "start it anew with --overwrite")
    if not run.last_eval and store is not None:  # a checkpoint from before last_eval was saved
        run.last_eval = dict(store.config.get("final_metrics") or {})

    done = int(state["step"])
    planned = int(state.get("total_steps") or run_cfg.get("steps") or run.steps)
    if run.steps < done:
        raise ValueError(f"the run has done {done} steps: {run.steps} steps would end before that; "
                         f"give --steps >= {done}")
    # The calibration: the target epsilon and the steps sigma was calibrated for. A resume that
    # changed the steps made the run a fixed-sigma one; its history entry keeps the calibration,
    # so that a later resume is held to it too (found by review: --steps 29, then --steps 40,
    # ran past the calibrated 30 steps to epsilon 4.596 against the target 4, unasked).
    calibrated = _calibration(saved, planned, run_cfg.get("resumes") or [])
    extends = run.steps > planned and calibrated is not None and run.steps > calibrated[1]
    if extends and run.sigma > 0 and not allow_larger_epsilon:
        target, steps = calibrated  # type: ignore[misc]
        raise ValueError(
            f"the noise multiplier {run.sigma:.4g} was calibrated for epsilon = {target:g} over {steps} "
            f"steps; {run.steps} steps at that noise multiplier end at epsilon = {run.planned_epsilon(run.steps):.3f}: "
            "pass --allow-larger-epsilon to accept that, or start a new run with "
            f"--epsilon {target:g} --steps {run.steps} (the noise multiplier recalibrated)"
        )
    if run.steps != planned and saved.target_epsilon is not None and run.sigma > 0:
        # sigma stays what the steps taken used: from now on the run is a fixed-sigma run.
        config = dataclasses.replace(config, noise_multiplier=run.sigma, target_epsilon=None)
        run.set_config(config)
    if run.steps != planned and run.sigma > 0:
        logger.log(logging.WARNING if run.steps > planned else logging.INFO,
                   "resume: %d -> %d steps at noise multiplier %.4g: epsilon at the end %.3f -> %.3f (delta = %.3g)",
                   planned, run.steps, run.sigma, run.planned_epsilon(planned),
                   run.planned_epsilon(run.steps), run.delta)

    # Checked; now change the directory.
    changed = {flag(k): [saved.to_dict()[k], v] for k, v in config.to_dict().items() if saved.to_dict()[k] != v}
    if changed:
        logger.info("resume with changed settings: %s", changed)
        write_text_atomic(out / CONFIG_NAME, config.to_json())
        entry = {"at_step": done, "changed": changed,
                 **({"calibrated": {"epsilon": calibrated[0], "steps": calibrated[1]}} if calibrated else {})}
        history = [*run_cfg.get("resumes", []), entry]
        if store is not None:
            store.update_config(collect=config.to_dict(), steps=run.steps, noise_multiplier=run.sigma,
                                resumes=history)
        else:
            write_text_atomic(out / RUN_NAME, json.dumps({**run.run_config(), "resumes": history},
                                                         indent=2, default=str))
    if store is not None and int(run_cfg.get("world_size", 1)) != run.ranks.world_size:
        store.update_config(world_size=run.ranks.world_size)  # resumed on another number of processes
    if store is not None:
        store.truncate(int(state["rows"]))  # rows after the checkpoint are regenerated identically
        if run.step < run.steps and store.status != "writing":
            store.update_config(final_epsilon=None, final_metrics=None)
            store.set_status("writing")
    with open(out / METRICS_NAME, "r+b") as f:
        f.truncate(int(state["metrics_offset"]))
    logger.info("resuming at step %d of %d", run.step, run.steps)
    return run, store, task


def _same_as_recorded(saved: TrainConfig, recorded: Any, out: Path, given: dict[str, Any]) -> None:
    """config.json must say what the run config its store (digest-protected) or run.json recorded
    beside it: every resume writes both (found by review: one flipped bit in config.json's steps,
    20 -> 28, resumed eight steps more, exit 0). Not compared: settings this resume may change
    and gives (its own choice), the noise multiplier and target (a resume converting a
    calibrated run writes them one file after the other), and keys the record lacks (an older
    gradspec). The one check of config.json against the record (it was also made, for the
    settings a resume may not change, in ``open_resumable``)."""
    if not isinstance(recorded, dict):
        return
    mine = saved.to_dict()
    skip = {*(k for k in given if k in RESUMABLE), "noise_multiplier", "target_epsilon"}
    differ = [k for k in mine if k in recorded and k not in skip and recorded[k] != mine[k]]
    if differ:
        k = differ[0]
        raise ValueError(f"{str(out / CONFIG_NAME)!r} says {flag(k)} {mine[k]!r:.60}, the run config recorded with "
                         f"its rows {recorded[k]!r:.60}: it was edited or damaged; restore it, or start the run "
                         "anew with --overwrite")


def _calibration(saved: TrainConfig, planned: int, history: list[dict[str, Any]]) -> tuple[float, int] | None:
    """(target epsilon, steps) the run's noise multiplier was calibrated for, or None (a run
    started with a fixed noise multiplier): from the saved config while it still has its
    target, else from the last resume entry that recorded it."""
    if saved.target_epsilon is not None:
        return float(saved.target_epsilon), int(planned)
    for entry in reversed(history):
        cal = entry.get("calibrated") if isinstance(entry, dict) else None
        if isinstance(cal, dict) and cal.get("epsilon") is not None and cal.get("steps") is not None:
            return float(cal["epsilon"]), int(cal["steps"])
    return None


def _check_sketch(store, run) -> None:
    """A sketched run resumes only with the plan its store was written with (regenerated from
    the store's ``gradspec.sketch``, whose factors the new rows must share)."""
    from gradspec.sketch import same_plan

    have = store.sketch
    if same_plan(have, run.plan):  # the run made the plan (and set it up) from the same settings
        return
    want = run.plan.to_dict() if run.plan is not None else None
    what = (lambda d: "no sketch" if d is None else  # noqa: E731
            f"--sketch {d['requested_M']} --sketch-seed {d['seed']} --sketch-blocks {len(d['blocks'])}")
    raise ValueError(f"the run's store holds rows of {what(have)} but this resume would write {what(want)}: "
                     "resume with the store's sketch settings, or start a new run (--overwrite)")
