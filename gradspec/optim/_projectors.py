"""Projectors onto a k-dimensional gradient subspace, never forming a p x p matrix.

A projector holds an orthonormal basis ``V`` (p x k, rows in the parameter layout
order) and applies ``P x = V (V^T x)``, or its complement ``x - V (V^T x)``, in O(pk).
Three kinds:

* :class:`FixedProjector` — a given basis, e.g. the top-k right singular vectors
  of a spectrum store (Li et al. 2022, §4.2 "retrain in fixed subspace").
* :class:`PublicProjector` (in ``_public``) — the top-k eigenvectors of the public second-moment
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

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gradspec._seeds import MASK64, mix64
from gradspec.optim._orthonormal import (
    LARGE_BASIS,
    _fingerprint,
    _orthonormal,
    check_spectrum_basis,
    orthonormalize_,
)
from gradspec.train import StepContext

logger = logging.getLogger(__name__)

__all__ = ["FixedProjector", "Projector", "RandomProjector"]


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

    def project_out(self, x: Tensor) -> Tensor:
        """``x - V V^T x``, the part orthogonal to the subspace (rows each), in x's dtype.

        The projector onto the orthogonal complement, ``I - V V^T``, in O(pk) as well.
        """
        return (x.to(self.basis.dtype) - self.lift(self.coords(x))).to(x.dtype)

    # ------------------------------------------------------------------ state
    def describe(self) -> dict[str, Any]:
        """What a run records about the subspace (JSON-able)."""
        return {"kind": self.kind, "rank": self.rank}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the projector: its kind and rank, and what each kind adds
        to tell its basis apart (a fingerprint, a seed, the public examples)."""
        return {"kind": self.kind, "rank": self.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check a checkpoint's projector against this one (restoring what it carries).

        Raises:
            ValueError: the checkpoint trained with another kind, rank or basis.
        """
        if state.get("kind") != self.kind or state.get("rank") != self.rank:
            raise ValueError(
                f"the checkpoint holds a {state.get('kind')} projector of rank {state.get('rank')}, "
                f"this run uses a {self.kind} projector of rank {self.rank}"
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
        repair_only: with ``orthonormalize``, the basis is orthonormal up to rounding (a
            spectrum store's float32 V): refuse one whose max |VᵀV − I| exceeds this (a
            damaged store) instead of turning it into another subspace by QR.
    """

    kind = "fixed"

    def __init__(
        self, basis: Tensor, *, rank: int | None = None, orthonormalize: bool = False,
        atol: float = 1e-3, layout: Any = None, source: str | None = None, copy: bool = True,
        repair_only: float | None = None,
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
                self.orthonormality_error = orthonormalize_(v, repair_only=repair_only)
            else:
                _orthonormal(v, "the given basis", atol)
                v = v.clone() if keep else v
                self.orthonormality_error = orthonormalize_(v)  # see below
        else:
            v = v.double()
            if orthonormalize:
                if repair_only is not None:
                    check_spectrum_basis(v, repair_only)
                v, _ = torch.linalg.qr(v)
            else:
                _orthonormal(v, "the given basis", atol)
                # A basis within atol of orthonormal is made exactly so, its span (and each leading
                # span) kept: V·Vᵀ is a contraction only then, and the projected sum's sensitivity C
                # with it (found by review: max |VᵀV − I| = 1e-3 at k = 100 let V·Vᵀ lengthen a
                # clipped sum of norm 1 to 1.099, and ε was reported for C).
                v = v.to(torch.float64, copy=True)
                self.orthonormality_error = orthonormalize_(v)
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


#: Mixed into a random projector's seed: its draws are a stream of their own, not the first
#: normals of ``Generator(seed)`` that a task seeded alike may have drawn its data from.
_PROJECTOR_STREAM = 0x52414E444F4D5052  # "RANDOMPR"


def projector_generator(seed: int) -> torch.Generator:
    """The generator of a random projector seeded ``seed``: splitmix64 of the seed and a tag of
    its own. Found by review: drawn from ``Generator(seed)`` itself, a rank-1 "random" control of
    the lowrank and ballglm tasks (whose data come first from the same generator at the same
    seed) was the first row of the data's own matrix, keeping 0.54–0.82 of its energy in the
    5-dimensional row space, where an independent direction keeps ~0.05."""
    return torch.Generator().manual_seed(mix64((int(seed) & MASK64) ^ _PROJECTOR_STREAM) >> 1)


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
        generator = projector_generator(self.seed)
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


