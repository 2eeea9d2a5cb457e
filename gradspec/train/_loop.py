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

import contextlib
import copy
import dataclasses
import json
import logging
import math
import sys
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradspec._device import resolve_device
from gradspec._enums import CollectMode, GradDtype, PerExampleBackend, Sampling
from gradspec.tasks import Task
from gradspec.train._checkpoint import (
    CHECKPOINT_NAME,
    CONFIG_NAME,
    METRICS_NAME,
    RUN_NAME,
    STORE_NAME,
    check_new_run,
    clear_run,
    layout_difference,
    load_checkpoint,
    open_resumable,
    read_run_config,
    save_checkpoint,
    saved_run_config,
    write_text_atomic,
)
from gradspec.train._config import (
    TrainConfig,
    bind_task,
    flag,
    merge_resume,
)
from gradspec.train._context import StepContext
from gradspec.train._hooks import StepHooks
from gradspec.train._sampling import PoissonSampler, ShuffleSampler
from gradspec.train._sink import RowSinkFactory, open_sink

logger = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_NAME", "CONFIG_NAME", "METRICS_NAME", "STORE_NAME", "CollectResult", "TrainResult",
           "evaluate", "package_versions", "resolve_device", "train"]

FLOAT16_MAX = 65504.0


@dataclass(frozen=True)
class TrainResult:
    """What a training run (`train`, `collect`) produced; ``store`` is None when it wrote none."""

    out: Path
    store: Path | None
    metrics: Path
    rows: int
    steps: int
    noise_multiplier: float
    sample_rate: float
    delta: float
    epsilon: float
    final_metrics: dict[str, float]


#: The name of :class:`TrainResult` while the trainer lived in ``gradspec.collect``.
CollectResult = TrainResult


