"""The public split and the projector recomputed from it (Zhou et al. 2021, Algorithm 1).

:class:`PublicProjector` holds the top-k eigenvectors of the public second-moment matrix
``M_t = (1/m) sum_i g_i g_i^T`` over m public examples, recomputed every ``period`` steps
at the current parameters. With the m x p public gradient matrix ``G``, the eigenvectors
come from the m x m Gram ``K = G G^T / m = U L U^T`` as ``V = G^T U L^{-1/2} / sqrt(m)``,
in float64. The public-split helpers here are shared with AdaDPS's side information.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import Tensor

from gradspec.optim._projectors import Projector
from gradspec.tasks import TensorData, check_splits
from gradspec.train import StepContext

logger = logging.getLogger(__name__)

def public_split(task: Any, size: int, *, seed: int = 0) -> TensorData:
    """``size`` public examples: a seeded random subset of the task's ``public`` split.

    The public split is disjoint from the private training data and from the held-out
    data that evaluation scores (Zhou et al. 2021 §5 draw 100 examples from the rest of
    the training set; AdaDPS, Li et al. 2022 §6.1, 1% of the training data). There is no
    fallback: a task without a public split is refused, and so is one whose public
    split overlaps its training or held-out split (checked again here, at first use).

    Returns:
        The examples, with their ids (``ids`` of the task's public split, if it has them).

    Raises:
        ValueError: if the task has no public split, it overlaps ``train``/``eval``, or it
            holds fewer than ``size`` examples.
    """
    public = getattr(task, "public", None)
    name = getattr(task, "name", "?")
    if public is None or len(public) == 0:
        raise ValueError(
            f"task {name!r} has no public split to draw public examples from: build it with one "
            "(bundled tasks: make_task(..., n_public=M), CLI -t n_public=M; your own task: "
            "Task(..., public=TensorData(...)) disjoint from train and eval)"
        )
    check_splits(task)
    n = len(public)
    if size < 1 or size > n:
        raise ValueError(f"public set size m={size} must be in [1, {n}]: the task's public split "
                         f"holds {n} examples (give it more with n_public=M, CLI -t n_public=M)")
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:size]
    return public.subset(idx.sort().values)


def checked_public(ctx: StepContext, public: TensorData | None, size: int, seed: int) -> TensorData:
    """The public examples of a hook: ``public`` if given (checked disjoint from the run's
    task's training and held-out data), else :func:`public_split` of the run's task."""
    if public is None:
        return public_split(ctx.task, size, seed=seed)
    if ctx.task is not None:
        check_splits(ctx.task, public)
    return public


def public_ids(public: TensorData | None) -> list[int] | None:
    """The ids of public examples as a list (what runs record), or None without ids."""
    if public is None or public.ids is None:
        return None
    return [int(i) for i in public.ids.tolist()]


def public_gradients(ctx: StepContext, data: TensorData, index: Tensor | slice | None = None) -> Tensor:
    """Per-example gradients (m x p) of public examples at the run's current parameters."""
    batch = data.batch(slice(None) if index is None else index)
    batch = {k: v.to(ctx.device) for k, v in batch.items()}
    grads = [g for g, _ in ctx.per_example.iter_microbatches(batch)]
    return torch.cat(grads) if grads else torch.zeros(0, ctx.layout.p, device=ctx.device)


def top_eigenvectors_from_rows(
    rows: Tensor, k: int, *, generator: torch.Generator | None = None, rtol: float = 1e-10
) -> tuple[Tensor, Tensor]:
    """Top-k eigenpairs of ``M = (1/m) G^T G`` for G = ``rows`` (m x p), via the m x m Gram.

    ``K = G G^T / m = U L U^T`` and ``V = G^T U L^{-1/2} / sqrt(m)``, all in float64.
    Directions with eigenvalue <= ``rtol * max`` (or beyond the rank m) are completed
    by random directions orthogonal to the others, so V is always p x k orthonormal.

    Returns:
        ``(eigenvalues (k,), V (p x k))``, float64, eigenvalues descending (0 for fill).
    """
    g = rows.double()
    m, p = g.shape
    if k > p:
        raise ValueError(f"k={k} exceeds the dimension p={p}")
    gram = g @ g.T / max(m, 1)
    evals, u = torch.linalg.eigh(gram)
    evals, u = evals.flip(0), u.flip(1)
    top = evals[:1].clamp(min=0).max().item() if m else 0.0
    keep = int((evals[:k] > rtol * top).sum().item()) if top > 0 else 0
    v = g.T @ u[:, :keep] / torch.sqrt(m * evals[:keep])
    if keep < k:
        logger.debug("public Gram has rank %d < k=%d: completing with random directions", keep, k)
        fill = torch.randn(p, k - keep, generator=generator, dtype=torch.float64)
        fill = fill.to(g.device)
        fill -= v @ (v.T @ fill)
        v = torch.cat([v, fill], dim=1)
    v, r = torch.linalg.qr(v)  # removes rounding; keeps the spanned directions in order
    diag = torch.diagonal(r)
    v = v * torch.where(diag < 0, -1.0, 1.0).to(v.dtype)
    lam = torch.cat([evals[:keep].clamp(min=0), torch.zeros(k - keep, dtype=torch.float64,
                                                            device=g.device)])
    return lam, v


class PublicProjector(Projector):
    """Top-k eigenspace of the public gradients' second moment (Zhou et al. 2021, Alg. 1).

    Args:
        rank: k.
        public_size: m, the number of public examples (taken by :func:`public_split`
            from the task's public split); at least the rank k.
        period: recompute the basis every ``period`` steps (s; 1 = every step, as in Alg. 1).
        seed: chooses the public examples.
        public: the public examples themselves (overrides ``public_size``/``seed``);
            checked disjoint from the run's training and held-out data.
    """

    kind = "public"

    def __init__(
        self, rank: int, *, public_size: int = 100, period: int = 1, seed: int = 0,
        public: TensorData | None = None,
    ) -> None:
        super().__init__(rank)
        if period < 1:
            raise ValueError(f"the recompute period s must be >= 1 step, got {period}")
        self.public_size, self.period, self.seed = int(public_size), int(period), int(seed)
        self.public = public
        self.last_update: int | None = None
        self.eigenvalues: Tensor | None = None

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        # a run starts with no basis: one projector object passed to several runs (a sweep's
        # seeds) kept the last run's basis and its update step, so the next run trained in a
        # basis of another trajectory until the period came round (found by review, exit 0)
        self.last_update, self.eigenvalues, self._basis = None, None, None
        self.public = checked_public(ctx, self.public, self.public_size, self.seed)
        self.public_size = len(self.public)
        if self.rank > self.public_size:
            raise ValueError(
                f"rank k={self.rank} exceeds the public set size m={self.public_size}: the public "
                f"second moment has rank <= m, so {self.rank - self.public_size} directions would be "
                "random; use k <= m or more public examples"
            )
        self._device = ctx.device
        self._fill = torch.Generator().manual_seed(self.seed + 1)
        self._warned = False

    def describe(self) -> dict[str, Any]:
        """What a run records: the public examples used (ids into the task's pool)."""
        return {**super().describe(), "seed": self.seed, "period": self.period,
                "public_size": self.public_size, "public_ids": public_ids(self.public)}

    def update(self, step: int, ctx: StepContext) -> bool:
        if self.last_update is not None and step - self.last_update < self.period:
            return False
        rows = public_gradients(ctx, self.public)
        lam, v = top_eigenvectors_from_rows(rows, self.rank, generator=self._fill)
        filled = int((lam == 0).sum())
        if filled and not self._warned:
            logger.warning("step %d: the public gradients span only %d of the k=%d directions; "
                           "the other %d are random", step, self.rank - filled, self.rank, filled)
            self._warned = True
        self.eigenvalues = lam.cpu()
        self._basis = v.to(device=ctx.device, dtype=rows.dtype)
        self.last_update = step
        return True

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "last_update": self.last_update, "seed": self.seed,
                 "public_size": self.public_size, "public_ids": public_ids(self.public),
                 "fill_generator": self._fill.get_state()}
        state["basis"] = None if self._basis is None else self._basis.detach().cpu().clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for key in ("seed", "public_size"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"the checkpoint's public projector has {key}={state.get(key)}, "
                                 f"this run {getattr(self, key)}")
        if "public_ids" in state and state["public_ids"] != public_ids(self.public):
            raise ValueError("the checkpoint's public projector used other public examples "
                             "(their ids differ): resume with the same task and public split")
        self.last_update = state["last_update"]
        self._fill.set_state(state["fill_generator"])
        basis = state["basis"]
        if basis is not None:
            if math.prod(basis.shape) and basis.shape[1] != self.rank:
                raise ValueError("the checkpoint's public basis has the wrong rank")
            self._basis = basis.to(getattr(self, "_device", basis.device))
