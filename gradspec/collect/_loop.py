"""`collect`: DP-SGD training that streams clipped gradients into a gradient store.

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
``config.json`` and ``checkpoint.pt``. Rows are committed together with a
checkpoint every ``checkpoint_every`` steps, so ``resume=True`` continues from
the last checkpoint and reproduces the rows of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradspec._enums import CollectMode, Sampling
from gradspec.collect._checkpoint import load_checkpoint, save_checkpoint
from gradspec.collect._config import CollectConfig
from gradspec.collect._hooks import StepHooks
from gradspec.collect._sampling import PoissonSampler, ShuffleSampler
from gradspec.tasks._base import Task

logger = logging.getLogger(__name__)

STORE_NAME = "gradients.zarr"
METRICS_NAME = "metrics.jsonl"
CONFIG_NAME = "config.json"
CHECKPOINT_NAME = "checkpoint.pt"


@dataclass(frozen=True)
class CollectResult:
    """What a `collect` run produced."""

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


def _versions() -> dict[str, str]:
    out = {}
    for name in ("gradspec", "torch", "numpy", "zarr", "transformers", "dp-accounting", "opacus"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    out["python"] = sys.version.split()[0]
    return out


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available; use --device cpu")
    return torch.device(device)


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


class _NoWriter:
    """Stands in for the background writer when no store is written (training only)."""

    rows_written = 0

    def put(self, rows, meta) -> None:
        pass

    def commit(self, callback=None, *, wait: bool = False) -> None:
        if callback is not None:
            callback(0)

    def close(self, callback=None) -> None:
        self.commit(callback)


class _Run:
    """The state of one collect run (built fresh or restored from a checkpoint)."""

    def __init__(
        self, config: CollectConfig, task: Task, out: Path, progress: bool, hooks: StepHooks | None = None
    ) -> None:
        from gradspec.collect._per_example import PerExampleGradients, layout_for, select_parameters
        from gradspec.privacy import PrivacyAccountant, calibrate_noise_multiplier, default_delta

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
            steps_per_epoch = n / config.batch_size
        else:
            self.sampler = ShuffleSampler(n, config.batch_size, seed=config.seed + 1)
            steps_per_epoch = self.sampler.steps_per_epoch
        self.steps = config.steps if config.steps is not None else math.ceil(config.epochs * steps_per_epoch)
        self.q = self.sampler.q
        self.delta = config.delta if config.delta is not None else default_delta(n)
        if config.noise_multiplier is not None:
            self.sigma = float(config.noise_multiplier)
        else:
            # Under shuffling the accountant counts epochs of n // B steps; calibrate on the same.
            acct_q = self.q if config.sampling == Sampling.POISSON else 1.0 / self.sampler.steps_per_epoch
            self.sigma = calibrate_noise_multiplier(
                target_epsilon=config.target_epsilon, sample_rate=acct_q, steps=self.steps,
                delta=self.delta, sampling=config.sampling, method=config.accounting,
            )
            logger.info("calibrated sigma = %.4f for epsilon = %g", self.sigma, config.target_epsilon)
        self.accountant = PrivacyAccountant(method=config.accounting)
        if config.optimizer == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(self.params, lr=config.lr)
        else:
            self.optimizer = torch.optim.SGD(self.params, lr=config.lr, momentum=config.momentum)
        self.noise_gen = torch.Generator(self.device).manual_seed(config.seed + 2)
        self.grads = PerExampleGradients(
            self.model, task.forward, task.loss, self.names,
            backend=config.backend, microbatch=config.microbatch,
        )
        self.step = 0
        self.n = n
        self.hooks = hooks or StepHooks()
        self.hooks.setup(self)

    def run_config(self) -> dict[str, Any]:
        c = self.config
        return {
            "collect": c.to_dict(),
            "task": self.task.name,
            "task_config": self.task.config,
            "parameters": self.names,
            "p": self.layout.p,
            "n_train": self.n,
            "steps": self.steps,
            "sample_rate": self.q,
            "noise_multiplier": self.sigma,
            "max_grad_norm": c.max_grad_norm,
            "delta": self.delta,
            "sampling_note": (
                "Poisson sampling, accounted as the Poisson-subsampled Gaussian mechanism"
                if c.sampling == Sampling.POISSON
                else "shuffled fixed-size batches, accounted as one Gaussian mechanism per epoch (no amplification)"
            ),
            "versions": _versions(),
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
        }

    def restore(self, state: dict[str, Any]) -> None:
        if state["layout"] != self.layout.to_list():
            raise ValueError(
                "the checkpoint's parameter layout differs from this model's: "
                "resume with the same task, model and --params"
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

    # ------------------------------------------------------------------ one step
    def train_step(self, store_row: bool):
        """One DP-SGD step. Returns (rows or None, meta or None, stats) — rows to store."""
        from gradspec.privacy import clip_factors

        c = self.config
        self.hooks.on_step_start(self.step, self)
        epoch = self.sampler.epoch
        idx = self.sampler.next()
        b = int(idx.numel())
        batch = {k: v.to(self.device) for k, v in self.task.train.batch(idx).items()}
        total = torch.zeros(self.layout.p, device=self.device)
        norms, losses, kept = [], [], []
        if b:
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
            denom = self.q * self.n if c.sampling == Sampling.POISSON else c.batch_size
            update = (clipped + noise) / denom
        else:
            update = clipped / max(b, 1)
        self._apply(self.hooks.direction(self.hooks.after_noise(update)))
        if self.sigma > 0:
            if c.sampling == Sampling.POISSON:
                self.accountant.record_poisson(self.sigma, self.q, 1)
            else:
                self.accountant.record_shuffled(self.sigma, self.sampler.steps_per_epoch, 1)
        self.hooks.record_privacy(self.accountant, self.step)

        stats = {
            "loss": float(loss_t.mean()) if b else float("nan"),
            "batch_size": b,
            "norm_mean": float(norms_t.mean()) if b else 0.0,
            "norm_max": float(norms_t.max()) if b else 0.0,
            "frac_clipped": float((norms_t > c.max_grad_norm).float().mean()) if b and c.clip else 0.0,
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
        self.step += 1
        return rows, meta, stats

    def _apply(self, update: torch.Tensor) -> None:
        for spec, param in zip(self.layout.params, self.params, strict=True):
            param.grad = update[spec.offset : spec.stop].view(spec.shape).to(param.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def collect(
    config: CollectConfig | None = None,
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
) -> CollectResult:
    """Train with DP-SGD and stream clipped gradients into ``out/gradients.zarr``.

    Args:
        config: run settings (default: ``CollectConfig()``, the text task).
        out: run directory (store, metrics, config, checkpoint).
        task: a user's own :class:`~gradspec.tasks.Task`; default builds ``config.task``.
        resume: continue the run in ``out`` from its last checkpoint; ``config``
            must then be None or equal to the saved one.
        overwrite: replace an existing run in ``out``.
        progress: show a progress bar on stderr.
        writer: write rows on a background thread (``False``: synchronously).
        stop_after: stop (with a checkpoint) after this many steps in this call;
            for splitting long runs and for tests.
        hooks: changes to the DP-SGD step (the private optimizers of ``gradspec.optim``).
        write_store: write a gradient store; ``False`` only trains (metrics and
            checkpoints are still written), as ``gradspec retrain`` does.

    Returns:
        A :class:`CollectResult`.

    Raises:
        ValueError: bad settings, a mismatched resume, non-finite gradients.
        FileExistsError: ``out`` holds a run and neither resume nor overwrite was asked.
    """
    from gradspec.store import BackgroundWriter, GradientStore

    out = Path(out)
    config_path, store_path = out / CONFIG_NAME, out / STORE_NAME
    metrics_path, ckpt_path = out / METRICS_NAME, out / CHECKPOINT_NAME
    if resume:
        if not config_path.is_file():
            raise FileNotFoundError(f"no run to resume in {str(out)!r} (no {CONFIG_NAME}); drop --resume")
        saved = CollectConfig.from_dict(json.loads(config_path.read_text()))
        if config is not None and config != saved:
            diff = sorted(k for k, v in config.to_dict().items() if saved.to_dict().get(k) != v)
            raise ValueError(f"--resume continues the saved run; its settings differ in {diff}")
        config = saved
    else:
        config = config or CollectConfig()
        if (store_path.exists() or config_path.exists()) and not overwrite:
            raise FileExistsError(
                f"{str(out)!r} already holds a run: pass --resume to continue it or --overwrite to replace it"
            )

    if task is None:
        from gradspec.tasks import make_task

        task = make_task(config.task, seed=config.seed, **config.task_options)
    torch.manual_seed(config.seed)
    run = _Run(config, task, out, progress, hooks)

    if resume:
        state = load_checkpoint(ckpt_path, required=("step", "rows", "model", "optimizer", "metrics_offset"))
        store = GradientStore.open(store_path, mode="r+") if write_store else None
        if store is not None:
            if store.layout.to_list() != run.layout.to_list():
                raise ValueError("the store's parameter layout differs from this model's: resume with the same task and --params")
            if store.n_rows < state["rows"]:
                raise ValueError(f"the store has {store.n_rows} committed rows but the checkpoint expects {state['rows']}; it is damaged")
        run.restore(state)
        if store is not None:
            store.truncate(int(state["rows"]))  # rows after the checkpoint are regenerated identically
        with open(metrics_path, "r+b") as f:
            f.truncate(int(state["metrics_offset"]))
        logger.info("resuming at step %d", run.step)
    else:
        out.mkdir(parents=True, exist_ok=True)
        store = None
        if write_store:
            store = GradientStore.create(
                store_path, layout=run.layout, config=run.run_config(), dtype=str(config.dtype),
                per_example=config.mode == CollectMode.PER_EXAMPLE, compressor=config.compressor,
                overwrite=overwrite,
            )
        else:
            (out / "run.json").write_text(json.dumps(run.run_config(), indent=2, default=str))
        config_path.write_text(config.to_json())
        metrics_path.write_text("")
        ckpt_path.unlink(missing_ok=True)

    bg = (BackgroundWriter(store, max_queue=config.writer_queue, background=writer)
          if store is not None else _NoWriter())
    metrics = open(metrics_path, "a")  # noqa: SIM115 - closed in finally
    last_eval: dict[str, float] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=run.steps, initial=run.step, desc="collect", unit="step", file=sys.stderr, dynamic_ncols=True)

    def log(record: dict[str, Any]) -> None:
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()

    def checkpoint() -> None:
        snap = run.snapshot(bg.rows_written, metrics.tell())

        def save(n_rows: int) -> None:
            assert n_rows == snap["rows"], (n_rows, snap["rows"])
            save_checkpoint(ckpt_path, snap)

        bg.commit(save)

    start_step, t0 = run.step, time.perf_counter()
    try:
        while run.step < run.steps:
            if stop_after is not None and run.step - start_step >= stop_after:
                break
            step = run.step
            rows, meta, stats = run.train_step(store_row=store is not None and step % config.every == 0)
            if rows is not None:
                bg.put(rows, meta)
            done = run.step
            if done % config.log_every == 0 or done == run.steps:
                eps = run.accountant.epsilon(run.delta) if run.sigma > 0 else math.inf
                log({"step": done, "epoch": run.sampler.epoch, **stats, "epsilon": eps,
                     "time": round(time.perf_counter() - t0, 3)})
                if bar is not None:
                    bar.set_postfix(loss=f"{stats.get('loss', float('nan')):.3f}", eps=f"{eps:.2f}")
            if (config.eval_every and done % config.eval_every == 0) or done == run.steps:
                last_eval = evaluate(task, run.model, run.device)
                log({"step": done, **last_eval})
                logger.info("step %d: %s", done, last_eval)
            if done % config.checkpoint_every == 0 or done == run.steps:
                checkpoint()
            if bar is not None:
                bar.update(1)
        if run.step > start_step and run.step % config.checkpoint_every != 0 and run.step != run.steps:
            checkpoint()  # stopped early (stop_after): make the stopping point resumable
        bg.close()
    except BaseException:
        # Keep what is safely written; never mark an interrupted store complete.
        try:
            bg.close()
        except Exception:  # noqa: BLE001 - the original error matters more
            logger.debug("writer close after failure also failed", exc_info=True)
        raise
    finally:
        metrics.close()
        if bar is not None:
            bar.close()

    eps = run.accountant.epsilon(run.delta) if run.sigma > 0 else math.inf
    if store is not None and run.step >= run.steps:
        store.update_config(final_epsilon=eps, final_metrics=last_eval)
        store.set_status("complete")
    return CollectResult(
        out=out, store=store_path if store is not None else None, metrics=metrics_path,
        rows=store.n_rows if store is not None else 0, steps=run.step,
        noise_multiplier=run.sigma, sample_rate=run.q, delta=run.delta, epsilon=eps,
        final_metrics=last_eval,
    )
