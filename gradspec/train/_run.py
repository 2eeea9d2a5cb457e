"""The state of one training run and its DP-SGD step (`_Run`): model, optimizer, sampler,
accountant and per-example engine, built fresh or restored from a checkpoint.

One step (Abadi et al. 2016; Li et al. 2022 §4.2) is described in ``gradspec.train._loop``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradspec._device import resolve_device
from gradspec._enums import CollectMode, GradDtype, PerExampleBackend, Sampling
from gradspec._finite import all_finite
from gradspec._norms import row_norms64
from gradspec.tasks import Task
from gradspec.train._backend import choose_engine
from gradspec.train._checkpoint import layout_difference
from gradspec.train._config import TrainConfig
from gradspec.train._context import StepContext
from gradspec.train._distributed import Ranks
from gradspec.train._hooks import StepHooks
from gradspec.train._norm_shares import WarmupBatch, measured_shares, warmup_batch
from gradspec.train._result import package_versions
from gradspec.train._sampling import PoissonSampler, ShuffleSampler
from gradspec.train._sink import StepRows
from gradspec.train._sketching import sketch_plan, use_plan, warmup_energies

logger = logging.getLogger(__name__)

FLOAT16_MAX = 65504.0


class _Run:
    """The state of one collect run (built fresh or restored from a checkpoint)."""

    def __init__(
        self, config: TrainConfig, task: Task, out: Path, progress: bool, hooks: StepHooks | None = None,
        *, sigma: float | None = None, ranks: Ranks | None = None, plan: Any = None,
    ) -> None:
        """Build the run; ``sigma`` (a resumed run's noise multiplier) skips the calibration;
        ``ranks``: this process's place in a distributed run (default: one process); ``plan``:
        the sketch plan its store holds (a resume or a replay keeps it; no warm-up batch runs)."""
        from gradspec.privacy import (
            PrivacyAccountant,
            accountant_rate,
            calibrate_noise_multiplier,
            default_delta,
            steps_for_epochs,
            steps_per_epoch,
        )
        from gradspec.train._engine import layout_for, select_parameters
        from gradspec.train._per_example import PerExampleGradients

        self.config, self.task, self.out, self.progress = config, task, out, progress
        self.ranks = ranks or Ranks()
        if self.ranks.active:
            _check_distributed(config, hooks)
        self.device = resolve_device(config.device)
        self.model = task.model.to(self.device)
        self.model.eval()  # dropout off: gradients are deterministic and comparable across steps
        if config.params is None and config.sketch is not None:  # a sketch: every trainable parameter
            named = list(self.model.named_parameters())
            self.names = [n for n, p in named if p.requires_grad] or [n for n, _ in named]
        else:
            patterns = config.params if config.params is not None else task.params
            self.names = select_parameters(self.model, patterns)
        for name, param in self.model.named_parameters():
            param.requires_grad_(name in self.names)
        self.params = [self.model.get_parameter(n) for n in self.names]
        self.layout = layout_for(self.model, self.names)
        if config.sketch is not None:  # before any other work: an M the row cannot be compressed into
            from gradspec.sketch import check_width

            check_width(config.sketch, self.layout.p)

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
        self.acct_q = accountant_rate(n, config.batch_size, config.sampling)
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
        self.ghost, self.engine, why = choose_engine(config, task, hooks or StepHooks(), self.model, self.names,
                                                     self.device)
        # logged once, at the first step (after every check of the run has passed)
        self._engine_note: str | None = f"per-example backend: {self.engine}" + (f" ({why})" if why else "")
        ghost = self.ghost is not None
        self.grads = PerExampleGradients(
            self.model, task.forward, task.loss, self.names,
            backend=PerExampleBackend.HOOKS if self.engine == "hooks" else PerExampleBackend.VMAP,
            microbatch=config.microbatch,
        )
        self._warm: WarmupBatch | None = None
        #: The sketch plan of a ``--sketch`` run (None otherwise), the stored row's layout, and
        #: (per-step rows) the map of the step's dense mean clipped gradient.
        if plan is not None:
            self.plan, self.dense_sketch = use_plan(plan, config, self.ghost, self.device)
        else:
            self.plan, self.dense_sketch = sketch_plan(
                config, self.layout, self.model, self.ghost, self.device, log=self.ranks.is_writer,
                energies=lambda: warmup_energies(config, self.layout, self.warmup()))
        self.store_layout = self.layout if self.plan is None else self.plan.column_layout()
        #: a new run's `measure_norm_shares`, kept across resumes
        self.norm_shares: dict[str, Any] | None = None
        self.step = 0
        self.n = n
        self.run_id = uuid.uuid4().hex
        #: a caller's own settings (``train(run_info=...)``), kept in the run config across resumes
        self.run_info: dict[str, Any] | None = None
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

    def warmup(self) -> WarmupBatch:
        """The warm-up batch (`warmup_batch`), computed once: the sketch plan and the norm shares read it."""
        if self._warm is None:
            self._warm = warmup_batch(self.config, self.layout, self.task, self.ghost, self.grads, self.device)
        return self._warm

    def measure_norm_shares(self, measure: bool = True) -> None:
        """A new clipped run's norm shares (`measured_shares`), logged on the writer, kept in its
        run config; not where the hooks change each gradient before clipping (the warm-up does
        not). ``measure=False``: only release the warm-up pass (another rank's run)."""
        if measure and self.config.clip and not self.hooks.needs_rows:
            self.norm_shares = measured_shares(self.layout, self.warmup(), log=self.ranks.is_writer)
        self._warm = None

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
            "accounted_sample_rate": self.acct_q,
            "noise_multiplier": self.sigma,
            "max_grad_norm": c.max_grad_norm,
            "per_example_engine": self.engine,
            # a distributed run (torchrun): how many processes computed each step's clipped sum
            **({"world_size": self.ranks.world_size} if self.ranks.active else {}),
            # ghost clipping's batch-of-one check (GhostClipping(check=...)): off only by an expert's choice
            **({"ghost_check": self.ghost.check} if self.ghost is not None else {}),
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
            **({"run_info": self.run_info} if self.run_info is not None else {}),
            **({"norm_shares": self.norm_shares} if self.norm_shares is not None else {}),
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

    def fingerprint(self) -> dict[str, Any]:
        """What every rank of a distributed run holds alike: the run's numbers, and digests of
        its parameters, random generators and first training examples (exact bytes)."""
        def digest(tensors) -> str:
            h = hashlib.blake2b(digest_size=16)
            for t in tensors:
                h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            return h.hexdigest()

        first = self.task.train.batch(torch.arange(min(self.n, 64)))
        return {
            "step": self.step, "steps": self.steps, "n_train": self.n, "p": self.layout.p,
            "noise_multiplier": self.sigma, "sample_rate": self.q, "delta": self.delta,
            "parameters": digest(self.params), "first_examples": digest(first[k] for k in sorted(first)),
            "generators": digest([self.sampler.generator.get_state(), self.noise_gen.get_state()]),
        }

    # ------------------------------------------------------------------ one step
    def train_step(self, store_row: bool):
        """One DP-SGD step. Returns (rows or None, meta or None, stats) — rows to store."""
        from gradspec.privacy import clip_rows, norm_stats, per_parameter_norms

        c = self.config
        if self._engine_note is not None:
            logger.info("%s", self._engine_note)
            self._engine_note = None
        self.hooks.on_step_start(self.step, self.context)
        epoch = self.sampler.epoch
        idx = self.sampler.next()
        b = int(idx.numel())  # the global batch; this rank computes its share, `mine` (all of it in one process)
        mine = self.ranks.shard(idx)
        local = int(mine.numel())
        batch = {k: v.to(self.device) for k, v in self.task.train.batch(mine).items()}
        total = None  # the clipped sum (p,): the ghost engine's own, or summed here
        norms, losses, kept = [], [], []
        factors, param_norms = [], []  # per-example rows: each example's clip factor, norm per parameter
        if local and self.ghost is not None:  # the clipped sum without per-example rows
            self.hooks.precondition(torch.zeros(local, 0, device=self.device))  # counts; rows: refused
            sketch = self.dense_sketch is None and self.plan is not None and store_row  # per-example rows
            res = self.ghost(batch, c.max_grad_norm if c.clip else None, sketch=sketch)
            total = res.total  # the engine's own fresh sum: no second vector of p to add it into
            if total.dtype != torch.float32 or total.device != self.device:
                total = total.to(self.device, torch.float32)
            norms.append(res.norms)
            losses.append(res.losses)
            if sketch:  # each clipped row sketched (c_i Phi g_i), its factor and exact norms
                kept.append(res.rows.detach().to("cpu", torch.float32))
                factors.append(res.factors.detach().cpu())
                param_norms.append(res.param_norms.detach().cpu())
        elif local:
            keep = store_row and c.mode == CollectMode.PER_EXAMPLE
            buf = None
            total = torch.zeros(self.layout.p, device=self.device)
            for grads, loss in self.grads.iter_microbatches(batch):
                grads = self.hooks.precondition(grads)
                if keep:  # the norms of what is clipped, per parameter (float64)
                    param_norms.append(per_parameter_norms(
                        grads.detach(), [(s.offset, s.stop) for s in self.layout.params]).cpu())
                if c.clip:  # float64 norms; every clipped row's norm <= C exactly (privacy.clip_rows)
                    grads, norm, factor = clip_rows(grads, c.max_grad_norm, in_place=True)  # its own rows
                else:
                    norm = row_norms64(grads)
                    factor = torch.ones_like(norm)
                total += grads.sum(0)
                norms.append(norm)
                losses.append(loss)
                if keep:  # the clipped row, or its sketch (vmap, hooks with --sketch): Phi of the clipped row
                    row = grads.detach() if self.dense_sketch is None else self.dense_sketch(grads.detach())
                    buf = buf or StepRows(local, row.shape[1])
                    buf.add(row)
                    factors.append(factor.detach().cpu())
            if buf is not None:
                kept.append(buf.full())
        if total is None:  # no example of the batch on this rank
            total = torch.zeros(self.layout.p, device=self.device)
        norms_t = torch.cat(norms) if norms else torch.zeros(0)
        loss_t = torch.cat(losses) if losses else torch.zeros(0)
        if self.ranks.active:  # every rank: the global clipped sum, and the norms and losses in batch order
            total = self.ranks.sum_(total, what=f"the clipped sum of step {self.step}")
            norms_t, loss_t = self._gather(norms_t, loss_t, b)
            if store_row and c.mode == CollectMode.PER_EXAMPLE:  # every rank's rows, to rank 0
                kept, factors, param_norms = self._gather_rows(kept, factors, param_norms, b)
        finite = all_finite(total) and all_finite(loss_t)
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
            # one vector of p allocated, not two (whole models: p = 22.6M, ~25 ms a step); the
            # same values as (clipped + noise) / denominator, bit for bit
            update = torch.add(clipped, noise).div_(self.context.denominator)
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
        if store_row and b and self.ranks.is_writer:
            common = {"step": self.step, "epoch": epoch, **{k: stats[k] for k in
                      ("loss", "batch_size", "norm_mean", "norm_max", "frac_clipped")}}
            if c.mode == CollectMode.BATCH:
                rows = (total / b).detach().to(torch.float32)
                if self.dense_sketch is not None:  # Phi of the mean clipped gradient, rounded once
                    rows = self.dense_sketch(rows)
                rows = rows.to("cpu", torch.float32).numpy()[None]
                meta = {k: np.array([v]) for k, v in common.items()}
            else:
                rows = (kept[0] if len(kept) == 1 else torch.cat(kept)).numpy()
                meta = {k: np.full(b, v) for k, v in common.items()}
                meta["loss"] = loss_t.detach().cpu().numpy()
                meta["example_index"] = idx.numpy()
                meta["pre_clip_norm"] = norms_t.detach().cpu().numpy()  # the norms the clip factors used
                meta["clip_factor"] = torch.cat(factors).numpy()
                meta["param_norms"] = torch.cat(param_norms).numpy()
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

    def _gather(self, norms: torch.Tensor, losses: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every rank's per-example norms (float64) and losses, in the global batch's order."""
        dtype = losses.dtype if losses.numel() else torch.float32
        both = torch.stack([norms.to(self.device, torch.float64), losses.to(self.device, torch.float64)], 1)
        both = self.ranks.gather_examples(both, b, what=f"the norms and losses of step {self.step}")
        return both[:, 0], both[:, 1].to(dtype)

    def _gather_rows(self, kept: list, factors: list, param_norms: list, b: int) -> tuple[list, list, list]:
        """Rank 0: every rank's clipped rows, clip factors and norms per parameter, in the global
        batch's order (as lists of one tensor); the other ranks: empty lists."""
        p, k = self.store_layout.p, len(self.layout.params)  # the stored width: M of a sketch
        pieces = [(kept, (0, p), torch.float32), (factors, (0,), torch.float64), (param_norms, (0, k), torch.float64)]
        out = []
        for parts, empty, dtype in pieces:
            local = torch.cat(parts) if parts else torch.zeros(empty, dtype=dtype)
            full = self.ranks.gather_examples(local, b, what=f"the per-example rows of step {self.step}",
                                              to_writer=True)
            out.append([] if full is None else [full])
        return out[0], out[1], out[2]

    def _apply(self, update: torch.Tensor) -> None:
        for spec, param in zip(self.layout.params, self.params, strict=True):
            param.grad = update[spec.offset : spec.stop].view(spec.shape).to(param.dtype)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _check_distributed(config: TrainConfig, hooks: StepHooks | None) -> None:
    """Refuse what a distributed run does not do yet (every rank refuses alike)."""
    if hooks is not None and type(hooks) is not StepHooks:
        raise ValueError(
            f"{hooks.name} (a private optimizer's hooks) under torch.distributed is not supported: "
            "retrain in one process"
        )
