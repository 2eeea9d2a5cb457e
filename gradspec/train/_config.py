"""The settings of a training run (``collect``, ``retrain``): a frozen dataclass saved next to its data."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gradspec._enums import (
    Accounting,
    CollectMode,
    GradDtype,
    PerExampleBackend,
    Sampling,
    parse_choice,
)
from gradspec._json import as_saved

if TYPE_CHECKING:
    from gradspec.tasks import Task

logger = logging.getLogger(__name__)

_ENUMS = {
    "mode": (CollectMode, "collection mode"),
    "sampling": (Sampling, "sampling"),
    "accounting": (Accounting, "accounting method"),
    "dtype": (GradDtype, "gradient dtype"),
    "backend": (PerExampleBackend, "per-example backend"),
}

#: Prefix of ``task`` for a task built in Python (not by the registry): such a run
#: can be resumed only from Python, with the same task object passed again.
CUSTOM_PREFIX = "custom:"

#: Settings a resumed run may change: how long it runs, how often it reports and
#: checkpoints, and how it uses memory — not what a step computes. Everything else
#: is fixed by the saved run. (``microbatch`` changes only the order of float sums,
#: so rows after such a resume may differ from an uninterrupted run's in the last bits.)
RESUMABLE = frozenset(
    {"steps", "epochs", "eval_every", "log_every", "checkpoint_every", "skip_nonfinite",
     "microbatch", "writer_queue"}
)

#: Settings that change neither what a run computes nor what it reports at its end: a
#: finished run (or an interrupted one, to continue) may be reused under other values.
BOOKKEEPING = frozenset({"checkpoint_every", "writer_queue"})

# Command-line names of the settings whose flag is not --<name-with-dashes>.
_FLAGS = {
    "target_epsilon": "--epsilon",
    "clip": "--no-clip",
    "task_options": "--task-option",
}


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (and so a `collect` run's stored rows).

    ``CollectConfig`` is the same class (its name before the trainer moved to ``gradspec.train``).

    Attributes:
        task: registry name of the task (``text``, ``cnn``, ``geomedian``, ``lowrank``).
        task_options: options passed to the task factory (e.g. ``{"n_train": 2000}``).
        params: parameter name patterns to train and collect; None = the task's default.
        mode: ``batch`` stores each step's average clipped gradient (before noise);
            ``per-example`` stores every clipped per-example gradient.
        every: store every ``every``-th step.
        steps: training steps; when None, ``epochs`` decides.
        epochs: training epochs (steps = epochs / q) when ``steps`` is None.
        batch_size: expected (Poisson) or fixed (shuffle) batch size.
        sampling: ``poisson`` (rate q = batch_size / n) or ``shuffle``.
        max_grad_norm: clipping norm C over the selected parameters.
        clip: clip per-example gradients (required when noise_multiplier > 0).
        noise_multiplier: z; the noise std on the summed gradient is z * C.
            0 = non-private. None with ``target_epsilon`` = calibrated.
        target_epsilon: calibrate the noise multiplier so that the run ends at this epsilon.
        delta: delta of the reported epsilon; None = n^-1.1 (Li et al. 2022).
        accounting: ``pld`` | ``rdp`` | ``rdp-classic``.
        optimizer: ``sgd`` | ``adam`` applied to the privatised gradient.
        lr: learning rate.
        momentum: SGD momentum.
        dtype: on-disk dtype of the rows.
        backend: per-example gradients by ``vmap`` or ``hooks`` (Opacus); ``ghost``: only their
            norms and clipped sum (ghost clipping, ``mode="batch"`` only, or per-example with
            ``sketch``; about the cost of a plain step, see docs/bench_per_example.txt); ``auto``
            (the default): ghost where it applies (batch mode, hooks that use only the clipped
            sum, every selected layer a type it handles and its batch-of-one check passed), else
            vmap. The engine a run
            used is logged and recorded in its run config (``per_example_engine``).
        microbatch: examples per per-example-gradient call (bounds memory).
        eval_every: evaluate on the held-out split every this many steps (0 = only at the end).
        log_every: log loss and epsilon every this many steps.
        checkpoint_every: commit rows and save a resumable checkpoint every this many steps.
        skip_nonfinite: skip (not store, not apply) steps with NaN/Inf gradients instead of
            stopping; non-private runs only (the skip is a decision on the private data that no
            epsilon covers).
        seed: seeds the sampler and the noise, and the task unless ``task_seed`` is given.
        task_seed: seeds the task alone (its data, a random head); ``None``: ``seed``.
            Fixing it while ``seed`` varies repeats a run on the same data and model
            with other batches and noise (as papers' "seeds" usually mean).
        device: ``cpu`` | ``cuda`` | ``auto``.
        compressor: ``None`` | ``zstd`` | ``blosc`` for the store.
        writer_queue: rows that may wait for the background writer (at most 1 GiB of them).
        sketch: store each row as an M-column seeded random projection (``gradspec.sketch``)
            instead of its p values; None (the default) stores the rows whole. ``mode="batch"``
            (issue 37): each step's mean clipped gradient, sketched whole once a step by any
            backend (under torchrun on the writer, after the ranks' all-reduce).
            ``mode="per-example"`` (issue 22): each clipped per-example gradient; the ghost
            backend (``ghost`` or ``auto``) sketches linear-like layers without forming their
            per-example gradients (plan version 2), ``vmap`` and ``hooks`` sketch the gradients
            they form (version 4, columns mixed and sign-masked: about a dense sketch's error on
            the calibration models and MiniLM q/v, where version 2 is up to 3.4x; at the memory
            and time of forming them); the norms and clipping stay exact. M must be below p.
            With a sketch, ``params`` None means every trainable parameter of the task's model.
        sketch_seed: the sketch plan's seed (every random factor derives from it).
        sketch_blocks: J >= 2 independent blocks of the sketch (error estimates).
        sketch_weights: how the plan splits its columns among the parameters: ``energy`` (the
            default) in proportion to each parameter's gradient energy in a warm-up batch (the
            first ``batch_size`` training examples at the starting weights, with the run's
            clipping; `gradspec.sketch.energy_weights`), ``sqrt-size`` by ``sqrt(numel)`` (no
            data seen). A resumed or replayed run keeps its store's plan.
    """

    task: str = "text"
    task_options: dict[str, Any] = field(default_factory=dict)
    params: tuple[str, ...] | None = None
    mode: CollectMode = CollectMode.BATCH
    every: int = 1
    steps: int | None = 200
    epochs: float | None = None
    batch_size: int = 64
    sampling: Sampling = Sampling.POISSON
    max_grad_norm: float = 1.0
    clip: bool = True
    noise_multiplier: float | None = 1.0
    target_epsilon: float | None = None
    delta: float | None = None
    accounting: Accounting = Accounting.PLD
    optimizer: str = "adam"
    lr: float = 5e-4
    momentum: float = 0.0
    dtype: GradDtype = GradDtype.FLOAT32
    backend: PerExampleBackend = PerExampleBackend.AUTO
    microbatch: int | None = 32
    eval_every: int = 50
    log_every: int = 10
    checkpoint_every: int = 50
    skip_nonfinite: bool = False
    seed: int = 0
    task_seed: int | None = None
    device: str = "cpu"
    compressor: str | None = None
    writer_queue: int = 64
    sketch: int | None = None
    sketch_seed: int = 0
    sketch_blocks: int = 8
    sketch_weights: str = "energy"

    def __post_init__(self) -> None:
        for name, (enum, what) in _ENUMS.items():
            object.__setattr__(self, name, parse_choice(enum, getattr(self, name), what))
        if self.params is not None:
            object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "task_options", dict(self.task_options))
        for name, flag in (("epochs", "--epochs"), ("max_grad_norm", "the clipping norm C"),
                           ("noise_multiplier", "the noise multiplier (--noise-multiplier)"),
                           ("target_epsilon", "the target epsilon"), ("delta", "delta"),
                           ("lr", "the learning rate")):
            value = getattr(self, name)
            if value is not None and not math.isfinite(float(value)):
                raise ValueError(f"{flag} must be a finite number, got {value}")
        if self.noise_multiplier is not None and 0 < self.noise_multiplier < 0.01:
            raise ValueError(
                f"the noise multiplier {self.noise_multiplier} is below 0.01: its epsilon is "
                "astronomically large and the accountant cannot compute it; use --noise-multiplier 0 for a "
                "non-private run"
            )
        if self.steps is None and self.epochs is None:
            raise ValueError("give the run length as steps or epochs")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.epochs is not None and self.epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {self.epochs}")
        if self.every < 1:
            raise ValueError(f"--every must be >= 1, got {self.every}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.max_grad_norm <= 0:
            raise ValueError(f"the clipping norm C must be > 0, got {self.max_grad_norm}")
        if self.noise_multiplier is not None and self.noise_multiplier < 0:
            raise ValueError(f"the noise multiplier must be >= 0, got {self.noise_multiplier}")
        if self.noise_multiplier is not None and self.target_epsilon is not None:
            raise ValueError("give either a noise multiplier or a target epsilon, not both")
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("give a noise multiplier (0 for non-private) or a target epsilon")
        if self.target_epsilon is not None and self.target_epsilon <= 0:
            raise ValueError(f"the target epsilon must be > 0, got {self.target_epsilon}")
        private = self.target_epsilon is not None or (self.noise_multiplier or 0) > 0
        if private and not self.clip:
            raise ValueError("private training needs clipping: drop --no-clip or set --noise-multiplier 0")
        if private and self.skip_nonfinite:
            # the skip is decided by the private data (some example's NaN/inf gradient) and adds
            # no noise: no epsilon covers it (counting the step would not either)
            raise ValueError(
                "--skip-nonfinite skips a step when some example's gradient is NaN/inf, a decision on the "
                "private data that no epsilon accounts for: it is for non-private runs (--noise-multiplier 0); "
                "under DP find the cause (lower --lr, a larger --dtype) or exclude the examples")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose sgd or adam")
        if self.lr <= 0:
            raise ValueError(f"the learning rate must be > 0, got {self.lr}")
        if self.microbatch is not None and self.microbatch < 1:
            raise ValueError(f"microbatch must be >= 1, got {self.microbatch}")
        if self.sketch is not None:
            _check_sketch(self)
        elif self.backend == PerExampleBackend.GHOST and self.mode == CollectMode.PER_EXAMPLE:
            raise ValueError(
                "--backend ghost forms no per-example rows, so it cannot store them: use --mode batch, "
                "or --backend vmap (or hooks) with --mode per-example"
            )
        if self.checkpoint_every < 1 or self.log_every < 1 or self.eval_every < 0:
            raise ValueError("checkpoint_every and log_every must be >= 1, eval_every >= 0")
        if self.compressor not in (None, "none", "zstd", "blosc"):
            raise ValueError(f"unknown compressor {self.compressor!r}; choose none, zstd or blosc")
        if self.writer_queue < 1:
            raise ValueError(f"writer_queue must be >= 1, got {self.writer_queue}")
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise ValueError(f"unknown device {self.device!r}; choose cpu, cuda or auto")

    @property
    def private(self) -> bool:
        """Whether the run adds noise: a target ε, or a noise multiplier above 0."""
        return self.target_epsilon is not None or (self.noise_multiplier or 0) > 0

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-able values (choices as their strings), as runs save them."""
        d = dataclasses.asdict(self)
        for name in _ENUMS:
            d[name] = str(d[name])
        d["params"] = list(self.params) if self.params is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """The settings :meth:`to_dict` saved.

        Raises:
            ValueError: a key that is not a setting (named, with the valid ones).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown collect settings {sorted(unknown)}; valid: {sorted(names)}")
        return cls(**d)

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON with sorted keys, as a run's ``config.json`` holds it."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @property
    def seed_of_task(self) -> int:
        """The seed the task is built with: ``task_seed``, or ``seed`` when that is None."""
        return self.seed if self.task_seed is None else self.task_seed

    @property
    def custom_task(self) -> bool:
        """The task was built in Python (``task = "custom:<name>"``), not by the registry."""
        return self.task.startswith(CUSTOM_PREFIX)


def _check_sketch(c: TrainConfig) -> None:
    """Refuse the settings a sketched collection does not take (one line each)."""
    if c.sketch < 1:
        raise ValueError(f"--sketch M must be a positive number of columns, got {c.sketch}")
    if c.sketch_weights not in ("energy", "sqrt-size"):
        raise ValueError(f"--sketch-weights must be energy or sqrt-size, got {c.sketch_weights!r}")
    if c.sketch_blocks < 2:
        raise ValueError(f"--sketch-blocks must be >= 2 (independent blocks), got {c.sketch_blocks}")


#: The name this class had while the trainer lived in ``gradspec.collect``; the public API keeps it.
CollectConfig = TrainConfig


def flag(name: str) -> str:
    """The command-line flag of setting ``name`` (``target_epsilon`` -> ``--epsilon``)."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def _normal(name: str, value: Any) -> Any:
    """``value`` of setting ``name`` in the form ``to_dict`` writes (enums as str, tuples as lists)."""
    if name in _ENUMS and value is not None:
        enum, what = _ENUMS[name]
        return str(parse_choice(enum, value, what))
    if name == "params" and value is not None:
        return list(value) if not isinstance(value, str) else [value]
    if name == "task_options":
        return as_saved(dict(value or {}))
    return value


def _task_options_with_defaults(task: str, options: dict[str, Any]) -> dict[str, Any]:
    """A registered task's options with its defaults filled in (so ``-t d=40`` equals the default 40)."""
    if task.startswith(CUSTOM_PREFIX):
        return options
    import inspect

    from gradspec.tasks import task_options

    try:
        defaults = task_options(task)
    except ValueError:
        return options
    filled = {k: v for k, v in defaults.items() if v is not inspect.Parameter.empty and k != "seed"}
    return _normal("task_options", {**filled, **options})


def resume_conflicts(saved: TrainConfig, given: Mapping[str, Any]) -> list[str]:
    """The settings in ``given`` that a resume of the run ``saved`` may not change.

    Args:
        saved: the run's saved settings.
        given: settings asked for (a whole ``to_dict()``, or only those a user passed).

    Returns:
        One ``"--flag (saved X, given Y)"`` per conflicting setting; empty if none.
    """
    old = saved.to_dict()
    unknown = sorted(set(given) - set(old))
    if unknown:
        raise ValueError(f"unknown collect settings {unknown}; valid: {sorted(old)}")
    out = []
    for name, value in given.items():
        if name in RESUMABLE:
            continue
        new = _normal(name, value)
        before = old[name]
        if name == "task_options":
            task = _normal("task", given.get("task", saved.task))
            same = _task_options_with_defaults(task, new) == _task_options_with_defaults(saved.task, before)
        else:
            same = new == before
        if not same:
            out.append(f"{flag(name)} (saved {before!r}, given {new!r})")
    return out


def merge_resume(saved: TrainConfig, given: Mapping[str, Any]) -> TrainConfig:
    """The settings of a resumed run: ``saved`` with the resumable settings of ``given`` applied.

    Settings outside :data:`RESUMABLE` must equal the saved ones. Giving ``epochs``
    without ``steps`` makes the run's length follow the new epochs.

    Raises:
        ValueError: naming every setting that differs from the saved run, in one line.
    """
    conflicts = resume_conflicts(saved, given)
    if conflicts:
        raise ValueError(
            "--resume continues the saved run, and these settings differ from it: "
            + ", ".join(conflicts)
            + "; drop them, or start a new run (another --out, or --overwrite) to change them"
        )
    d = saved.to_dict()
    d.update({k: _normal(k, v) for k, v in given.items() if k in RESUMABLE})
    if "epochs" in given and "steps" not in given:
        d["steps"] = None
    return TrainConfig.from_dict(d)


def _task_identity(task: Task, seed: int) -> tuple[str, dict[str, Any]] | None:
    """(registry name, options) if ``task`` was built by the registry with ``seed``; else None."""
    from gradspec.tasks import available_tasks, task_options

    name, built = getattr(task, "name", None), getattr(task, "config", None) or {}
    if not isinstance(name, str) or built.get("task") != name or name not in available_tasks():
        return None
    if built.get("seed", seed) != seed:
        logger.info("task %r was built with seed %s, the run's seed is %s: recorded as a custom task",
                    name, built.get("seed"), seed)
        return None
    return name, {k: built[k] for k in task_options(name) if k in built and k != "seed"}


def bind_task(config: TrainConfig, task: Task | None) -> tuple[TrainConfig, Task]:
    """The config that says what the task really is, and the task (built from the config if None).

    A task built by the registry is recorded by its name and options, so the CLI can
    rebuild it; any other task as ``custom:<name>``, which only a Python resume that
    passes the task again can continue.
    """
    if task is None:
        if config.custom_task:
            raise ValueError(
                f"this run's task {config.task[len(CUSTOM_PREFIX):]!r} was built in Python, not by the task "
                "registry, so it cannot be rebuilt from its name: resume it from Python with "
                "gradspec.collect(config, out=..., resume=True, task=your_task)"
            )
        from gradspec.tasks import make_task

        return config, make_task(config.task, seed=config.seed_of_task, **config.task_options)
    identity = _task_identity(task, config.seed_of_task)
    if identity is None:
        custom = CUSTOM_PREFIX + str(getattr(task, "name", "task"))
        return dataclasses.replace(config, task=custom, task_options={}), task
    name, options = identity
    bound = dataclasses.replace(config, task=name, task_options=options)
    if config.task == name and not resume_conflicts(config, {"task": name, "task_options": options}):
        return config, task  # the config already says it (perhaps with fewer, default-valued options)
    if config.task != name:
        logger.info("the config names task %r but the task given is %r: recorded as %r", config.task, name, name)
    return bound, task
