"""Replaying a seeded per-step sketched run: its directions in parameter space (issue 37 §4).

`gradspec pca` of a per-step sketched store (``collect --sketch M`` without ``--per-example``)
gives U and σ of the sketched rows H̃ = H·Φᵀ (r × M); its V lives in the sketch's M columns, so
``retrain --projector`` refuses it. V in parameter space is Hᵀ·U·Σ⁻¹: it needs each step's exact
row h_t (the step's mean clipped gradient, p values) once more. A run of gradspec's trainer is
seeded throughout (model, batches, noise), so the run itself is replayed: the same settings and
task rebuild the same `_Run`, and the trainer's own loop (``_loop._train``) takes the same steps,
its rows going into a sink of this module instead of a store. The step's dense sketch is tapped:
it receives the exact row h_t and returns Φ·h_t, which the trainer hands the sink as the row it
would store.

Checked, at every replayed step: Φ·h_t, rounded to the store's dtype, is the stored row (exactly
on the machine and software that collected it; a relative difference above ``tolerance`` is
refused, naming the step and the size of the difference, and nothing is written). Before any
step: the spectrum is of this store as it is now (its recorded config and rows digests), the
run directory's ``config.json`` is the store's run config, and the rebuilt run has the recorded
p, parameters, steps, sample rate, noise multiplier and sketch plan.

What is accumulated: A = Hᵀ·U_K (p × K, float64, on the run's device), with U_K the sketched
spectrum's K left vectors (its rows in ``source_rows`` order; the other rows weigh 0). Then a
Rayleigh–Ritz step of the exact rows on span(U_K): eigh(AᵀA) = W·Λ·Wᵀ, σ = Λ^½, V = A·W·Λ^-½,
U = U_K·W. So Hᵀ·u_i = σ_i·v_i exactly (in float64), V is orthonormal, its columns come in σ
order, and σ_i = σ_i(U_Kᵀ·H) ≤ σ_i(H) (interlacing: no upward bias, unlike the sketch's σ).
span(V) = span(Hᵀ·U_K·Σ_K⁻¹), the issue's V: the Σ⁻¹ scaling changes no span. With K = r (every
direction of the rows) the result is the exact SVD of H, whatever the sketch's error. Each used
row's ‖h_t‖² is recorded too (``row_sq_norms``: the sketched store holds only Φ·h_t); with K = r
they and U, σ give `gradspec decay` the rows' G_k as for an exact spectrum, with no store read.

Cost: the training run again (evaluation, logging and checkpoints left out: they change nothing
a step computes), plus the step's sketch (as in the collect run) and a K × p product per row.
K × p float64 accumulators that exceed ``memory`` are split into column chunks, one replay each.
``check``: as many replays again, forming H·V of the written V, so that the residual
‖H·v_i − σ_i·u_i‖ is measured rather than bounded (``_replay_write``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradspec.tasks import Task
from gradspec.train._checkpoint import CONFIG_NAME, STORE_NAME
from gradspec.train._config import TrainConfig, bind_task, flag
from gradspec.train._replay_pass import BUFFER_ROWS, ReplayMismatch, one_pass
from gradspec.train._replay_write import Parts, ReplayResult, write
from gradspec.train._run import _Run
from gradspec.train._sketching import plan_of_store

logger = logging.getLogger(__name__)

__all__ = ["ReplayMismatch", "ReplayResult", "replay"]

#: The largest relative difference (max |recomputed − stored| over the row's largest |entry|) a
#: replayed row may have, per store dtype: float32 rows of the same machine and software match
#: exactly; a rounding flip of the stored dtype is one unit in its last place.
TOLERANCE = {"float32": 1e-5, "float16": 2.0**-9, "bfloat16": 2.0**-7}
#: Default accumulator budget (bytes) when none is given.
DEFAULT_MEMORY = 4 * 2**30


def replay(
    store: str | os.PathLike,
    spectrum: str | os.PathLike,
    *,
    out: str | os.PathLike,
    k: int | None = None,
    task: Task | None = None,
    overwrite: bool = False,
    progress: bool = False,
    memory: int | None = None,
    tolerance: float | None = None,
    keep_raw: bool = False,
    check: bool = False,
) -> ReplayResult:
    """Replay the seeded run of a per-step sketched store and write its spectrum in parameter space.

    Args:
        store: the sketched gradient store (``collect --sketch M`` without ``--per-example``).
        spectrum: ``gradspec pca`` of that store (its U and σ; V in sketch space).
        out: the spectrum store to write: the top-k directions in parameter space, which
            ``retrain --projector`` takes.
        k: directions to keep (default: all K of ``spectrum``; every one of the K is used).
        task: the run's own task when it was built in Python (``custom:<name>``); registered
            tasks are rebuilt from the store's record.
        overwrite: replace a spectrum store at ``out``.
        progress: a progress bar on stderr.
        memory: bytes for the K × p float64 accumulators (default 4 GiB); more columns take
            more replays.
        tolerance: the largest relative row difference accepted (default `TOLERANCE` of the
            store's dtype).
        keep_raw: return Hᵀ·U_K·Σ_K⁻¹ in ``ReplayResult.raw`` (p × K float64: small runs only).
        check: replay once more (per column chunk) to form H·V of the written V, so that
            ``residual_h`` is the measured ‖H·v_i − σ_i·u_i‖/σ_i, not the bound
            ‖(I − U_K·U_Kᵀ)·H‖_F/σ_i (every row's mass outside the K directions, loose for K < r).

    Raises:
        ReplayMismatch: a replayed row is not the stored one (one line: step, difference).
        ValueError: a store or spectrum that cannot be replayed, records that disagree.
        FileExistsError: ``out`` exists (without ``overwrite``).
    """
    from gradspec.store import SpectrumStore

    t0 = time.perf_counter()
    case = _Case.open(store, spectrum, task=task, k=k, tolerance=tolerance)
    out = Path(out)
    for other, what in ((case.store.path, "the gradient store"), (case.spectrum.path, "the sketched spectrum")):
        if Path(other).resolve() == out.resolve():
            raise ValueError(f"--out {str(out)!r} is {what} being replayed; choose another --out")
    lock = SpectrumStore.lock_for_writing(out)
    try:
        SpectrumStore.check_target(out, overwrite=overwrite)  # before the replay: fail fast
        budget = int(memory) if memory is not None else DEFAULT_MEMORY
        p, K = case.p, case.K
        per_col = 8 * K + 8 * BUFFER_ROWS  # accumulators and the row buffer, per column
        chunk = max(1, min(p, budget // per_col))
        bounds = [(a, min(p, a + chunk)) for a in range(0, p, chunk)]
        if len(bounds) > 1:
            logger.warning("the %d x %d float64 accumulators and their row buffer (%.3g GB) exceed --memory "
                           "%.3g GB: %d replays%s, each the cost of the training run; raise --memory for fewer",
                           K, p, per_col * p / 1e9, budget / 1e9, len(bounds) * (2 if check else 1),
                           f" ({len(bounds)} more for --check)" if check else "")
        with tempfile.TemporaryDirectory(prefix=".replay-", dir=out.parent if out.parent.exists() else None) as tmp:
            parts = Parts(Path(tmp), p, K, len(bounds))
            initial = copy.deepcopy(case.task.model.state_dict())
            seen = None
            for n, (a, b) in enumerate(bounds):
                if n:
                    case.task.model.load_state_dict(initial)  # the run trained it in place
                seen, acc = one_pass(case, a, b, Path(tmp), progress=progress, what=f"{n + 1}/{len(bounds)}")
                parts.put(a, acc)
                acc = None  # parts holds it (the check's replays then free it: `write`)
            replayed = time.perf_counter() - t0

            def measure(v: np.ndarray) -> tuple[np.ndarray, int]:
                hv = None
                for n, (a, b) in enumerate(bounds):
                    case.task.model.load_state_dict(initial)
                    _, part = one_pass(case, a, b, Path(tmp), progress=progress, v=np.asarray(v[a:b]),
                                       what=f"check {n + 1}/{len(bounds)}")
                    hv = part if hv is None else hv + part
                return hv, len(bounds)

            result = write(case, parts, out, seen, passes=len(bounds), chunk=chunk, t0=t0, keep_raw=keep_raw,
                           replayed=replayed, measure=measure if check else None)
        return result
    finally:
        if lock is not None:
            lock.release()


# ---------------------------------------------------------------------- what is replayed
@dataclass
class _Case:
    """The store, its sketched spectrum, the run's settings and task, all checked up front."""

    store: Any
    spectrum: Any
    config: TrainConfig
    task: Task
    run_config: dict[str, Any]
    coef: np.ndarray  # (n_rows, K): U_K's row of each stored row (0 for rows pca did not use)
    used: np.ndarray  # (n_rows,) bool: rows pca used
    u: np.ndarray  # (r, K) the sketched U
    sigma_sketch: np.ndarray
    k: int
    tolerance: float
    p: int
    layout: list[dict[str, Any]] | None = None  # the rebuilt run's parameters (the unsketched row)

    @property
    def K(self) -> int:  # noqa: N802 - the issue's name
        return int(self.u.shape[1])

    @classmethod
    def open(cls, store: str | os.PathLike, spectrum: str | os.PathLike, *, task: Task | None, k: int | None,
             tolerance: float | None) -> _Case:
        from gradspec.store import (
            GradientStore,
            SpectrumStore,
            config_digest,
            rows_digest,
        )

        g = GradientStore.open(store, mode="r")
        name = str(store)
        if g.sketch is None:
            raise ValueError(f"{name!r} is not sketched: `gradspec pca` of it gives V in parameter space "
                             "already; there is nothing to replay")
        if g.per_example:
            raise ValueError(f"{name!r} holds sketched per-example rows: a replay recomputes per-step rows "
                             "(collect --sketch M without --per-example) only")
        if g.status != "complete":
            raise ValueError(f"{name!r} is {g.status!r}, not complete: finish the run (collect --resume) "
                             "before replaying it")
        cfg = dict(g.config or {})
        if "collect" not in cfg:
            raise ValueError(f"{name!r} records no collect settings (rows recorded from another training "
                             "loop): only a run of gradspec's trainer can be replayed")
        if int(cfg.get("world_size", 1)) > 1:
            raise ValueError(f"{name!r} was collected by {cfg['world_size']} processes (torchrun): their "
                             "all-reduce sums in another order than one process, so it cannot be replayed "
                             "bit for bit")
        spec = SpectrumStore.open(spectrum)
        sname = str(spectrum)
        if spec.status != "complete":
            raise ValueError(f"the spectrum {sname!r} is {spec.status!r}, not complete: finish `gradspec pca` first")
        src = spec.source or {}
        if src.get("source") != "gradient-store":
            raise ValueError(f"the spectrum {sname!r} was not computed from a gradient store: replay the "
                             "spectrum of the sketched store")
        if src.get("config_digest") != config_digest(cfg):  # the store's identity (it may have moved)
            raise ValueError(f"the spectrum {sname!r} was computed from {src.get('path')!r} with another run "
                             f"config than {name!r} records (config digest differs): replay the store it was "
                             "computed from, as it was recorded")
        cols = src.get("col_ranges")
        if src.get("params") is not None or (cols is not None and [list(c) for c in cols] != [[0, g.p]]):
            # U, sigma of some of the sketch's columns are not the rows' (found by review: pca --params
            # sketch.exact, then replay, wrote directions at sin 0.84 from the exact ones, exit 0)
            raise ValueError(f"the spectrum {sname!r} was computed on some of {name!r}'s columns (--params): "
                             "replay a spectrum of all its columns")
        if (spec.params or {}).get("center") or src.get("center"):
            raise ValueError(f"the spectrum {sname!r} was computed with --center: replay a spectrum of the "
                             "uncentered rows (the paper's H)")
        rows = spec.source_rows
        if rows is None:
            raise ValueError(f"the spectrum {sname!r} does not record which rows it used: recompute it with "
                             "`gradspec pca`")
        rows = np.asarray(rows, dtype=np.int64)
        if src.get("rows_digest") is not None and src["rows_digest"] != rows_digest(g, rows):
            raise ValueError(f"the rows of {name!r} are not the ones {sname!r} was computed from (their "
                             "metadata digest differs): recompute the spectrum")
        u, sigma = np.asarray(spec.U, dtype=np.float64), np.asarray(spec.sigma, dtype=np.float64)
        K = u.shape[1]
        k = K if k is None else int(k)
        if not 1 <= k <= K:
            raise ValueError(f"--k {k} is outside [1, {K}] (the {K} directions of {sname!r})")
        coef = np.zeros((g.n_rows, K))
        coef[rows] = u
        used = np.zeros(g.n_rows, dtype=bool)
        used[rows] = True

        config = TrainConfig.from_dict(cfg["collect"])
        run_dir = Path(g.path).parent
        if Path(g.path).name == STORE_NAME and (run_dir / CONFIG_NAME).is_file():
            import json

            saved = TrainConfig.from_dict(json.loads((run_dir / CONFIG_NAME).read_text())).to_dict()
            diff = [key for key, value in config.to_dict().items() if saved.get(key) != value]
            if diff:
                key = diff[0]
                raise ValueError(f"the run directory's {CONFIG_NAME} and the store {name!r} record different "
                                 f"settings ({flag(key)}: {saved.get(key)!r} and {config.to_dict()[key]!r}): "
                                 "one of them was changed; the run cannot be rebuilt")
        from gradspec.sketch import plan_settings

        sk = g.sketch
        made = plan_settings(sk)
        if made != (config.sketch, config.sketch_seed, config.sketch_blocks):
            raise ValueError(f"the store's sketch (--sketch {made[0]} --sketch-seed {made[1]} --sketch-blocks "
                             f"{made[2]}) is not the one its settings record (--sketch {config.sketch} "
                             f"--sketch-seed {config.sketch_seed} --sketch-blocks {config.sketch_blocks})")
        if task is None and config.custom_task:
            raise ValueError(f"the run's task {config.task.removeprefix('custom:')!r} was built in Python, not by the "
                             "task registry: replay it from Python with gradspec.replay(store, spectrum, out=..., "
                             "task=the_same_task)")
        bound, task = bind_task(config, task)
        if (bound.task, bound.task_options) != (config.task, config.task_options):
            raise ValueError(f"the task given is {bound.task!r} {bound.task_options}, the run's {config.task!r} "
                             f"{config.task_options}: replay with the run's own task")
        dtype = str(g.dtype)
        tol = TOLERANCE.get(dtype, 1e-5) if tolerance is None else float(tolerance)
        if not tol >= 0:
            raise ValueError(f"--tolerance must be >= 0, got {tolerance}")
        return cls(store=g, spectrum=spec, config=config, task=task, run_config=cfg, coef=coef, used=used,
                   u=u, sigma_sketch=sigma, k=k, tolerance=tol, p=int(sk["p"]))

    def build(self, tmp: Path) -> _Run:
        """The run as `gradspec collect` built it (``_loop._setup``), with evaluation, logging and
        checkpoints left out (they change nothing a step computes: ``RESUMABLE`` settings)."""
        cfg = self.run_config
        quiet = dataclasses.replace(self.config, eval_every=0, log_every=2**62, checkpoint_every=2**62)
        torch.manual_seed(self.config.seed)
        from gradspec.sketch import same_plan

        kept = plan_of_store(self.store.sketch, self.config)  # kept as a resume keeps it (no warm-up)
        run = _Run(quiet, self.task, tmp, False, None, sigma=cfg.get("noise_multiplier"), plan=kept)
        recorded = {"p": cfg.get("p"), "parameters": cfg.get("parameters"), "steps": cfg.get("steps"),
                    "n_train": cfg.get("n_train"), "sample_rate": cfg.get("sample_rate")}
        rebuilt = {"p": run.layout.p, "parameters": list(run.names), "steps": run.steps, "n_train": run.n,
                   "sample_rate": run.q}
        for key, want in recorded.items():
            if want is not None and want != rebuilt[key]:
                raise ValueError(f"the rebuilt run has {key} = {str(rebuilt[key])[:60]}, the store records "
                                 f"{str(want)[:60]}: the task, model or code changed; it cannot be replayed")
        if not same_plan(self.store.sketch, run.plan):
            raise ValueError("the rebuilt run's sketch plan is not the store's: the model or the sketch code "
                             "changed; it cannot be replayed")
        if run.dense_sketch is None:
            raise ValueError("the rebuilt run sketches no per-step rows")
        return run
