"""The sketch plan: which parameter is stored how, in which columns (issues 22, 37).

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
  Version 2: a Kronecker kind holds R = ``pairs`` independent pairs side by side, pair q's
  ``vec(P_0q G P_1q^T) / sqrt(J R)`` in the q-th run of ``m0 m1`` columns (an average of R
  independent estimates: the variance of a pair, ~ (2/m0 + 2/m1) ||G||^4 for a low-rank G,
  falls R-fold).

Every factor has ``E[P^T P] = I``, so for the stored matrix Y (rows y_i) with exact part
``Y_x`` and blocks ``Y_j``: ``Y Y^T = Y_x Y_x^T + sum_j Y_j Y_j^T``, and for every j,
``Y_x Y_x^T + J Y_j Y_j^T`` is an unbiased estimate of ``H H^T`` (H the unsketched rows).

How M is split (deterministic from the layout, the kinds, the weights, M, J).

Version 2 (issue 37). The error a parameter adds to the sketched Gram is ~
e_p^2 / m_p (e_p its share of ||H||_F^2, m_p its columns), so columns go in proportion to a
weight w_p that stands for e_p: a measured gradient energy when one is given (``weights``:
e.g. the mean squared per-parameter norm of a warm-up batch), else ``sqrt(numel)`` (small
parameters carry far more energy per value than big ones: a 4-class head holds ~1/3 of
||H||_F^2 in the models measured, docs/sketch_calibration.md). With m_p proportional to e_p
the total error equals a dense Gaussian sketch's of the same width. ``collect --sketch``
measures them (``--sketch-weights energy``, the default): `energy_weights` of the clipped
gradients of a warm-up batch (`gradspec.train._sketching.warmup_energies`), hedged half by the
``sqrt(numel)`` prior; ``GradientRecorder(sketch=M)`` those of the first row it records
(`row_energies`); the plan records which (``weighting``). Then:

* **exact**: a parameter whose share of the columns left (by weight) is at least its size,
  or whose size is at most ``M / (4 K)`` (K parameters), is stored whole (it costs no more
  columns than sketching it and adds no error) — repeated until none is added, smallest
  first while the exact columns stay within M/2;
* the rest ``M - E`` is split into J equal blocks of ``(M - E) // J`` columns, and a block's
  columns across the sketched parameters in proportion to their weights (each at least 1,
  largest remainders first);
* **dense** (a Gaussian P of the materialised per-example gradient: the accuracy of a dense
  sketch) where the J factors hold at most ``DENSE_BUDGET`` entries (``J m numel``: the
  multiply-adds per example), else the layer's structured kind with
  ``pairs = ceil(m / PAIR_AREA)`` pairs of ``m0 x m1 <= m / pairs`` near the aspect d0 : d1
  (measured: many small pairs are several times more accurate than one large one, at a cost
  per example ~ T (d0 + d1) sqrt(m PAIR_AREA) rather than T (d0 + d1) sqrt(m)).

Version 3: version 2's plan, with every Kronecker-kind parameter's gradient first
multiplied, value by value, by a seeded random sign mask D (one per parameter, shared by its
blocks): every block's pairs sketch ``D o G``. A per-example gradient of a linear layer has low
rank (an MLP's is rank one, a transformer layer's at most its token count), and a Kronecker
pair of a low-rank G has relative variance ~ 2/m0 + 2/m1 instead of a dense sketch's
2/(m0 m1): version 2's many small pairs only average that down. The signs break G's low rank,
which brings the pairs to 0.31-1.56x a dense Gaussian sketch's error of the same width on the
calibration models (docs/sketch_calibration.md), at the cost of one more pass over G. They
keep every row's and column's norm, so a G whose energy sits in a few columns (MiniLM's q/v,
BERT's outlier features) gains little: version 4 mends that. Given D the blocks are still
independent unbiased estimates (``E[P^T P] = I`` for any fixed input), which is what the block
bootstrap needs. The mask needs G formed, so ghost clipping, which sketches per-example rows from a layer's
inputs and output gradients without forming G, keeps version 2 (``FACTORED_VERSION``).

Version 4 (the default; for rows given whole: per-step rows, ``GradientRecorder(sketch=)``,
``--per-example --backend vmap|hooks``, `sketch_rows`): version 3, with G's columns first mixed
by a seeded block-diagonal orthogonal matrix Q (Haar blocks of ``min(d1, ROTATION_BLOCK)``
columns, the last block the remainder; one Q per parameter, shared by its blocks): every block's
pairs sketch ``D o (G Q^T)``. A per-example or per-step gradient of a transformer's linear layer
holds most of its energy in a few input columns (MiniLM q/v: layer 1's value weight has ~2
effective columns of 384), and no sign mask spreads it; Q spreads each column over its block
(all 384), and the mask then breaks the low rank. On MiniLM q/v (256 real per-example rows, 3
seeds) this took σ₁..₁₀'s RMS error from 3.3x / 4.0x a dense Gaussian sketch's (version 3) to
1.2x / 1.8x at M = 2¹⁴ / 2¹⁶ (blocks of 128: 1.6x at 2¹⁴); on all 4,037 rows the top-100 σ
are within 1.77% / 0.90% (version 3: 3.28% / 3.03%). On the calibration models' plans it is at
0.36-1.26x a dense sketch where pairs are used (version 3: 0.31-1.45x); a pair with few rows
(a few-class head forced into pairs) does worse mixed (docs/sketch_calibration.md). Q is orthogonal and D² = I, so
the map is still ``Phi T`` with T orthogonal and given T the blocks are independent unbiased
estimates. The mixing costs ``2 numel b`` multiply-adds a row (one matrix product; rows of G
that are all zero, an embedding's unseen tokens, are skipped).

Version 1 (stores written before issue 37; ``make_plan(version=1)``): exact when the size is
at most ``M / (4 K)``, columns in proportion to the size, one Kronecker pair per block.

A Kronecker parameter with m columns takes ``pairs x m0 x m1 <= m`` (using at least 90% of
what any pair could); the columns the pairs leave unused go to the dense parameters (largest
first, up to their size) and are otherwise dropped, so the stored width (``M`` in the plan)
may be a little below the M asked for (``requested_M``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gradspec._layout import ParamLayout

#: The plan family written into a store (``"kind"``), and its format version (1: issue 22's
#: plan, still read; 2: energy-weighted columns, dense small factors, several pairs; 3: version
#: 2's plan with sign-masked Kronecker kinds; 4: version 3 with G's columns mixed first).
FAMILY = "kronecker-gaussian"
VERSION = 4
VERSIONS = (1, 2, 3, 4)
#: Version 4: the columns of one orthogonal block mixing a Kronecker kind's G (``rotation_block``
#: in the store; a plan with another is refused rather than regenerated differently).
ROTATION_BLOCK = 512
#: The newest rules a sketch computed from a layer's factors (ghost clipping's per-example rows,
#: which never form G) can follow: version 3's sign mask (and version 4's mixing) need G formed.
FACTORED_VERSION = 2
#: Version 2: a parameter is sketched dense when its J factors hold at most this many entries.
DENSE_BUDGET = 2**24
#: Version 2: the columns of one Kronecker pair (a parameter with m columns per block takes
#: ceil(m / PAIR_AREA) pairs).
PAIR_AREA = 16
#: How each parameter is stored.
KINDS = ("exact", "kronecker", "countsketch-kronecker", "dense")
#: The kinds a layer rule may ask for (``exact`` is decided by the plan, by size).
SKETCH_KINDS = KINDS[1:]
DEFAULT_BLOCKS = 8
#: Version 2: how the columns are split (``SketchPlan.weighting``).
WEIGHTINGS = ("sqrt-size", "energy")
#: `energy_weights`: the share of the ``sqrt(numel)`` prior in the measured weights.
ENERGY_PRIOR = 0.5


@dataclass(frozen=True)
class ParamSketch:
    """One parameter's part of the plan.

    ``dims`` is the per-block sketch shape: ``(m0, m1)`` for the Kronecker kinds, ``(m,)``
    for ``dense``, ``(numel,)`` for ``exact``; ``matrix`` is the parameter viewed as
    ``(d0, d1)`` (``d1 = prod(shape[1:])``; ``(numel, 1)`` for a vector). ``columns`` lists
    its half-open column ranges: one for an exact parameter, else one per block. ``pairs``:
    how many independent Kronecker pairs of ``dims`` a block holds side by side (1 but for
    the Kronecker kinds of a version-2 plan). In a version-3 plan a Kronecker kind's gradient
    is sign-masked first (`SketchPlan.signed`).
    """

    name: str
    shape: tuple[int, ...]
    offset: int  # first column of the parameter in the unsketched row
    kind: str
    dims: tuple[int, ...]
    columns: tuple[tuple[int, int], ...]
    pairs: int = 1

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
        return self.pairs * math.prod(self.dims)

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "shape": list(self.shape), "offset": self.offset, "kind": self.kind,
               "dims": list(self.dims), "columns": [list(c) for c in self.columns]}
        return {**out, "pairs": self.pairs} if self.pairs != 1 else out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParamSketch:
        kind = str(d["kind"])
        if kind not in KINDS:
            raise ValueError(f"unknown sketch kind {kind!r} of parameter {d.get('name')!r}; one of {', '.join(KINDS)}")
        pairs = int(d.get("pairs", 1))
        if pairs < 1 or (pairs > 1 and kind not in ("kronecker", "countsketch-kronecker")):
            raise ValueError(f"parameter {d.get('name')!r} of kind {kind!r} has {pairs} pairs")
        return cls(str(d["name"]), tuple(int(s) for s in d["shape"]), int(d["offset"]), kind,
                   tuple(int(s) for s in d["dims"]), tuple((int(a), int(b)) for a, b in d["columns"]), pairs)


@dataclass(frozen=True)
class SketchPlan:
    """A whole row's sketch: M columns, J blocks, one :class:`ParamSketch` per parameter."""

    seed: int
    requested_M: int
    n_blocks: int
    params: tuple[ParamSketch, ...]
    exact_width: int
    block_width: int
    version: int = VERSION
    #: How the columns were split (version 2): ``sqrt-size`` (by ``sqrt(numel)``, no data seen)
    #: or ``energy`` (by measured gradient energies, `energy_weights`).
    weighting: str = "sqrt-size"

    @property
    def signed(self) -> bool:
        """Whether each Kronecker-kind parameter's gradient is multiplied by a seeded sign mask (one
        per parameter, every block's) before its pairs (version 3; factor ``signs``)."""
        return self.version >= 3

    @property
    def rotated(self) -> bool:
        """Whether each Kronecker-kind parameter's G has its columns mixed by a seeded block-diagonal
        orthogonal matrix before the sign mask (version 4; factor ``rotation``)."""
        return self.version >= 4

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
            "kind": FAMILY, "version": self.version, "seed": self.seed, "M": self.M, "requested_M": self.requested_M,
            "p": self.p,
            "blocks": [[list(self.block_range(j))] for j in range(self.n_blocks)],
            "exact": [[0, self.exact_width]] if self.exact_width else [],
            "scale": 1.0 / math.sqrt(self.n_blocks),  # a pair of R also carries 1/sqrt(R)
            "seeds": "blake2b-8 of '<seed>:<block>:<parameter name>:<factor>' (gradspec.sketch.factor_seed)",
            **({"signs": "each Kronecker-kind parameter's G is multiplied by its sign mask (factor 'signs', "
                         "seeded with block 0, shared by every block) before its pairs"} if self.signed else {}),
            **({"rotation": "before its sign mask, each Kronecker-kind parameter's G (d0 x d1) is multiplied on the "
                            "right by Q^T, Q block-diagonal orthogonal: blocks of rotation_block columns (the last "
                            "one the remainder), factors 'rotation' and 'rotation-tail' seeded with block 0",
                "rotation_block": ROTATION_BLOCK} if self.rotated else {}),
            "params": [s.to_dict() for s in self.params],
            **({"weighting": self.weighting} if self.version >= 2 else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SketchPlan:
        """Read ``to_dict`` back (a store's ``gradspec.sketch``), checking its family and columns."""
        if d.get("kind") != FAMILY or d.get("version") not in VERSIONS:
            raise ValueError(f"sketch plan of kind {d.get('kind')!r} version {d.get('version')!r}: this gradspec "
                             f"reads {FAMILY!r} versions {', '.join(map(str, VERSIONS))}; upgrade gradspec")
        params = tuple(ParamSketch.from_dict(p) for p in d["params"])
        blocks = [[tuple(r) for r in b] for b in d["blocks"]]
        exact = sum(b - a for a, b in d["exact"])
        width = blocks[0][0][1] - blocks[0][0][0] if blocks else 0
        if int(d["version"]) >= 4 and d.get("rotation_block") != ROTATION_BLOCK:
            raise ValueError(f"sketch plan with rotation blocks of {d.get('rotation_block')!r} columns: this "
                             f"gradspec mixes in blocks of {ROTATION_BLOCK}; upgrade gradspec")
        weighting = str(d.get("weighting", "sqrt-size"))
        if weighting not in WEIGHTINGS:
            raise ValueError(f"sketch plan weighting {weighting!r}: this gradspec reads {', '.join(WEIGHTINGS)}")
        plan = cls(int(d["seed"]), int(d.get("requested_M", d["M"])), len(blocks), params, exact, width,
                   int(d["version"]), weighting)
        if int(d["M"]) != plan.M or any([plan.block_range(j)] != b for j, b in enumerate(blocks)):
            raise ValueError(f"sketch plan of M = {d['M']} whose block column ranges do not tile its columns")
        return plan


def make_plan(layout: ParamLayout, kinds: Mapping[str, str], M: int, *, seed: int = 0,  # noqa: N803
              blocks: int = DEFAULT_BLOCKS, weights: Mapping[str, float] | None = None,
              version: int = VERSION, dense_budget: int = DENSE_BUDGET) -> SketchPlan:
    """The plan of rows of ``layout`` sketched into (at most) M columns.

    Args:
        layout: the unsketched row's parameters.
        kinds: per parameter, the sketch its layer supports (``kronecker``,
            ``countsketch-kronecker`` or ``dense``); a small parameter is stored exactly
            whatever its kind.
        M: columns asked for.
        seed: the plan seed (every factor's seed derives from it, `factor_seed`).
        blocks: J >= 2 independent blocks.
        weights: version 2: per parameter, its expected share of the gradient energy
            (any positive scale; e.g. mean squared per-parameter norms of a warm-up batch);
            None: ``sqrt(numel)``. Columns are split in proportion to them.
        version: the plan rules: 4 (column-mixed, sign-masked Kronecker kinds, for rows given
            whole), 3 (sign-masked only), 2
            (``FACTORED_VERSION``: what ghost clipping computes per example), 1 (issue 22's, for
            resuming a store written with them).
        dense_budget: version 2: the most entries of a parameter's J dense factors (0: every
            parameter with a structured kind keeps it, as tests of the structured kinds want).

    Raises:
        ValueError: J < 2, or M too small to give every sketched parameter a column per block.
    """
    if version not in VERSIONS:
        raise ValueError(f"sketch plan version {version}: one of {', '.join(map(str, VERSIONS))}")
    if blocks < 2:
        raise ValueError(f"a sketch needs at least 2 independent blocks, got {blocks}")
    if M < 1:
        raise ValueError(f"the sketch size M must be >= 1, got {M}")
    for s in layout.params:
        if kinds.get(s.name) not in SKETCH_KINDS:
            raise ValueError(f"parameter {s.name!r} has sketch kind {kinds.get(s.name)!r}; one of "
                             f"{', '.join(SKETCH_KINDS)}")
    specs = list(layout.params)
    w = _weights(specs, weights, version)
    exact, used = _exact(specs, w, M, version)
    rest = [s for s in specs if s.name not in exact]
    per_block = (M - used) // blocks
    if rest and per_block < len(rest):
        need = used + blocks * len(rest)
        most = (M - used) // len(rest)  # blocks that M gives every sketched parameter a column in
        fixes = ([f"--sketch >= {need}"] if need < layout.p else []) + ([f"--sketch-blocks {most} or fewer"]
                                                                         if most >= 2 else [])
        raise ValueError(
            f"--sketch {M} with {blocks} blocks leaves {per_block} columns per block for {len(rest)} sketched "
            f"parameters (each needs at least one): give " + (" or ".join(fixes) if fixes else
                                                              "no sketch (the rows are narrow enough to store whole)")
        )
    budget = _split(per_block, [w[s.name] for s in rest]) if rest else []
    dims: dict[str, tuple[int, ...]] = {}
    pairs: dict[str, int] = {}
    for s, m in zip(rest, budget, strict=True):
        kind = kinds[s.name]
        pairs[s.name] = 1
        if kind == "dense" or len(s.shape) < 2 or (version >= 2 and blocks * m * s.numel <= dense_budget):
            dims[s.name] = (min(m, s.numel),)
        else:
            d0 = s.shape[0]
            if version >= 2:
                pairs[s.name] = -(-m // PAIR_AREA)
            dims[s.name] = _kron_dims(m // pairs[s.name], d0, s.numel // d0)
    # the columns the Kronecker pairs leave unused go to the dense parameters (largest first)
    left = per_block - sum(pairs[n] * math.prod(d) for n, d in dims.items())
    for s in sorted((s for s in rest if len(dims[s.name]) == 1), key=lambda s: (-s.numel, s.offset)):
        more = min(left, s.numel - dims[s.name][0])
        dims[s.name] = (dims[s.name][0] + more,)
        left -= more
    block_width = sum(pairs[s.name] * math.prod(dims[s.name]) for s in rest)
    out, col = [], 0
    for s in specs:
        if s.name in exact:
            out.append(ParamSketch(s.name, s.shape, s.offset, "exact", (s.numel,), ((col, col + s.numel),)))
            col += s.numel
    starts, col_b = {}, 0
    for s in rest:
        starts[s.name] = col_b
        col_b += pairs[s.name] * math.prod(dims[s.name])
    for s in specs:
        if s.name in exact:
            continue
        kind = kinds[s.name]
        if len(dims[s.name]) == 1:
            kind = "dense"
        width = pairs[s.name] * math.prod(dims[s.name])
        cols = tuple((used + j * block_width + starts[s.name], used + j * block_width + starts[s.name] + width)
                     for j in range(blocks))
        out.append(ParamSketch(s.name, s.shape, s.offset, kind, dims[s.name], cols, pairs[s.name]))
    order = {s.name: i for i, s in enumerate(specs)}
    out.sort(key=lambda ps: order[ps.name])
    return SketchPlan(int(seed), int(M), int(blocks), tuple(out), used, block_width, int(version),
                      "sqrt-size" if weights is None or version == 1 else "energy")


def energy_weights(layout: ParamLayout, energies: Mapping[str, float], *, prior: float = ENERGY_PRIOR) -> dict[str, float]:
    """`make_plan` weights from measured gradient energies, hedged by the ``sqrt(numel)`` prior.

    ``w_p = (1 - prior) e_p / sum(e) + prior sqrt(n_p) / sum(sqrt(n))``: a warm-up batch's
    energies steer the columns towards the parameters that carry ``||H||_F^2`` (a few-class
    head, biases), while every parameter keeps at least ``prior`` of its unmeasured share, so
    a parameter that was quiet in the warm-up but not later is not starved.

    Args:
        layout: the unsketched row's parameters.
        energies: per parameter, a measured energy >= 0 (any common scale), e.g. the mean
            squared clipped per-parameter norm of a warm-up batch.
        prior: the weight of the ``sqrt(numel)`` prior, in [0, 1].

    Raises:
        ValueError: a parameter without a finite energy >= 0, all energies 0, or prior outside [0, 1].
    """
    if not 0.0 <= prior <= 1.0:
        raise ValueError(f"the energy weights' prior must be in [0, 1], got {prior}")
    e = {}
    for s in layout.params:
        v = energies.get(s.name)
        if v is None or not math.isfinite(float(v)) or float(v) < 0:
            raise ValueError(f"gradient energy of parameter {s.name!r} is {v!r}: give a finite energy >= 0 "
                             "for every parameter")
        e[s.name] = float(v)
    total = sum(e.values())
    if total <= 0:
        raise ValueError("every measured gradient energy is 0: the warm-up batch's gradients vanish")
    roots = {s.name: math.sqrt(s.numel) for s in layout.params}
    norm = sum(roots.values())
    return {n: (1.0 - prior) * e[n] / total + prior * roots[n] / norm for n in e}


def _weights(specs: Sequence[Any], weights: Mapping[str, float] | None, version: int) -> dict[str, float]:
    """Each parameter's column weight: its size (version 1), the given energy, or sqrt(size)."""
    if version == 1:
        if weights is not None:
            raise ValueError("a version-1 sketch plan splits columns by size: it takes no weights")
        return {s.name: float(s.numel) for s in specs}
    if weights is None:
        return {s.name: math.sqrt(s.numel) for s in specs}
    out = {}
    for s in specs:
        v = weights.get(s.name)
        if v is None or not math.isfinite(float(v)) or float(v) < 0:
            raise ValueError(f"sketch weight of parameter {s.name!r} is {v!r}: give a finite energy >= 0 "
                             "for every parameter")
        out[s.name] = float(v)
    top = max(out.values(), default=0.0)
    if top <= 0:
        raise ValueError("every sketch weight is 0: give the parameters' gradient energies")
    # a parameter measured at zero energy still gets a column per block (its share may be misread)
    return {n: max(v, top * 1e-6) for n, v in out.items()}


def _exact(specs: Sequence[Any], w: Mapping[str, float], M: int, version: int) -> tuple[set[str], int]:  # noqa: N803
    """(the parameters stored exactly, their columns): size at most M / (4 K), and (version 2)
    a share of the columns left, by weight, at least the size; smallest first, within M/2."""
    limit = M / (4 * len(specs))
    exact: set[str] = set()
    used = 0
    while True:
        rest = [s for s in specs if s.name not in exact]
        total = sum(w[s.name] for s in rest)
        added = False
        for s in sorted(rest, key=lambda s: (s.numel, s.offset)):
            share = version >= 2 and s.numel * total <= (M - used) * w[s.name]
            if (s.numel <= limit or share) and used + s.numel <= M // 2:
                exact.add(s.name)
                used += s.numel
                added = True
        if not added or version == 1:
            return exact, used


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
