"""A sketch plan applied to dense gradients (issue 37 §3: the paper's per-step rows, sketched),
and what every sketched collection checks and says about its plan.

A per-step row (the step's mean clipped gradient, Li et al. 2022 §4.2) is one dense vector
the step already holds, so its sketch ``Phi g`` costs O(p m) once per step, whatever the
per-example engine: per Kronecker parameter ``vec(P_0 G P_1^T) / sqrt(J)`` for every block at
once (two products with the stacked factors), per embedding ``S G P_1^T / sqrt(J)`` (a
CountSketch of the rows, then one product), exact parameters copied, dense ones ``P vec(G)``.
The map is linear, so the sketch of a mean (or of a sum over ranks) is the mean (sum) of the
sketches; :class:`DenseSketch` gives the same numbers as the float64 reference
``gradspec.sketch.sketch_rows`` (to its own float rounding).

:func:`dense_kinds` says how each parameter of a dense gradient is sketched (by its module:
an ``nn.Embedding`` weight by CountSketch x Gaussian, any other matrix or tensor of two or more
dimensions by Kronecker factors, a vector densely), the same kinds the ghost-clipping rules
give the layers they handle, so a per-step and a per-example sketch of one model with one seed
share their map. :func:`check_width` refuses an M the row cannot be compressed into, and
:func:`width_note` says why a plan stores fewer columns than were asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from gradspec._layout import ParamLayout
from gradspec.sketch._factors import SketchFactors, live_rows
from gradspec.sketch._plan import SketchPlan

#: The key of a store's ``gradspec.sketch`` attribute that says why its M is below ``requested_M``.
WIDTH_NOTE_KEY = "width_note"


def dense_kinds(layout: ParamLayout, model: nn.Module | None = None) -> dict[str, str]:
    """Per parameter of ``layout``, the sketch of its dense gradient (`make_plan`'s ``kinds``).

    Args:
        layout: the unsketched row's parameters.
        model: the module the names belong to (an embedding is then known by its type);
            None: by shape alone (a matrix is sketched by Kronecker factors).
    """
    kinds = {}
    for spec in layout.params:
        owner, _, attr = spec.name.rpartition(".")
        module = None
        if model is not None:
            try:
                module = model.get_submodule(owner)
            except AttributeError:
                module = None
        if isinstance(module, nn.Embedding) and attr == "weight":
            kinds[spec.name] = "countsketch-kronecker"
        elif len(spec.shape) >= 2:
            kinds[spec.name] = "kronecker"
        else:
            kinds[spec.name] = "dense"
    return kinds


def check_width(M: int, p: int, *, option: str = "--sketch") -> None:  # noqa: N803 - the paper's name
    """Refuse a sketch at least as wide as the row it would compress (one line, with the M that fits).

    Args:
        M: the columns asked for.
        p: the unsketched row's width.
        option: how the caller's user gives M (``--sketch``; ``sketch=`` for a recorder).

    Raises:
        ValueError: ``M >= p``.
    """
    if p <= M:
        sep = "" if option.endswith("=") else " "
        raise ValueError(
            f"{option}{sep}{M} is not below p = {p:,}, the width of the unsketched row (a sketch that wide "
            f"stores no less than the gradient itself): give {option}{sep}{p - 1} or less, or no sketch to "
            "store the rows whole"
        )


def width_note(plan: SketchPlan) -> str | None:
    """Why ``plan`` stores fewer columns than were asked for, in one line (None: it stores them all).

    The asked-for M less the exact columns is split into J equal blocks; a block stores what
    its parameters' sketches take: a Kronecker pair ``m0 x m1`` is at most the parameter's share,
    and no parameter takes more columns than it has values.
    """
    asked, stored, exact, j, width = plan.requested_M, plan.M, plan.exact_width, plan.n_blocks, plan.block_width
    if stored >= asked:
        return None
    share, spare = divmod(asked - exact, j)
    parts = [f"{exact:,} columns hold small parameters exactly (counted in M)"] if exact else []
    rest = "the other " if exact else ""
    parts.append(f"{rest}{asked - exact:,} make {j} equal blocks of {share:,}"
                 + (f" ({spare:,} left over)" if spare else ""))
    if share > width:
        causes = []
        if any(s.kind in ("kronecker", "countsketch-kronecker") for s in plan.params):
            causes.append("Kronecker factor pairs m0 x m1 round each parameter's share down")
        if any(s.kind == "dense" and s.dims[0] == s.numel for s in plan.params):
            causes.append("no parameter takes more columns than it has values")
        parts.append(f"{' and '.join(causes) or 'the plan rounds each share down'}, so each block uses {width:,}")
    return f"asked {asked:,}, stored {stored:,} because " + ", ".join(parts[:-1]) + (", and " if len(parts) > 1 else "") + parts[-1]


def row_energies(layout: ParamLayout, row: Tensor) -> dict[str, float]:
    """Each parameter's energy in one dense row (p values): the squared norm of its part, in float64.

    Of a per-step row, the step's mean clipped gradient, these are the weights `energy_weights`
    turns into a plan's column split: what ``collect --sketch`` measures on its warm-up batch
    (`gradspec.train._sketching.warmup_energies`) and ``GradientRecorder(sketch=)`` on the first
    row it records.

    Raises:
        ValueError: a row whose size is not the layout's p.
    """
    flat = row.detach().reshape(-1)
    if flat.numel() != layout.p:
        raise ValueError(f"a row of {flat.numel():,} values for a layout of p = {layout.p:,}")
    parts = [flat[s.offset : s.stop].double().square().sum() for s in layout.params]
    e = torch.stack(parts).cpu() if parts else torch.zeros(0, dtype=torch.float64)
    return {s.name: float(v) for s, v in zip(layout.params, e, strict=True)}


def plan_attribute(plan: SketchPlan) -> dict[str, Any]:
    """The store attribute ``gradspec.sketch`` of ``plan``: ``plan.to_dict()``, with the
    :func:`width_note` (key ``width_note``) when it stores fewer columns than were asked for."""
    note = width_note(plan)
    return {**plan.to_dict(), **({WIDTH_NOTE_KEY: note} if note else {})}


def plan_settings(attribute: Mapping[str, Any]) -> tuple[Any, Any, int]:
    """(asked-for M, seed, blocks): the settings a store's ``gradspec.sketch`` attribute was made
    with (``--sketch``, ``--sketch-seed``, ``--sketch-blocks``), whatever its rules and column split."""
    return attribute.get("requested_M"), attribute.get("seed"), len(attribute.get("blocks") or [])


def same_plan(attribute: Mapping[str, Any] | None, plan: SketchPlan | None) -> bool:
    """Whether a store's ``gradspec.sketch`` attribute describes ``plan`` (notes aside)."""
    if attribute is None or plan is None:
        return attribute is None and plan is None
    try:
        return SketchPlan.from_dict(attribute).to_dict() == plan.to_dict()
    except (ValueError, KeyError, TypeError):
        return False


class DenseSketch:
    """``Phi g`` of dense gradients ``g`` (p values each) under a plan: O(p m) per row.

    Args:
        plan: the plan (any kinds: exact, dense, kronecker, countsketch-kronecker).
        device: where the factors are held and the products run.
        dtype: the factors' and products' dtype (float64 by default, the reference's). The
            recording paths (``collect --sketch`` per-step rows, ``GradientRecorder(sketch=)``)
            use float32: on a 2-core AVX2 machine a whole-MiniLM row (p = 22.7M, M = 16,384)
            took 1,920 ms to sketch in float64 and 488 ms in float32, whose products err by
            ~1e-6 of a sketched value, against the sketch's own error of a few % (its factors
            are the float64 ones rounded once).

    Example:
        >>> from gradspec._layout import ParamLayout
        >>> from gradspec.sketch import make_plan, sketch_rows
        >>> layout = ParamLayout.from_shapes([("w", (30, 20)), ("b", (30,))])
        >>> plan = make_plan(layout, dense_kinds(layout), 200, blocks=2)
        >>> g = torch.randn(layout.p, dtype=torch.float64)
        >>> bool(torch.allclose(DenseSketch(plan)(g), sketch_rows(plan, g[None])[0]))
        True
    """

    def __init__(self, plan: SketchPlan, *, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float64) -> None:
        self.plan = plan
        self.dtype = dtype
        self.device = torch.device(device)
        self.factors = SketchFactors(plan, dtype=dtype, device=device)

    def __call__(self, rows: Tensor) -> Tensor:
        """(M,) of a row (p,), or (B, M) of rows (B, p), in the factors' dtype and device.

        Raises:
            ValueError: rows of another width than the plan's p.
        """
        plan = self.plan
        one = rows.dim() == 1
        x = rows.reshape(1, -1) if one else rows
        if x.dim() != 2 or x.shape[1] != plan.p:
            raise ValueError(f"a dense sketch takes rows of p = {plan.p} values, got shape {tuple(rows.shape)}")
        x = x.to(device=self.device, dtype=self.dtype)
        out = torch.zeros(x.shape[0], plan.M, dtype=self.dtype, device=self.device)
        for spec in plan.params:
            g = x[:, spec.offset : spec.offset + spec.numel]
            if spec.kind in ("exact", "dense"):
                self.factors.add_flat(spec.name, g, out)
            else:
                self._structured(spec, g.reshape(g.shape[0], *spec.matrix), out)
        return out[0] if one else out

    def _structured(self, spec: Any, g: Tensor, out: Tensor) -> None:
        """Every pair of every block of a Kronecker-kind parameter, G (B, d0, d1) -> (B, J R, m0, m1)
        (`StackedFactors` stacks the J blocks' R pairs: ``blocks`` = J R) in one product, after a
        version-3 or 4 plan's mixing."""
        st = self.factors.stacked[spec.name]
        if st.mix is not None:  # version 3 or 4: G mixed and masked once for every block
            g = st.mix(g)
        st.add(_pairs(st, g), out)


def _pairs(st: Any, g: Tensor) -> Tensor:
    """(B, J R, m0, m1): every stacked pair of `StackedFactors` ``st`` applied to G (B, d0, d1)."""
    b, d0, d1 = g.shape
    j, m0, m1 = st.blocks, st.m0, st.m1
    if st.left is not None:  # kronecker: the cheaper order of the two products
        if m0 * d0 * d1 + m0 * d1 * m1 <= m1 * d0 * d1 + m0 * d0 * m1:
            return (st.left @ g).reshape(b, j, m0, d1) @ st.right.reshape(j, m1, d1).transpose(1, 2)
        return st.left.reshape(j, m0, d0) @ (g @ st.right.T).reshape(b, d0, j, m1).permute(0, 2, 1, 3)
    # countsketch-kronecker: only the rows of G that hold a nonzero are hashed (an embedding's
    # gradient has rows only for the tokens seen: whole MiniLM's per-step rows spent 1.1 s a
    # step hashing the 30,522 rows of its word embeddings, nearly all zero, 304 times)
    bucket, sign, live = st.bucket, st.sign, live_rows(g.ne(0).any(2).any(0))
    if live is not None:
        g, bucket, sign = g.index_select(1, live), bucket.index_select(1, live), sign.index_select(1, live)
    n = g.shape[1]
    if hash_last(m0, m1, d0):  # a narrow P_1: G P_1^T of every pair in one product (G read
        # once), then its rows hashed into m0 buckets with their signs
        gr = (g @ st.right.T).reshape(b, n, j, m1)
        return torch.stack([torch.zeros(b, m0, m1, dtype=g.dtype, device=g.device).index_add_(
            1, bucket[k], gr[:, :, k] * sign[k][:, None]) for k in range(j)], 1)
    parts = []  # G's rows hashed into m0 buckets with their signs, pair by pair
    right = st.right.reshape(j, m1, d1)
    for k in range(j):
        s = torch.zeros(b, m0, d1, dtype=g.dtype, device=g.device)
        s.index_add_(1, bucket[k], g * sign[k][:, None])
        parts.append(s @ right[k].T)
    return torch.stack(parts, 1)


def hash_last(m0: int, m1: int, d0: int) -> bool:
    """Whether a CountSketch x Gaussian parameter (d0 x d1, per block m0 x m1) is cheaper sketched
    as ``S (G P_1^T)``, one product of G with every block's P_1 (``d0 d1 J m1`` multiply-adds in a
    matrix product), than as ``(S G) P_1^T`` (J hashing passes over G, each about as dear as a
    few multiply-adds per value, then ``m0 d1 m1``): when ``m1 <= 4 + m0 m1 / d0``."""
    return m1 <= 4 + m0 * m1 / d0

