"""Seeded regeneration of every sketch factor, and the factors of a plan on a device.

Anyone can regenerate a plan's factors from its JSON (a store's ``gradspec.sketch``): the
factor ``f`` of parameter ``name`` in block j is drawn by a CPU ``torch.Generator`` seeded
with :func:`factor_seed` ``(seed, j, name, f)``, the first 8 bytes (little-endian, top bit
cleared) of ``blake2b("<seed>:<j>:<name>:<f>", digest_size=8)``:

* ``"left"``  (m0 x d0) and ``"right"`` (m1 x d1): ``torch.randn(m, d, dtype=float64,
  generator=g) / sqrt(m)`` (kind ``kronecker``; ``countsketch-kronecker`` uses ``right`` only);
  with R = ``pairs`` > 1 (version 2) one draw ``torch.randn(R m, d) / sqrt(m)`` holds the R
  pairs' factors stacked (pair q: rows ``q m .. (q + 1) m``), and R = 1 is the draw above;
* ``"hash"``: ``torch.randint(0, m0, (R, d0), generator=g)`` then, from the same generator,
  ``"sign"``: ``2 * torch.randint(0, 2, (R, d0), generator=g) - 1`` (float64) — the CountSketch
  of pair q ``S_q[hash[q, v], v] = sign[q, v]`` (R = 1: the same numbers as shape ``(d0,)``);
* ``"dense"`` (m x numel): ``torch.randn(m, numel, dtype=float64, generator=g) / sqrt(m)``;
* ``"signs"`` (version-3 and 4 plans, Kronecker kinds; seeded with block 0, one mask per parameter
  shared by its J blocks): ``2 * torch.randint(0, 2, (numel,), generator=g) - 1``, the sign mask
  D that multiplies ``vec(G)`` (row-major, G viewed as ``(d0, d1)``) value by value before the
  pairs;
* ``"rotation"`` (version-4 plans, Kronecker kinds; seeded with block 0, shared by the blocks):
  with b = ``min(d1, ROTATION_BLOCK)``, ``torch.randn(b, b, dtype=float64, generator=g)``, then
  Q = ``torch.linalg.qr`` 's Q with its columns' signs set by R's diagonal (a Haar orthogonal
  matrix); ``"rotation-tail"`` the same of size ``d1 mod b`` when that is not 0. G (d0 x d1) is
  mixed as ``G Q_bd^T``, Q_bd block-diagonal: Q on each run of b columns, the tail's on the rest,
  and then masked: the pairs sketch ``D o (G Q_bd^T)``.

Factors are drawn in float64 on the CPU (the same on every machine) and then cast and moved.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gradspec.sketch._plan import ROTATION_BLOCK, ParamSketch, SketchPlan

#: The most entries of one dense factor (m x numel); a larger dense parameter is refused.
DENSE_MAX = 2**24


def factor_seed(seed: int, block: int, name: str, factor: str) -> int:
    """The generator seed of one factor (see the module docstring)."""
    digest = hashlib.blake2b(f"{int(seed)}:{int(block)}:{name}:{factor}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def _gen(seed: int, block: int, name: str, factor: str) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(factor_seed(seed, block, name, factor))


def gaussian(seed: int, block: int, name: str, factor: str, m: int, d: int) -> Tensor:
    """(m, d) float64 with entries N(0, 1/m): ``E[P^T P] = I``."""
    g = _gen(seed, block, name, factor)
    return torch.randn(m, d, dtype=torch.float64, generator=g) / math.sqrt(m)


def gaussian_pairs(seed: int, block: int, name: str, factor: str, pairs: int, m: int, d: int) -> Tensor:
    """(pairs m, d) float64: ``pairs`` factors (m, d) stacked, each with entries N(0, 1/m)."""
    g = _gen(seed, block, name, factor)
    return torch.randn(pairs * m, d, dtype=torch.float64, generator=g) / math.sqrt(m)


def countsketch(seed: int, block: int, name: str, m: int, d: int, pairs: int = 1) -> tuple[Tensor, Tensor]:
    """(hash (pairs, d) int64 in [0, m), sign (pairs, d) float64 in {-1, +1}) of ``pairs``
    CountSketches ``S_q`` (m x d)."""
    g = _gen(seed, block, name, "hash")
    bucket = torch.randint(0, m, (pairs, d), generator=g)
    sign = (2 * torch.randint(0, 2, (pairs, d), generator=g) - 1).to(torch.float64)
    return bucket, sign


def sign_mask(seed: int, name: str, numel: int) -> Tensor:
    """(numel,) int8 in {-1, +1}: a version-3 plan's sign mask of one parameter, shared by its J
    blocks. Given the mask each block's pairs are still an unbiased estimate (``E[P^T P] = I``
    for any fixed input, and ``D^2 = I``), drawn independently of the others: the blocks stay
    independent given it, which is what the block bootstrap needs, and the row is masked once,
    not J times (a mask per block made a whole-MiniLM row 3.5x dearer to sketch)."""
    g = _gen(seed, 0, name, "signs")
    return (2 * torch.randint(0, 2, (numel,), generator=g) - 1).to(torch.int8)


def haar(seed: int, name: str, factor: str, b: int) -> Tensor:
    """(b, b) float64: a seeded Haar-distributed orthogonal matrix (QR of a Gaussian, signs fixed)."""
    g = _gen(seed, 0, name, factor)
    q, r = torch.linalg.qr(torch.randn(b, b, dtype=torch.float64, generator=g))
    return q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0)


def live_rows(mask: Tensor) -> Tensor | None:
    """The indices where ``mask`` (n,) is true (rows holding a nonzero, NaN included), or None
    where it pays to treat every row: fewer than 64 rows, or more than 3/4 of them live. An
    embedding's gradient has a row only for the tokens seen (a whole-MiniLM per-step row: a
    few hundred of its 30,522), and rows that are zero contribute exact zeros to a sketch."""
    if mask.numel() < 64:
        return None
    live = mask.nonzero().squeeze(1)
    return None if live.numel() > 0.75 * mask.numel() else live


@dataclass
class Mix:
    """What a version-3 or 4 plan does to a Kronecker-kind parameter's G (B, d0, d1) before the
    pairs of every block: ``D o (G Q_bd^T)`` (version 4) or ``D o G`` (version 3)."""

    signs: Tensor  # (d0, d1), +-1 in the factors' dtype
    rotation: Tensor | None = None  # (b, b) orthogonal: version 4
    tail: Tensor | None = None  # (t, t) orthogonal for the last d1 mod b columns

    def __call__(self, g: Tensor) -> Tensor:
        """A new (B, d0, d1) tensor: ``g`` mixed and masked. Rows of G that are all zero stay
        zero and are not multiplied: an embedding's gradient has a row only for the tokens seen
        (a whole-MiniLM per-step row: at most a few thousand of its 30,522)."""
        if self.rotation is None:
            return g * self.signs
        d1 = g.shape[-1]
        flat = g.reshape(-1, d1)
        live = live_rows(flat.ne(0).any(1))
        if live is None:
            out = self._rotate(flat)
        else:
            out = torch.zeros_like(flat).index_copy_(0, live, self._rotate(flat.index_select(0, live)))
        return out.reshape(g.shape).mul_(self.signs)

    def _rotate(self, x: Tensor) -> Tensor:
        """x (n, d1) times Q_bd^T, a new tensor."""
        b, d1 = self.rotation.shape[0], x.shape[1]
        n = d1 // b
        if self.tail is None:
            return (x.reshape(-1, b) @ self.rotation.T).reshape(x.shape)
        out = torch.empty_like(x)
        out[:, : n * b] = (x[:, : n * b].reshape(x.shape[0], n, b) @ self.rotation.T).reshape(x.shape[0], n * b)
        out[:, n * b :] = x[:, n * b :] @ self.tail.T
        return out


def mixing(plan: SketchPlan, spec: ParamSketch, *, dtype: torch.dtype = torch.float64,
           device: torch.device | str = "cpu") -> Mix | None:
    """The `Mix` of one Kronecker-kind parameter (drawn once: every block's pairs share it), or
    None: a plan before version 3, or a kind without pairs."""
    if not plan.signed or spec.kind not in ("kronecker", "countsketch-kronecker"):
        return None
    d0, d1 = spec.matrix

    def put(t: Tensor) -> Tensor:
        return t.to(device=device, dtype=dtype)

    out = Mix(put(sign_mask(plan.seed, spec.name, spec.numel).reshape(d0, d1)))
    if plan.rotated:
        b = min(d1, ROTATION_BLOCK)
        out.rotation = put(haar(plan.seed, spec.name, "rotation", b))
        if d1 % b:
            out.tail = put(haar(plan.seed, spec.name, "rotation-tail", d1 % b))
    return out


def check_dense(spec: ParamSketch) -> None:
    """Refuse a dense factor too large to hold (one line naming the parameter)."""
    if spec.kind == "dense" and spec.dims[0] * spec.numel > DENSE_MAX:
        raise ValueError(
            f"parameter {spec.name!r} ({spec.numel:,} values) has no structured sketch and a dense one of "
            f"{spec.dims[0]} x {spec.numel:,} exceeds {DENSE_MAX:,} entries: leave it out of --params "
            "or use a smaller --sketch"
        )


@dataclass
class BlockFactors:
    """One parameter's factors in one block, as the fast path uses them."""

    cols: tuple[int, int]
    left: Tensor | None = None  # (R m0, d0) kronecker: R pairs' left factors stacked
    right: Tensor | None = None  # (R m1, d1) kronecker, countsketch-kronecker
    bucket: Tensor | None = None  # (R, d0) countsketch-kronecker
    sign: Tensor | None = None  # (R, d0)
    dense: Tensor | None = None  # (m, numel)


def block_factors(plan: SketchPlan, spec: ParamSketch, block: int, *, dtype: torch.dtype = torch.float64,
                  device: torch.device | str = "cpu") -> BlockFactors:
    """The factors of ``spec`` in ``block``, scaled by ``1/sqrt(J R)`` (R = ``spec.pairs``;
    folded into ``left``, ``sign`` or ``dense``), cast to ``dtype`` on ``device``. A version-3
    or 4 plan's mixing, shared by the blocks, is `mixing`'s."""
    if spec.kind == "exact":
        raise ValueError(f"parameter {spec.name!r} is stored exactly: it has no factors")
    r = spec.pairs
    scale = 1.0 / math.sqrt(plan.n_blocks * r)
    d0, d1 = spec.matrix
    out = BlockFactors(spec.columns[block])

    def put(t: Tensor) -> Tensor:
        return t.to(device=device, dtype=dtype)

    if spec.kind == "kronecker":
        out.left = put(gaussian_pairs(plan.seed, block, spec.name, "left", r, spec.dims[0], d0) * scale)
        out.right = put(gaussian_pairs(plan.seed, block, spec.name, "right", r, spec.dims[1], d1))
    elif spec.kind == "countsketch-kronecker":
        bucket, sign = countsketch(plan.seed, block, spec.name, spec.dims[0], d0, r)
        out.bucket, out.sign = bucket.to(device), put(sign * scale)
        out.right = put(gaussian_pairs(plan.seed, block, spec.name, "right", r, spec.dims[1], d1))
    else:
        check_dense(spec)
        out.dense = put(gaussian(plan.seed, block, spec.name, "dense", spec.dims[0], spec.numel) * scale)
    return out


def dense_left(plan: SketchPlan, spec: ParamSketch, block: int) -> Tensor:
    """The (scaled) left factors of a Kronecker kind as dense float64 matrices (R, m0, d0)."""
    f = block_factors(plan, spec, block)
    r, (m0, d0) = spec.pairs, (spec.dims[0], spec.matrix[0])
    if spec.kind == "kronecker":
        return f.left.reshape(r, m0, d0)
    s = torch.zeros(r, m0, d0, dtype=torch.float64)
    q = torch.arange(r)[:, None].expand(r, d0)
    s[q, f.bucket, torch.arange(d0).expand(r, d0)] = f.sign
    return s


def kron_apply(left: Tensor, right: Tensor, g: Tensor) -> Tensor:
    """(B, R m0 m1): pair q's ``vec(L_q G R_q^T)`` side by side, for g (B, d0, d1), left (R, m0, d0)
    and right (R m1, d1)."""
    r = left.shape[0]
    right = right.reshape(r, -1, right.shape[-1])
    y = torch.einsum("qad,bde,qfe->bqaf", left.to(g.dtype), g, right.to(g.dtype))
    return y.reshape(g.shape[0], -1)


@dataclass
class StackedFactors:
    """One Kronecker-kind parameter's factors of all J blocks stacked, so that the fast path
    takes one product per factor and one batched product for every block at once.

    ``left`` (J R m0, d0) and ``right`` (J R m1, d1) stack the blocks' factors, each block's
    R pairs in turn (``left`` None for ``countsketch-kronecker``, which has ``bucket``,
    ``sign``: (J R, d0)); ``blocks`` counts the J R stacked pairs; block j's columns start at
    ``start + j * stride``, its pair q's ``q m0 m1`` further; ``mix``, a version-3 or 4 plan's
    `Mix` of G before the pairs.
    """

    m0: int
    m1: int
    start: int
    stride: int
    right: Tensor
    left: Tensor | None = None
    bucket: Tensor | None = None
    sign: Tensor | None = None
    pairs: int = 1
    mix: Mix | None = None  # version 3 or 4: shared by the blocks

    @property
    def blocks(self) -> int:
        """The stacked pairs, J R (what the fast path's batched products run over)."""
        return self.right.shape[0] // self.m1

    def add(self, y: Tensor, out: Tensor) -> None:
        """``out[:, cols of block j, pair q] += y[:, j R + q]`` for y (B, J R, m0, m1) (or
        (B, J R, m0 m1))."""
        b, j = y.shape[0], y.shape[1] // self.pairs
        width = self.pairs * self.m0 * self.m1
        view = out.as_strided((b, j, width), (out.stride(0), self.stride, 1), out.storage_offset() + self.start)
        view += y.reshape(b, j, width).to(out.dtype)


def stack(factors: list[BlockFactors], spec: ParamSketch) -> StackedFactors:
    """The blocks of a Kronecker-kind parameter stacked (`StackedFactors`)."""
    m0, m1 = spec.dims
    starts = [f.cols[0] for f in factors]
    stride = starts[1] - starts[0] if len(starts) > 1 else 0
    if any(b - a != stride for a, b in zip(starts, starts[1:], strict=False)):
        raise ValueError(f"the blocks of {spec.name!r} are not evenly spaced: {starts}")
    out = StackedFactors(m0, m1, starts[0], stride, torch.cat([f.right for f in factors]), pairs=spec.pairs)
    if spec.kind == "kronecker":
        out.left = torch.cat([f.left for f in factors])
    else:
        out.bucket = torch.cat([f.bucket for f in factors])
        out.sign = torch.cat([f.sign for f in factors])
    return out


class SketchFactors:
    """Every factor of a plan, built once on the run's device (the fast path's cache).

    ``factors[name]`` lists one :class:`BlockFactors` per block (empty for an exact parameter);
    ``stacked[name]`` holds a Kronecker-kind parameter's blocks stacked (`StackedFactors`).
    """

    def __init__(self, plan: SketchPlan, *, dtype: torch.dtype, device: torch.device | str) -> None:
        self.plan = plan
        self.specs = {s.name: s for s in plan.params}
        for s in plan.params:
            check_dense(s)
        self.factors = {s.name: [] if s.kind == "exact" else
                        [block_factors(plan, s, j, dtype=dtype, device=device) for j in range(plan.n_blocks)]
                        for s in plan.params}
        self.mix = {s.name: mixing(plan, s, dtype=dtype, device=device) for s in plan.params}
        self.stacked = {s.name: stack(self.factors[s.name], s) for s in plan.params
                        if s.kind in ("kronecker", "countsketch-kronecker")}
        for name, st in self.stacked.items():
            st.mix = self.mix[name]

    def add_flat(self, name: str, rows: Tensor, out: Tensor) -> None:
        """Add the sketch of materialised per-example gradients ``rows`` (B, numel) of parameter
        ``name`` (kinds ``exact`` and ``dense``; any kind, used for small parameters) to ``out`` (B, M)."""
        spec = self.specs[name]
        rows = rows.reshape(rows.shape[0], -1)
        if spec.kind == "exact":
            a, b = spec.columns[0]
            out[:, a:b] += rows.to(out.dtype)
            return
        g = None
        for f in self.factors[name]:
            a, b = f.cols
            if f.dense is not None:
                out[:, a:b] += (rows.to(f.dense.dtype) @ f.dense.T).to(out.dtype)
            else:
                if g is None:  # G, mixed and masked (version 3 or 4) once for every block
                    g = rows.reshape(rows.shape[0], *spec.matrix).to(f.right.dtype)
                    if self.mix[name] is not None:
                        g = self.mix[name](g)
                if f.left is not None:
                    left = f.left.reshape(spec.pairs, spec.dims[0], -1)
                else:
                    left = torch.zeros(spec.pairs, spec.dims[0], g.shape[1], dtype=g.dtype, device=g.device)
                    q = torch.arange(spec.pairs, device=g.device)[:, None].expand_as(f.bucket)
                    d = torch.arange(g.shape[1], device=g.device).expand_as(f.bucket)
                    left[q, f.bucket, d] = f.sign.to(g.dtype)
                out[:, a:b] += kron_apply(left, f.right, g).to(out.dtype)
