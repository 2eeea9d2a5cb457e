"""Batch samplers of DP-SGD with resumable state.

* Poisson: each example joins a step's batch independently with probability q,
  so batch sizes vary (expected q*n). This is what subsampled-Gaussian
  accounting assumes.
* Shuffle: a fresh permutation per epoch, cut into n // B fixed-size batches
  (the remainder is dropped). Accounted without amplification, as one
  Gaussian mechanism per epoch (see ``gradspec.privacy``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gradspec.privacy import batches_per_epoch


class PoissonSampler:
    """Poisson subsampling with rate ``q`` from its own seeded generator."""

    kind = "poisson"

    def __init__(self, n: int, q: float, *, seed: int) -> None:
        if not 0 < q <= 1:
            raise ValueError(f"the sampling rate q must be in (0, 1], got {q}")
        self.n, self.q = int(n), float(q)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.steps = 0

    @property
    def expected_batch_size(self) -> float:
        return self.q * self.n

    @property
    def epoch(self) -> int:
        return int(self.steps * self.q)

    def next(self) -> Tensor:
        mask = torch.rand(self.n, generator=self.generator) < self.q
        self.steps += 1
        return mask.nonzero().flatten()

    def state_dict(self) -> dict:
        return {"kind": self.kind, "n": self.n, "q": self.q, "steps": self.steps,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind or state.get("n") != self.n or state.get("q") != self.q:
            raise ValueError("sampler state is from another sampler (kind, n or q differ)")
        self.steps = int(state["steps"])
        self.generator.set_state(state["generator"])


class ShuffleSampler:
    """Shuffled fixed-size batches: a new permutation each epoch."""

    kind = "shuffle"

    def __init__(self, n: int, batch_size: int, *, seed: int) -> None:
        if not 1 <= batch_size <= n:
            raise ValueError(f"batch size must be in [1, {n}] (the dataset size), got {batch_size}")
        self.n, self.batch_size = int(n), int(batch_size)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.steps = 0
        self._perm: Tensor | None = None

    @property
    def steps_per_epoch(self) -> int:
        return batches_per_epoch(self.n, self.batch_size)

    @property
    def q(self) -> float:
        return self.batch_size / self.n

    @property
    def expected_batch_size(self) -> float:
        return float(self.batch_size)

    @property
    def epoch(self) -> int:
        return self.steps // self.steps_per_epoch

    def next(self) -> Tensor:
        pos = self.steps % self.steps_per_epoch
        if pos == 0 or self._perm is None:
            self._perm = torch.randperm(self.n, generator=self.generator)
        self.steps += 1
        return self._perm[pos * self.batch_size : (pos + 1) * self.batch_size].sort().values

    def state_dict(self) -> dict:
        return {"kind": self.kind, "n": self.n, "batch_size": self.batch_size, "steps": self.steps,
                "generator": self.generator.get_state(), "perm": self._perm}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind or state.get("n") != self.n or state.get("batch_size") != self.batch_size:
            raise ValueError("sampler state is from another sampler (kind, n or batch size differ)")
        self.steps = int(state["steps"])
        self.generator.set_state(state["generator"])
        self._perm = state["perm"]
