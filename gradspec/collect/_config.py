"""The settings of a `collect` run: a frozen dataclass saved next to its data."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from gradspec._enums import (
    Accounting,
    CollectMode,
    GradDtype,
    PerExampleBackend,
    Sampling,
    parse_choice,
)

_ENUMS = {
    "mode": (CollectMode, "collection mode"),
    "sampling": (Sampling, "sampling"),
    "accounting": (Accounting, "accounting method"),
    "dtype": (GradDtype, "gradient dtype"),
    "backend": (PerExampleBackend, "per-example backend"),
}


@dataclass(frozen=True)
class CollectConfig:
    """Everything that determines a `collect` run (and so its stored rows).

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
        noise_multiplier: sigma; the noise std on the summed gradient is sigma * C.
            0 = non-private. None with ``target_epsilon`` = calibrated.
        target_epsilon: calibrate sigma so that the run ends at this epsilon.
        delta: delta of the reported epsilon; None = n^-1.1 (Li et al. 2022).
        accounting: ``pld`` | ``rdp`` | ``rdp-classic``.
        optimizer: ``sgd`` | ``adam`` applied to the privatised gradient.
        lr: learning rate.
        momentum: SGD momentum.
        dtype: on-disk dtype of the rows.
        backend: per-example gradients by ``vmap`` or ``hooks`` (Opacus).
        microbatch: examples per per-example-gradient call (bounds memory).
        eval_every: evaluate on the held-out split every this many steps (0 = only at the end).
        log_every: log loss and epsilon every this many steps.
        checkpoint_every: commit rows and save a resumable checkpoint every this many steps.
        skip_nonfinite: skip (not store, not apply) steps with NaN/Inf gradients
            instead of stopping.
        seed: seeds the task, the sampler and the noise.
        device: ``cpu`` | ``cuda`` | ``auto``.
        compressor: ``None`` | ``zstd`` | ``blosc`` for the store.
        writer_queue: rows that may wait for the background writer.
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
    backend: PerExampleBackend = PerExampleBackend.VMAP
    microbatch: int | None = 32
    eval_every: int = 50
    log_every: int = 10
    checkpoint_every: int = 50
    skip_nonfinite: bool = False
    seed: int = 0
    device: str = "cpu"
    compressor: str | None = None
    writer_queue: int = 64

    def __post_init__(self) -> None:
        for name, (enum, what) in _ENUMS.items():
            object.__setattr__(self, name, parse_choice(enum, getattr(self, name), what))
        if self.params is not None:
            object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "task_options", dict(self.task_options))
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
            raise ValueError("private training needs clipping: drop --no-clip or set --sigma 0")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose sgd or adam")
        if self.lr <= 0:
            raise ValueError(f"the learning rate must be > 0, got {self.lr}")
        if self.microbatch is not None and self.microbatch < 1:
            raise ValueError(f"microbatch must be >= 1, got {self.microbatch}")
        if self.checkpoint_every < 1 or self.log_every < 1 or self.eval_every < 0:
            raise ValueError("checkpoint_every and log_every must be >= 1, eval_every >= 0")
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise ValueError(f"unknown device {self.device!r}; choose cpu, cuda or auto")

    @property
    def private(self) -> bool:
        return self.target_epsilon is not None or (self.noise_multiplier or 0) > 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for name in _ENUMS:
            d[name] = str(d[name])
        d["params"] = list(self.params) if self.params is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CollectConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown collect settings {sorted(unknown)}; valid: {sorted(names)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)