def package_versions() -> dict[str, str]:
    """Versions of gradspec, Python and the libraries a run depends on (saved with its data)."""
    out = {}
    for name in ("gradspec", "torch", "numpy", "zarr", "transformers", "dp-accounting", "opacus"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    out["python"] = sys.version.split()[0]
    return out


@torch.no_grad()
def evaluate(task: Task, model: torch.nn.Module, device: torch.device, batch_size: int = 256) -> dict[str, float]:
    """Mean loss and metrics of ``model`` on ``task.eval``."""
    n = len(task.eval)
    totals: dict[str, float] = {}
    for start in range(0, n, batch_size):
        batch = {k: v.to(device) for k, v in task.eval.batch(slice(start, start + batch_size)).items()}
        outputs = task.forward(model, batch)
        b = next(iter(batch.values())).shape[0]
        values = {"loss": task.loss(outputs, batch).mean().item(), **task.metrics(outputs, batch)}
        for k, v in values.items():
            totals[k] = totals.get(k, 0.0) + v * b
    return {f"eval_{k}": v / n for k, v in totals.items()}


class _Run:
    """The state of one collect run (built fresh or restored from a checkpoint)."""

    def __init__(
        self, config: TrainConfig, task: Task, out: Path, progress: bool, hooks: StepHooks | None = None,
        *, sigma: float | None = None,
    ) -> None:
        """Build the run; ``sigma`` (a resumed run's noise multiplier) skips the calibration."""
        from gradspec.privacy import (
            PrivacyAccountant,
            calibrate_noise_multiplier,
            default_delta,
            steps_for_epochs,
            steps_per_epoch,
        )
        from gradspec.train._per_example import PerExampleGradients, layout_for, select_parameters

        self.config, self.task, self.out, self.progress = config, task, out, progress
        self.device = resolve_device(config.device)
        self.model = task.model.to(self.device)
        self.model.eval()  # dropout off: gradients are deterministic and comparable across steps
        patterns = config.params if config.params is not None else task.params
        self.names = select_parameters(self.model, patterns)
        for name, param in self.model.named_parameters():
            param.requires_grad_(name in self.names)
        self.params = [self.model.get_parameter(n) for n in self.names]
        self.layout = layout_for(self.model, self.names)

        n = len(task.train)
        if config.batch_size > n:
            raise ValueError(f"batch size {config.batch_size} exceeds the {n} training examples")
        if config.sampling == Sampling.POISSON:
            self.sampler: PoissonSampler | ShuffleSampler = PoissonSampler(
                n, config.batch_size / n, seed=config.seed + 1
            )
            per_epoch: float = steps_per_epoch(self.sampler.q, sampling=Sampling.POISSON)  # 1 / q
        else:
            self.sampler = ShuffleSampler(n, config.batch_size, seed=config.seed + 1)
            per_epoch = self.sampler.steps_per_epoch  # batches_per_epoch(n, B) = n // B
        # The run's length in epochs as `gradspec account --epochs` and PDP-SGD's start count it.
        self.steps = config.steps if config.steps is not None else steps_for_epochs(config.epochs, per_epoch)
        self.q = self.sampler.q
        # Under shuffling the accountant counts epochs of n // B steps; calibrate and plan on the same.
        self.acct_q = self.q if config.sampling == Sampling.POISSON else 1.0 / self.sampler.steps_per_epoch
        self.delta = config.delta if config.delta is not None else default_delta(n)
        if config.private and self.delta >= 1.0 / n:
            raise ValueError(
                f"delta = {self.delta:g} is not below 1/n = {1.0 / n:.3g} (n = {n} training examples): "
                "a guarantee with delta >= 1/n allows publishing a training example outright; "
                f"give a smaller --delta (the default is n^-1.1 = {default_delta(n):.3g})"
            )
        if sigma is not None:
            self.sigma = float(sigma)
        elif config.noise_multiplier is not None:
            self.sigma = float(config.noise_multiplier)
        else:
            self.sigma = calibrate_noise_multiplier(
                target_epsilon=config.target_epsilon, sample_rate=self.acct_q, steps=self.steps,
                delta=self.delta, sampling=config.sampling, method=config.accounting,
            )
            logger.info("calibrated noise multiplier = %.4f for epsilon = %g", self.sigma, config.target_epsilon)
        self.accountant = PrivacyAccountant(method=config.accounting)
        if config.optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(self.params, lr=config.lr)
        else:
            self.optimizer = torch.optim.SGD(self.params, lr=config.lr, momentum=config.momentum)
        self.noise_gen = torch.Generator(self.device).manual_seed(config.seed + 2)
        # Ghost clipping (backend "ghost") forms the step's clipped sum without rows; the hooks
        # still get a vmap engine for rows of their own (a public subspace's examples).
        self.ghost, self.engine = self._ghost_engine(config, task, hooks or StepHooks())
        ghost = self.ghost is not None
        self.grads = PerExampleGradients(
            self.model, task.forward, task.loss, self.names,
            backend=PerExampleBackend.HOOKS if self.engine == "hooks" else PerExampleBackend.VMAP,
            microbatch=config.microbatch,
        )
        self.step = 0
        self.n = n
        self.run_id = uuid.uuid4().hex
        self.last_eval: dict[str, float] = {}
        # What a private step divides the noised clipped sum by: the expected batch size.
        denominator = self.q * n if config.sampling == Sampling.POISSON else float(config.batch_size)
        self.context = StepContext(
            config=config, noise_multiplier=self.sigma, sample_rate=self.q, n=n, denominator=denominator,
            layout=self.layout, device=self.device, names=tuple(self.names), params=tuple(self.params),
            model=self.model, task=task, per_example=self.grads, sampler=self.sampler,
        )
        self.hooks = hooks or StepHooks()
        if ghost and self.hooks.needs_rows:
            raise ValueError(
                f"{self.hooks.name} changes each per-example gradient before clipping, which the ghost "
                "backend never forms: use --backend vmap (or hooks)"
            )
        self.hooks.setup(self.context)

    def _ghost_engine(self, config: TrainConfig, task: Task, hooks: StepHooks):
        """(GhostClipping or None, the engine's name); ``auto`` takes ghost where it applies
        (batch mode, hooks that need no rows, layers it handles) and vmap otherwise."""
        from gradspec.train._ghost import GhostClipping

        backend = config.backend
        if backend == PerExampleBackend.AUTO:
            if config.mode != CollectMode.BATCH or hooks.needs_rows:
                return None, PerExampleBackend.VMAP.value
            probe = None
            if len(task.train) >= 2:  # checked against a batch-of-one loop now, so a misfit falls back
                probe = {k: v.to(self.device) for k, v in task.train.batch(torch.arange(2)).items()}
            try:
                engine = GhostClipping(self.model, task.forward, task.loss, self.names,
                                       microbatch=config.microbatch, probe_batch=probe)
            except ValueError as err:
                logger.info("backend auto: vmap (%s)", err)
                return None, PerExampleBackend.VMAP.value
            return engine, PerExampleBackend.GHOST.value
        if backend == PerExampleBackend.GHOST:
            return GhostClipping(self.model, task.forward, task.loss, self.names,
                                 microbatch=config.microbatch), backend.value
        return None, backend.value

    def set_config(self, config: TrainConfig) -> None:
        """Replace the run's settings (a resume that turns a calibrated run into a fixed-sigma one)."""
        self.config = config
        self.context = dataclasses.replace(self.context, config=config)

    def planned_epsilon(self, steps: int) -> float:
        """epsilon after ``steps`` gradient steps at this run's sigma, q and delta (privacy the
        hooks spend beyond the gradient noise is not included)."""
        from gradspec.privacy import compute_epsilon

        if self.sigma <= 0:
            return math.inf
        q = self.acct_q
        if self.config.sampling == Sampling.POISSON and not self.hooks.subsampling_amplification:
            q = 1.0  # accounted as a plain Gaussian per step (see StepHooks.subsampling_amplification)
        return compute_epsilon(noise_multiplier=self.sigma, sample_rate=q, steps=max(1, steps),
                               delta=self.delta, sampling=self.config.sampling, method=self.config.accounting)

    def run_config(self) -> dict[str, Any]:
        c = self.config
        return {
            "collect": c.to_dict(),
            "run_id": self.run_id,
            "task": self.task.name,
            "task_registered": not c.custom_task,
            "task_config": self.task.config,
            "parameters": self.names,
            "p": self.layout.p,
            "n_train": self.n,
            "steps": self.steps,
            "sample_rate": self.q,
            "noise_multiplier": self.sigma,
            "max_grad_norm": c.max_grad_norm,
            "per_example_engine": self.engine,
            "delta": self.delta,
            "sampling_note": (
                ("Poisson sampling, accounted as the Poisson-subsampled Gaussian mechanism"
                 if self.hooks.subsampling_amplification else
                 "Poisson sampling, the gradient accounted as a plain Gaussian mechanism per step "
                 f"(no subsampling amplification: {self.hooks.name}'s own releases read the "
                 "sampled batches)")
                if c.sampling == Sampling.POISSON
                else "shuffled fixed-size batches, accounted as one Gaussian mechanism per epoch (no amplification)"
            ),
            "versions": package_versions(),
        }

    # ------------------------------------------------------------------ checkpoint
    def snapshot(self, rows: int, metrics_offset: int) -> dict[str, Any]:
        return {
            "step": self.step,
            "rows": rows,
            "model": {n: p.detach().to("cpu", copy=True) for n, p in zip(self.names, self.params, strict=True)},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "accountant": self.accountant.state_dict(),
            "sampler": copy.deepcopy(self.sampler.state_dict()),
            "noise_generator": self.noise_gen.get_state(),
            "metrics_offset": metrics_offset,
            "layout": self.layout.to_list(),
            "hooks": copy.deepcopy(self.hooks.state_dict()),
            # What a resume checks and keeps (rather than recomputes):
            "run_id": self.run_id,
            "noise_multiplier": self.sigma,
            "total_steps": self.steps,
            "n_train": self.n,
            "device": self.device.type,
            "task": {"name": self.task.name, "registered": not self.config.custom_task},
            "last_eval": dict(self.last_eval),
        }

    def restore(self, state: dict[str, Any]) -> None:
        diff = layout_difference(state["layout"], self.layout.to_list())
        if diff:
            raise ValueError(
                f"the checkpoint's parameter layout differs from this model's ({diff}): "
                "resume with the same task, model and --params"
            )
        device = state.get("device")
        if device is not None and device != self.device.type:
            raise ValueError(
                f"the run was checkpointed on {device} and would resume on {self.device.type}: its noise "
                f"generator is device-specific; resume with --device {device}"
            )
        n = state.get("n_train")
        if n is not None and int(n) != self.n:
            raise ValueError(
                f"the task has {self.n} training examples but the run was started with {n} (they decide "
                "q = B/n, delta and the sampler): resume with the same task and --task-option"
            )
        with torch.no_grad():
            for name, param in zip(self.names, self.params, strict=True):
                param.copy_(state["model"][name].to(self.device))
        self.optimizer.load_state_dict(state["optimizer"])
        self.accountant.load_state_dict(state["accountant"])
        self.sampler.load_state_dict(state["sampler"])
        self.noise_gen.set_state(state["noise_generator"])
        self.hooks.load_state_dict(state.get("hooks", {}))
        self.step = int(state["step"])
        self.run_id = state.get("run_id", self.run_id)
        self.last_eval = dict(state.get("last_eval") or {})

    # ------------------------------------------------------------------ one step
    def train_step(self, store_row: bool):
        """One DP-SGD step. Returns (rows or None, meta or None, stats) — rows to store."""
        from gradspec.privacy import clip_factors, norm_stats

        c = self.config
        self.hooks.on_step_start(self.step, self.context)
        epoch = self.sampler.epoch
        idx = self.sampler.next()
        b = int(idx.numel())
        batch = {k: v.to(self.device) for k, v in self.task.train.batch(idx).items()}
        total = torch.zeros(self.layout.p, device=self.device)
        norms, losses, kept = [], [], []
        if b and self.ghost is not None:  # the clipped sum without per-example rows
            self.hooks.precondition(torch.zeros(b, 0, device=self.device))  # counts; rows: refused
            part, norm, loss = self.ghost(batch, c.max_grad_norm if c.clip else None)
            total += part
            norms.append(norm)
            losses.append(loss)
        elif b:
            for grads, loss in self.grads.iter_microbatches(batch):
                grads = self.hooks.precondition(grads)
                norm = grads.norm(dim=1)
                if c.clip:
                    grads = grads * clip_factors(norm, c.max_grad_norm)[:, None]
                total += grads.sum(0)
                norms.append(norm)
                losses.append(loss)
                if store_row and c.mode == CollectMode.PER_EXAMPLE:
                    kept.append(grads.detach().to("cpu", torch.float32))
        norms_t = torch.cat(norms) if norms else torch.zeros(0)
        loss_t = torch.cat(losses) if losses else torch.zeros(0)
        finite = bool(torch.isfinite(total).all()) and bool(torch.isfinite(loss_t).all())
        if not finite:
            if not c.skip_nonfinite:
                raise ValueError(
                    f"non-finite gradients at step {self.step}: nothing of this step was stored; "
                    "lower the learning rate, or pass --skip-nonfinite to skip such steps"
                )
            logger.warning("step %d: non-finite gradients, step skipped (not stored, not applied)", self.step)
            self.step += 1
            return None, None, {"skipped": 1}

        # Privatise and update.
        clipped = self.hooks.before_noise(total)
        if self.sigma > 0:
            noise = self.hooks.noise(self.layout.p, self.sigma * c.max_grad_norm, self.noise_gen, self.device)
            update = (clipped + noise) / self.context.denominator
        else:
            update = clipped / max(b, 1)
        self._apply(self.hooks.direction(self.hooks.after_noise(update)))
        if self.sigma > 0:
            if c.sampling == Sampling.POISSON and self.hooks.subsampling_amplification:
                self.accountant.record_poisson(self.sigma, self.q, 1)
            elif c.sampling == Sampling.POISSON:  # the hooks' releases read the sampled batches
                self.accountant.record_gaussian(self.sigma, 1)
            else:
                self.accountant.record_shuffled(self.sigma, self.sampler.steps_per_epoch, 1)
        self.hooks.record_privacy(self.accountant, self.step)

        norm = norm_stats(norms_t, c.max_grad_norm) if b else {"mean": 0.0, "max": 0.0, "frac_clipped": 0.0}
        stats = {
            "loss": float(loss_t.mean()) if b else float("nan"),
            "batch_size": b,
            "norm_mean": norm["mean"],
            "norm_max": norm["max"],
            "frac_clipped": norm["frac_clipped"] if c.clip else 0.0,
        }
        rows = meta = None
        if store_row and b:
            common = {"step": self.step, "epoch": epoch, **{k: stats[k] for k in
                      ("loss", "batch_size", "norm_mean", "norm_max", "frac_clipped")}}
            if c.mode == CollectMode.BATCH:
                rows = (total / b).detach().to("cpu", torch.float32).numpy()[None]
                meta = {k: np.array([v]) for k, v in common.items()}
            else:
                rows = torch.cat(kept).numpy()
                meta = {k: np.full(b, v) for k, v in common.items()}
                meta["loss"] = loss_t.detach().cpu().numpy()
                meta["example_index"] = idx.numpy()
            if c.dtype == GradDtype.FLOAT16:
                top = float(np.abs(rows).max(initial=0.0))
                if top > FLOAT16_MAX:
                    raise ValueError(
                        f"step {self.step}: a gradient entry of size {top:.3g} overflows --dtype float16 "
                        f"(largest {FLOAT16_MAX:g}) and would be stored as inf; use --dtype bfloat16 or "
                        "float32, or clip to a smaller norm"
                    )
        self.step += 1
        return rows, meta, stats

    def _apply(self, update: torch.Tensor) -> None:
        for spec, param in zip(self.layout.params, self.params, strict=True):
            param.grad = update[spec.offset : spec.stop].view(spec.shape).to(param.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


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

    Returns:
        A :class:`TrainResult`.

    Raises:
        ValueError: bad settings, a resume whose settings or task differ from the saved run,
            a damaged run, non-finite gradients.
        FileExistsError: ``out`` holds a run and neither resume nor overwrite was asked, or
            ``out`` is not empty and not a run directory.
        DirectoryBusyError: another process is writing to ``out``.
    """
    from gradspec.store import GradientStore, RunLock

    out = Path(out)
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if stop_after is not None and stop_after < 1:
        raise ValueError(f"--stop-after must be >= 1, got {stop_after}")
    if config is not None and not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    if write_store and sink is None:
        raise ValueError("write_store=True needs sink= (a RowSink factory); gradspec.collect.collect passes "
                         "GradientRecorder.for_trainer")
    # Refuse what can be refused before the lock file is created (a foreign directory gets none).
    if resume:
        read_run_config(out)
    else:
        check_new_run(out, overwrite=overwrite)

    # An existing directory is locked at once (a second writer fails fast); a new one only
    # once the settings have been checked, so that bad settings leave nothing behind.
    lock = RunLock(out, what="run directory")
    if out.is_dir():
        lock.acquire()
    try:
        if resume:
            run, store, task = _prepare_resume(config, task, out, progress, hooks, write_store,
                                               allow_larger_epsilon)
        else:
            config, task = bind_task(config or TrainConfig(), task)
            torch.manual_seed(config.seed)
            run = _Run(config, task, out, progress, hooks)
            if write_store and config.every >= run.steps > 1:
                raise ValueError(
                    f"--every {config.every} with {run.steps} steps stores step 0 only: "
                    f"give --every below {run.steps}"
                )
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
                    out / STORE_NAME, layout=run.layout, config=run.run_config(), dtype=str(config.dtype),
                    per_example=config.mode == CollectMode.PER_EXAMPLE, compressor=config.compressor,
                )
            else:
                write_text_atomic(out / RUN_NAME, json.dumps(run.run_config(), indent=2, default=str))
            (out / METRICS_NAME).write_text("")
        return _train(run, store, task, out, progress=progress, writer=writer, stop_after=stop_after,
                      sink=sink)
    finally:
        lock.release()


def _prepare_resume(
    config: TrainConfig | None, task: Task | None, out: Path, progress: bool, hooks: StepHooks | None,
    write_store: bool, allow_larger_epsilon: bool,
):
    """Check everything a resume depends on, then (and only then) roll the run back to its checkpoint."""
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
    sigma = state.get("noise_multiplier", run_cfg.get("noise_multiplier"))
    torch.manual_seed(config.seed)
    run = _Run(config, task, out, progress, hooks, sigma=sigma)
    run.restore(state)

    store = open_resumable(out, state, saved, run.layout.to_list(), write_store=write_store, run_config=run_cfg)
    if not run.last_eval and store is not None:  # a checkpoint from before last_eval was saved
        run.last_eval = dict(store.config.get("final_metrics") or {})

    done = int(state["step"])
    planned = int(state.get("total_steps") or run_cfg.get("steps") or run.steps)
    if run.steps < done:
        raise ValueError(f"the run has done {done} steps: {run.steps} steps would end before that; "
                         f"give --steps >= {done}")
    if run.steps != planned and saved.target_epsilon is not None and run.sigma > 0:
        eps = run.planned_epsilon(run.steps)
        if run.steps > planned and not allow_larger_epsilon:
            raise ValueError(
                f"the noise multiplier {run.sigma:.4g} was calibrated for epsilon = {saved.target_epsilon:g} over {planned} "
                f"steps; {run.steps} steps at that noise multiplier end at epsilon = {eps:.3f}: pass "
                "--allow-larger-epsilon to accept that, or start a new run with "
                f"--epsilon {saved.target_epsilon:g} --steps {run.steps} (the noise multiplier recalibrated)"
            )
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
        entry = {"at_step": done, "changed": changed}
        history = [*run_cfg.get("resumes", []), entry]
        if store is not None:
            store.update_config(collect=config.to_dict(), steps=run.steps, noise_multiplier=run.sigma,
                                resumes=history)
        else:
            write_text_atomic(out / RUN_NAME, json.dumps({**run.run_config(), "resumes": history},
                                                         indent=2, default=str))
    if store is not None:
        store.truncate(int(state["rows"]))  # rows after the checkpoint are regenerated identically
        if run.step < run.steps and store.status != "writing":
            store.update_config(final_epsilon=None, final_metrics=None)
            store.set_status("writing")
    with open(out / METRICS_NAME, "r+b") as f:
        f.truncate(int(state["metrics_offset"]))
    logger.info("resuming at step %d of %d", run.step, run.steps)
    return run, store, task


def _train(run: _Run, store, task: Task, out: Path, *, progress: bool, writer: bool,
           sink: RowSinkFactory | None,
           stop_after: int | None) -> TrainResult:
    """The training loop of a new or resumed run, inside the run directory's lock."""
    config = run.config
    metrics_path, ckpt_path = out / METRICS_NAME, out / CHECKPOINT_NAME
    rows_sink = open_sink(sink, store, max_queue=config.writer_queue, background=writer)
    metrics = open(metrics_path, "a")  # noqa: SIM115 - closed in finally
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=run.steps, initial=run.step, desc="collect", unit="step", file=sys.stderr, dynamic_ncols=True)

    def log(record: dict[str, Any]) -> None:
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()

    def checkpoint() -> None:
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
            rows, meta, stats = run.train_step(store_row=store is not None and step % config.every == 0)
            if rows is not None:
                rows_sink.put_rows(rows, meta)
            done = run.step
            if done % config.log_every == 0 or done == run.steps:
                eps = run.accountant.epsilon(run.delta) if run.sigma > 0 else math.inf
                log({"step": done, "epoch": run.sampler.epoch, **stats, "epsilon": eps,
                     "time": round(time.perf_counter() - t0, 3)})
                if bar is not None:
                    bar.set_postfix(loss=f"{stats.get('loss', float('nan')):.3f}", eps=f"{eps:.2f}")
            if (config.eval_every and done % config.eval_every == 0) or done == run.steps:
                run.last_eval = evaluate(task, run.model, run.device)
                log({"step": done, **run.last_eval})
                logger.info("step %d: %s", done, run.last_eval)
            if done % config.checkpoint_every == 0 or done == run.steps:
                checkpoint()
            if bar is not None:
                bar.update(1)
        if run.step > start_step and run.step % config.checkpoint_every != 0 and run.step != run.steps:
            checkpoint()  # stopped early (stop_after): make the stopping point resumable
        eps = run.accountant.epsilon(run.delta) if run.sigma > 0 else math.inf
        if run.step >= run.steps:  # finished: the store gets its final epsilon and is complete
            rows_sink.close(complete=True, final_epsilon=eps, final_metrics=run.last_eval)
        else:
            rows_sink.close(complete=False)
    except BaseException:
        # Keep what is safely written; never mark an interrupted store complete.
        try:
            rows_sink.close(complete=False)
        except Exception:  # noqa: BLE001 - the original error matters more
            logger.debug("writer close after failure also failed", exc_info=True)
        raise
    finally:
        metrics.close()
        if bar is not None:
            bar.close()

    return TrainResult(
        out=out, store=out / STORE_NAME if store is not None else None, metrics=metrics_path,
        rows=store.n_rows if store is not None else 0, steps=run.step,
        noise_multiplier=run.sigma, sample_rate=run.q, delta=run.delta, epsilon=eps,
        final_metrics=dict(run.last_eval),
    )
