"""Projectors onto a k-dimensional gradient subspace, never forming a p x p matrix.

A projector holds an orthonormal basis ``V`` (p x k, rows in the parameter layout
order) and applies ``P x = V (V^T x)`` in O(pk). Three kinds:

* :class:`FixedProjector` — a given basis, e.g. the top-k right singular vectors
  of a spectrum store (Li et al. 2022, §4.2 "retrain in fixed subspace").
* :class:`PublicProjector` — the top-k eigenvectors of the public second-moment
  matrix ``M_t = (1/m) sum_i g_i g_i^T`` over m public examples, recomputed every
  ``period`` steps at the current parameters (Zhou et al. 2021, Algorithm 1, line 4).
  With the m x p public gradient matrix ``G``, the eigenvectors come from the
  m x m Gram ``K = G G^T / m = U L U^T`` as ``V = G^T U L^{-1/2} / sqrt(m)``, in float64.
* :class:`RandomProjector` — a Gaussian p x k matrix, orthonormalised (the RPDP-SGD
  baseline of Zhou et al. 2021, §5).

Projectors are set up against a run (``setup(ctx)``) and may refresh their basis at
the start of a step (``update(step, ctx)``, which says whether the basis changed).

Large bases (more than :data:`LARGE_BASIS` entries, e.g. k = 1000 directions of
MiniLM's 1.77M query/value weights: 7 GB in float32) stay in float32 and are
orthonormalised in place by Cholesky QR with float64 Gram sums, because a float64 copy
and a Householder QR of them would need 14–28 GB; small ones are kept in float64.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gradspec.tasks import TensorData, check_splits
from gradspec.train import StepContext

logger = logging.getLogger(__name__)

__all__ = [
    "FixedProjector",
    "LARGE_BASIS",
    "Projector",
    "PublicProjector",
    "RandomProjector",
    "public_ids",
    "orthonormalize_",
    "public_split",
    "top_eigenvectors_from_rows",
]


class Projector:
    """An orthonormal basis ``V`` (p x k) and the maps it defines.

    Subclasses build ``self._basis`` in :meth:`setup` (and maybe :meth:`update`).
    """

    kind = "projector"

    def __init__(self, rank: int) -> None:
        if int(rank) < 1:
            raise ValueError(f"the projector rank k must be >= 1, got {rank}")
        self.rank = int(rank)
        self._basis: Tensor | None = None

    # ------------------------------------------------------------------ lifecycle
    def setup(self, ctx: StepContext) -> None:
        """Prepare for ``run`` (its ``layout.p``, ``device``, task and gradients)."""
        if self.rank > ctx.layout.p:
            raise ValueError(f"rank k={self.rank} exceeds the {ctx.layout.p} trained parameters")

    def update(self, step: int, ctx: StepContext) -> bool:
        """Refresh the basis if it is due at ``step``; returns whether it changed."""
        return False

    # ------------------------------------------------------------------ maps
    @property
    def basis(self) -> Tensor:
        """The orthonormal basis V (p x k) on the run's device."""
        if self._basis is None:
            raise RuntimeError(f"the {self.kind} projector has no basis yet: call setup(run) first")
        return self._basis

    def coords(self, x: Tensor) -> Tensor:
        """``V^T x`` for x of shape (p,), or the rows of x (b, p) -> (b, k)."""
        v = self.basis
        return x.to(v.dtype) @ v

    def lift(self, z: Tensor) -> Tensor:
        """``V z`` for z of shape (k,), or rows (b, k) -> (b, p)."""
        v = self.basis
        return z.to(v.dtype) @ v.T

    def project(self, x: Tensor) -> Tensor:
        """``V V^T x`` (rows of a 2-D x projected each), in x's dtype."""
        return self.lift(self.coords(x)).to(x.dtype)

    # ------------------------------------------------------------------ state
    def describe(self) -> dict[str, Any]:
        """What a run records about the subspace (JSON-able)."""
        return {"kind": self.kind, "rank": self.rank}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind or state.get("rank") != self.rank:
            raise ValueError(
                f"the checkpoint holds a {state.get('kind')} projector of rank {state.get('rank')}, "
                f"this run uses a {self.kind} projector of rank {self.rank}"
            )


#: Above this many entries (p·k) a basis is kept in float32 and orthonormalised in place.
LARGE_BASIS = 20_000_000
#: Rows per block of the float64-summed Gram V^T V (the float32 products stay short).
_GRAM_ROWS = 8192


def _gram64(v: Tensor) -> Tensor:
    """``V^T V`` (k x k, float64) of a tall V: row-block products in V's dtype, summed in float64.

    Memory is one k x k block beyond V; a float64 copy of V is never made.
    """
    k = v.shape[1]
    gram = torch.zeros(k, k, dtype=torch.float64, device=v.device)
    for i in range(0, v.shape[0], _GRAM_ROWS):
        block = v[i:i + _GRAM_ROWS]
        gram += (block.T @ block).double()
    return (gram + gram.T) / 2


def _orthonormality_error(v: Tensor) -> float:
    """``max |V^T V - I|``."""
    gram = _gram64(v) if v.numel() > LARGE_BASIS else v.T.double() @ v.double()
    return (gram - torch.eye(v.shape[1], dtype=torch.float64, device=v.device)).abs().max().item()


