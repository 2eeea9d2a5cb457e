"""The sketch plan: which parameter is stored how, in which columns (issue 22).

A sketched per-example row ``y_i`` is a seeded random linear map of the clipped gradient
``c_i g_i`` (p values) into M columns, laid out block-major:

* first the **exact** columns: every parameter small enough to keep whole (a bias, a
  normalisation weight) is copied, in layout order;
* then J **independent blocks** (default 8), each a full sketch of every other parameter
  with its own seeds, scaled by ``1/sqrt(J)``: block j holds, per parameter in layout
  order, ``(P_0 (x) P_1) vec(G) / sqrt(J) = vec(P_0 G P_1^T) / sqrt(J)`` (kind
  ``kronecker``: G the parameter's gradient viewed as a matrix, ``(shape[0], prod(shape[1:]))``,
  P_0 (m0 x d0) and P_1 (m1 x d1) with entries N(0, 1/m)), ``S G P_1^T / sqrt(J)`` (kind
  ``countsketch-kronecker``, embeddings: S a CountSketch of the vocabulary, one +-1 per
  column), or ``P vec(G) / sqrt(J)`` (kind ``dense``: P (m x numel), entries N(0, 1/m)).

Every factor has ``E[P^T P] = I``, so for the stored matrix Y (rows y_i) with exact part
``Y_x`` and blocks ``Y_j``: ``Y Y^T = Y_x Y_x^T + sum_j Y_j Y_j^T``, and for every j,
``Y_x Y_x^T + J Y_j Y_j^T`` is an unbiased estimate of ``H H^T`` (H the unsketched rows).

How M is split (deterministic from the layout, the kinds, M, J): a parameter is exact when
its size is at most ``M / (4 K)`` (K parameters), smallest first, while the exact columns stay
within M/2; the rest ``M - E`` is split into J equal blocks of ``(M - E) // J`` columns, and a
block's columns across the sketched parameters in proportion to their size (each at least 1,
largest remainders first). A Kronecker parameter with m columns takes ``m0 x m1 <= m`` near
the aspect ``d0 : d1`` (using at least 90% of what any pair could); the columns the pairs leave
unused go to the dense parameters (largest first, up to their size) and are otherwise dropped,
so the stored width (``M`` in the plan) may be a little below the M asked for (``requested_M``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gradspec._layout import ParamLayout

#: The plan family written into a store (``"kind"``), and its format version.
FAMILY = "kronecker-gaussian"
VERSION = 1
#: How each parameter is stored.
KINDS = ("exact", "kronecker", "countsketch-kronecker", "dense")
#: The kinds a layer rule may ask for (``exact`` is decided by the plan, by size).
SKETCH_KINDS = KINDS[1:]
DEFAULT_BLOCKS = 8


@dataclass(frozen=True)
class ParamSketch:
    """One parameter's part of the plan.

    ``dims`` is the per-block sketch shape: ``(m0, m1)`` for the Kronecker kinds, ``(m,)``
    for ``dense``, ``(numel,)`` for ``exact``; ``matrix`` is the parameter viewed as
    ``(d0, d1)`` (``d1 = prod(shape[1:])``; ``(numel, 1)`` for a vector). ``columns`` lists
    its half-open column ranges: one for an exact parameter, else one per block.
    """

    name: str
    shape: tuple[int, ...]
    offset: int  # first column of the parameter in the unsketched row
    kind: str
    dims: tuple[int, ...]
    columns: tuple[tuple[int, int], ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def matrix(self) -> tuple[int, int]:
        d0 = self.shape[0] if self.shape else 1
        return d0, self.numel // max(d0, 1)

    @property
    def width(self) -> int:
        """Columns per block (the exact columns for an exact parameter)."""
        return math.prod(self.dims)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "offset": self.offset, "kind": self.kind,
                "dims": list(self.dims), "columns": [list(c) for c in self.columns]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParamSketch:
        kind = str(d["kind"])
        if kind not in KINDS:
            raise ValueError(f"unknown sketch kind {kind!r} of parameter {d.get('name')!r}; one of {', '.join(KINDS)}")
        return cls(str(d["name"]), tuple(int(s) for s in d["shape"]), int(d["offset"]), kind,
                   tuple(int(s) for s in d["dims"]), tuple((int(a), int(b)) for a, b in d["columns"]))


@dataclass(frozen=True)
class SketchPlan:
    """A whole row's sketch: M columns, J blocks, one :class:`ParamSketch` per parameter."""

    seed: int
    requested_M: int
    n_blocks: int
    params: tuple[ParamSketch, ...]
    exact_width: int
    block_width: int

    @property
    def M(self) -> int:  # noqa: N802 - the paper's name
        """Stored columns."""
        return self.exact_width + self.n_blocks * self.block_width

    @property
    def p(self) -> int:
        """Unsketched parameter count."""
        return sum(s.numel for s in self.params)

    @property
    def names(self) -> list[str]:
        """The sketched parameters' names, in the plan's order."""
        return [s.name for s in self.params]

    def block_range(self, j: int) -> tuple[int, int]:
        """The stored columns ``[start, stop)`` of independent block ``j`` (after the exact columns)."""
        start = self.exact_width + j * self.block_width
        return start, start + self.block_width

    def column_layout(self) -> ParamLayout:
        """The stored row as a layout of pseudo-parameters: ``sketch.exact`` (when any
        parameter is exact), then ``sketch.block0``, ``sketch.block1``, ... (so that
        ``--params 'sketch.block3'`` selects one block's columns)."""
        parts = [("sketch.exact", (self.exact_width,))] if self.exact_width else []
        parts += [(f"sketch.block{j}", (self.block_width,)) for j in range(self.n_blocks)]
        return ParamLayout.from_shapes(parts)

    def to_dict(self) -> dict[str, Any]:
        """The store attribute ``gradspec.sketch`` (docs/store-format.md)."""
        return {
            "kind": FAMILY, "version": VERSION, "seed": self.seed, "M": self.M, "requested_M": self.requested_M,
            "p": self.p,
            "blocks": [[list(self.block_range(j))] for j in range(self.n_blocks)],
            "exact": [[0, self.exact_width]] if self.exact_width else [],
            "scale": 1.0 / math.sqrt(self.n_blocks),
            "seeds": "blake2b-8 of '<seed>:<block>:<parameter name>:<factor>' (gradspec.sketch.factor_seed)",
            "params": [s.to_dict() for s in self.params],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SketchPlan:
        """Read ``to_dict`` back (a store's ``gradspec.sketch``), checking its family and columns."""
        if d.get("kind") != FAMILY or d.get("version") != VERSION:
            raise ValueError(f"sketch plan of kind {d.get('kind')!r} version {d.get('version')!r}: this gradspec "
                             f"reads {FAMILY!r} version {VERSION}; upgrade gradspec")
        params = tuple(ParamSketch.from_dict(p) for p in d["params"])
        blocks = [[tuple(r) for r in b] for b in d["blocks"]]
        exact = sum(b - a for a, b in d["exact"])
        width = blocks[0][0][1] - blocks[0][0][0] if blocks else 0
        plan = cls(int(d["seed"]), int(d.get("requested_M", d["M"])), len(blocks), params, exact, width)
        if int(d["M"]) != plan.M or any([plan.block_range(j)] != b for j, b in enumerate(blocks)):
            raise ValueError(f"sketch plan of M = {d['M']} whose block column ranges do not tile its columns")
        return plan


def make_plan(layout: ParamLayout, kinds: Mapping[str, str], M: int, *, seed: int = 0,  # noqa: N803
              blocks: int = DEFAULT_BLOCKS) -> SketchPlan:
    """The plan of rows of ``layout`` sketched into (at most) M columns.

    Args:
        layout: the unsketched row's parameters.
        kinds: per parameter, the sketch its layer supports (``kronecker``,
            ``countsketch-kronecker`` or ``dense``); a small parameter is stored exactly
            whatever its kind.
        M: columns asked for.
        seed: the plan seed (every factor's seed derives from it, `factor_seed`).
        blocks: J >= 2 independent blocks.

    Raises:
        ValueError: J < 2, or M too small to give every sketched parameter a column per block.
    """
    if blocks < 2:
        raise ValueError(f"a sketch needs at least 2 independent blocks, got {blocks}")
    if M < 1:
        raise ValueError(f"the sketch size M must be >= 1, got {M}")
    for s in layout.params:
        if kinds.get(s.name) not in SKETCH_KINDS:
            raise ValueError(f"parameter {s.name!r} has sketch kind {kinds.get(s.name)!r}; one of "
                             f"{', '.join(SKETCH_KINDS)}")
    specs = list(layout.params)
    limit = M / (4 * len(specs))
    exact: set[str] = set()
    used = 0
    for s in sorted(specs, key=lambda s: (s.numel, s.offset)):
        if s.numel <= limit and used + s.numel <= M // 2:
            exact.add(s.name)
            used += s.numel
    rest = [s for s in specs if s.name not in exact]
    per_block = (M - used) // blocks
    if rest and per_block < len(rest):
        raise ValueError(
            f"--sketch {M} with {blocks} blocks leaves {per_block} columns per block for {len(rest)} sketched "
            f"parameters (each needs at least one): give --sketch >= {used + blocks * len(rest)} or fewer "
            "--sketch-blocks"
        )
    budget = _split(per_block, [s.numel for s in rest]) if rest else []
    dims: dict[str, tuple[int, ...]] = {}
    for s, m in zip(rest, budget, strict=True):
        kind = kinds[s.name]
        if kind == "dense" or len(s.shape) < 2:
            dims[s.name] = (min(m, s.numel),)
        else:
            d0 = s.shape[0]
            dims[s.name] = _kron_dims(m, d0, s.numel // d0)
    # the columns the Kronecker pairs leave unused go to the dense parameters (largest first)
    left = per_block - sum(math.prod(d) for d in dims.values())
    for s in sorted((s for s in rest if len(dims[s.name]) == 1), key=lambda s: (-s.numel, s.offset)):
        more = min(left, s.numel - dims[s.name][0])
        dims[s.name] = (dims[s.name][0] + more,)
        left -= more
    block_width = sum(math.prod(dims[s.name]) for s in rest)
    out, col = [], 0
    for s in specs:
        if s.name in exact:
            out.append(ParamSketch(s.name, s.shape, s.offset, "exact", (s.numel,), ((col, col + s.numel),)))
            col += s.numel
    starts, col_b = {}, 0
    for s in rest:
        starts[s.name] = col_b
        col_b += math.prod(dims[s.name])
    for s in specs:
        if s.name in exact:
            continue
        kind = kinds[s.name]
        if len(dims[s.name]) == 1:
            kind = "dense"
        w = math.prod(dims[s.name])
        cols = tuple((used + j * block_width + starts[s.name], used + j * block_width + starts[s.name] + w)
                     for j in range(blocks))
        out.append(ParamSketch(s.name, s.shape, s.offset, kind, dims[s.name], cols))
    order = {s.name: i for i, s in enumerate(specs)}
    out.sort(key=lambda ps: order[ps.name])
    return SketchPlan(int(seed), int(M), int(blocks), tuple(out), used, block_width)


def _split(total: int, sizes: Sequence[int]) -> list[int]:
    """``total`` columns split in proportion to ``sizes``, each >= 1 (largest remainders first)."""
    n = len(sizes)
    free = total - n
    p = sum(sizes)
    raw = [free * s / p for s in sizes]
    base = [int(math.floor(r)) for r in raw]
    left = free - sum(base)
    for i in sorted(range(n), key=lambda i: (-(raw[i] - base[i]), i))[:left]:
        base[i] += 1
    return [1 + b for b in base]


def _kron_dims(m: int, d0: int, d1: int) -> tuple[int, int]:
    """``(m0, m1)`` with ``m0 m1 <= m``, ``m0 <= d0``, ``m1 <= d1``: among the pairs that use at
    least 90% of the most columns any pair can, the one nearest the aspect d0 : d1."""
    m = min(m, d0 * d1)
    pairs = [(m0, min(d1, m // m0)) for m0 in range(1, min(d0, m) + 1)]
    most = max(a * b for a, b in pairs)
    target = math.sqrt(m * d0 / d1)
    fit = [(a, b) for a, b in pairs if a * b >= 0.9 * most]
    return min(fit, key=lambda ab: (abs(math.log(ab[0] / target)), -ab[0] * ab[1]))