def orthonormalize_(v: Tensor, *, tol: float | None = None, max_passes: int = 3) -> float:
    """Orthonormalise the columns of a tall ``v`` (p x k) in place; returns ``max |V^T V - I|``.

    Cholesky QR: with ``V^T V = R^T R`` (R upper triangular, from the float64 Gram),
    ``V <- V R^{-1}`` has orthonormal columns and, as R is triangular, its first j
    columns span what the first j columns of V spanned, for every j. One pass leaves
    an error of order eps·cond(V)^2, so passes repeat (at most ``max_passes``) until
    the measured error is at most ``tol`` (default 1e-5 in float32, 1e-12 in float64).
    The time is about 3pk^2 flops per pass plus 2pk^2 per check; the memory, V itself.

    Raises:
        ValueError: if V is not 2-D with p >= k, or its columns are linearly dependent
            to working precision (Cholesky fails), or the error is still above ``tol``
            after ``max_passes`` passes (never returns a basis that is not orthonormal).
    """
    if v.ndim != 2 or v.shape[0] < v.shape[1]:
        raise ValueError(f"orthonormalize_ needs a tall p x k matrix (p >= k), got shape {tuple(v.shape)}")
    if tol is None:
        tol = 1e-5 if v.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-12
    eye = torch.eye(v.shape[1], dtype=torch.float64, device=v.device)
    gram = _gram64(v)
    err = (gram - eye).abs().max().item()
    for _ in range(max_passes):
        if err <= tol:
            break
        chol, info = torch.linalg.cholesky_ex(gram)
        if int(info) != 0:
            raise ValueError(f"the basis columns are linearly dependent (Cholesky of V^T V failed at "
                             f"column {int(info)}): pass k independent directions")
        r = chol.T.to(v.dtype)
        for i in range(0, v.shape[0], _GRAM_ROWS):
            block = v[i:i + _GRAM_ROWS]
            block.copy_(torch.linalg.solve_triangular(r, block, upper=True, left=False))
        gram = _gram64(v)
        err = (gram - eye).abs().max().item()
    if err > tol:
        raise ValueError(f"the basis could not be orthonormalised to {tol:g} in {max_passes} passes (max "
                         f"|V^T V - I| = {err:.2e}): its columns are nearly dependent; pass k independent "
                         "directions")
    return err


def _orthonormal(v: Tensor, what: str, atol: float) -> None:
    err = _orthonormality_error(v)
    if err > atol:
        raise ValueError(
            f"{what} is not orthonormal (max |V^T V - I| = {err:.2e} > {atol:g}); pass "
            "orthonormalize=True to fix it with a QR decomposition"
        )


Layout = Sequence[tuple[str, Sequence[int]]]


def _layout_pairs(layout: Any) -> list[tuple[str, tuple[int, ...]]]:
    """``[(name, shape), ...]`` of a ParamLayout (its ``params``) or of such pairs."""
    items = layout.params if hasattr(layout, "params") else layout
    pairs = []
    for item in items:
        name, shape = (item.name, item.shape) if hasattr(item, "name") else item
        pairs.append((str(name), tuple(int(x) for x in shape)))
    return pairs


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _check_layout(basis: Layout, run: Layout, p: int) -> None:
    """Refuse a basis whose rows are other parameters than the run trains.

    A row of V is one column of the gradient matrix: equal p proves nothing (the
    query and the value weights of a layer have the same p). Names, shapes and their
    order must all agree.
    """
    expected, found = _layout_pairs(basis), _layout_pairs(run)
    if expected == found:
        return
    exp_names, got_names = [n for n, _ in expected], [n for n, _ in found]
    only_basis = [n for n in exp_names if n not in set(got_names)]
    only_run = [n for n in got_names if n not in set(exp_names)]
    advice = "retrain the parameters the spectrum was computed on (--params)"
    if only_basis or only_run:
        raise ValueError(
            f"the fixed subspace is of other parameters than the run trains (equal p={p} is not "
            f"enough): the basis covers {_names(only_basis) or 'no others'}, the run trains "
            f"{_names(only_run) or 'no others'}; {advice}")
    shapes = dict(expected)
    bad = [n for n, shape in found if shapes[n] != shape]
    if bad:
        raise ValueError(f"the fixed subspace has parameter {bad[0]!r} with shape {shapes[bad[0]]}, "
                         f"the run trains it with shape {dict(found)[bad[0]]}; {advice}")
    first = next(i for i, (a, b) in enumerate(zip(exp_names, got_names, strict=True)) if a != b)
    raise ValueError(f"the fixed subspace orders its parameters differently from the run (position "
                     f"{first}: {exp_names[first]!r} in the basis, {got_names[first]!r} in the run), "
                     f"so its rows would be read as the wrong coordinates; {advice}")


def _fingerprint(v: Tensor) -> str:
    """SHA-1 of V's float32 bytes, read in place (a float32 CPU basis is not copied)."""
    a = v.detach().to("cpu", torch.float32).contiguous().numpy()
    return hashlib.sha1(memoryview(a).cast("B")).hexdigest()


class FixedProjector(Projector):
    """A fixed basis, e.g. the top-k right singular vectors of a spectrum store.

    Args:
        basis: V (p x k'), k' >= rank; the first ``rank`` columns are used.
        rank: k (default: all columns).
        orthonormalize: re-orthonormalise (QR in float64; in place by Cholesky QR
            for a large basis, see the module note), for a basis stored in low
            precision; by default the basis is checked instead.
        atol: tolerance of the orthonormality check.
        layout: the parameters the basis rows belong to, in order: a ``ParamLayout`` or
            ``(name, shape)`` pairs. When given, :meth:`setup` refuses a run that trains
            other parameters (names, shapes or order differ), even of the same p.
        source: where the basis came from (recorded by :meth:`describe`).
        copy: ``False`` lets a large float32 basis be orthonormalised in place, so
            the caller's tensor changes (saves a p x k copy; for a basis read from a
            store that nobody else holds).
    """

    kind = "fixed"

    def __init__(
        self, basis: Tensor, *, rank: int | None = None, orthonormalize: bool = False,
        atol: float = 1e-3, layout: Any = None, source: str | None = None, copy: bool = True,
    ) -> None:
        basis = torch.as_tensor(basis)
        if basis.ndim != 2:
            raise ValueError(f"a basis is a p x k matrix, got shape {tuple(basis.shape)}")
        rank = basis.shape[1] if rank is None else int(rank)
        if rank > basis.shape[1]:
            raise ValueError(f"rank k={rank} exceeds the {basis.shape[1]} basis vectors available")
        super().__init__(rank)
        v = basis[:, :rank]
        self.orthonormality_error: float | None = None
        if v.numel() > LARGE_BASIS:  # float32, no float64 copy, no Householder workspace
            keep = not copy and v.dtype == torch.float32 and v.is_contiguous()
            v = v if keep else v.to(torch.float32, copy=True).contiguous()
            if orthonormalize:
                self.orthonormality_error = orthonormalize_(v)
            else:
                _orthonormal(v, "the given basis", atol)
        else:
            v = v.double()
            if orthonormalize:
                v, _ = torch.linalg.qr(v)
            else:
                _orthonormal(v, "the given basis", atol)
        self._source = v
        self._fp = _fingerprint(v)
        self.layout = None if layout is None else _layout_pairs(layout)
        self.source = source
        if self.layout is not None:
            p = sum(math.prod(shape) for _, shape in self.layout)
            if p != v.shape[0]:
                raise ValueError(f"the basis has {v.shape[0]} rows but its layout {p} parameters")

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        if self._source.shape[0] != ctx.layout.p:
            raise ValueError(
                f"the basis has {self._source.shape[0]} rows but the run trains {ctx.layout.p} "
                "parameters: retrain the same parameters (--params) that the spectrum was computed on"
            )
        if self.layout is not None and hasattr(ctx.layout, "params"):
            _check_layout(self.layout, ctx.layout, ctx.layout.p)
        dtype = ctx.params[0].dtype if ctx.params else torch.float32
        self._basis = self._source.to(device=ctx.device, dtype=dtype)  # moved once

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "fingerprint": self._fp, "source": self.source,
                "parameters": None if self.layout is None else [n for n, _ in self.layout],
                "dtype": str(self._source.dtype).removeprefix("torch."),
                **({} if self.orthonormality_error is None else
                   {"orthonormality_error": self.orthonormality_error})}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "fingerprint": self._fp}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("fingerprint") != self._fp:
            raise ValueError("the checkpoint was trained in a different fixed subspace (basis differs)")


class RandomProjector(Projector):
    """A Gaussian p x k matrix, orthonormalised (RPDP-SGD, Zhou et al. 2021 §5).

    Its span is uniformly distributed over k-dimensional subspaces (the Gaussian
    matrix's law is rotation invariant, and orthonormalising keeps the span). QR in
    float64; a large basis is drawn in float32 and orthonormalised in place by
    Cholesky QR (see the module note). The basis is regenerated from ``seed`` (not
    stored in checkpoints).
    """

    kind = "random"

    def __init__(self, rank: int, *, seed: int = 0) -> None:
        super().__init__(rank)
        self.seed = int(seed)
        self.orthonormality_error: float | None = None

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        p = ctx.layout.p
        generator = torch.Generator().manual_seed(self.seed)
        if p * self.rank <= LARGE_BASIS:
            q, _ = torch.linalg.qr(torch.randn(p, self.rank, generator=generator, dtype=torch.float64))
        else:
            q = torch.randn(p, self.rank, generator=generator, dtype=torch.float32)
            self.orthonormality_error = orthonormalize_(q)
        pdtype = ctx.params[0].dtype if ctx.params else torch.float32
        self._basis = q.to(device=ctx.device, dtype=pdtype)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "seed": self.seed,
                **({} if self.orthonormality_error is None else
                   {"orthonormality_error": self.orthonormality_error})}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("seed") != self.seed:
            raise ValueError(f"the checkpoint used random projector seed {state.get('seed')}, not {self.seed}")


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
