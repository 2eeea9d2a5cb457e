"""What every ghost-clipping layer rule shares: the output tap, one selected layer's captured
state, the rule interface, and the per-example norm and weighted sum of a linear map.

A rule (``Rule``) knows one layer type: which of its parameters it handles, how one forward
is captured (by default: the layer's input and, through ``_Tap``, its output gradient), the
per-example squared norms of its selected parameters' gradients, and their weighted sum
``sum_i c_i G_i``. `gradspec.train._ghost.GhostClipping` runs the capture and adds the
rules' results up; see its module docstring for the math and what is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn


class _Tap(torch.autograd.Function):
    """Identity on a layer's output whose backward keeps the output gradient in ``slot``."""

    @staticmethod
    def forward(ctx, out: Tensor, anchor: Tensor, slot: Any) -> Tensor:  # noqa: ARG004
        ctx.slot = slot
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.slot.grad_out = grad.detach()
        return grad, None, None


@dataclass(eq=False)
class Capture:
    """One forward of the engine: the batch size and the anchor every tap hangs on."""

    b: int
    anchor: Tensor

    def tap(self, out: Tensor, slot: Any) -> Tensor:
        """``out``, unchanged; its gradient lands in ``slot.grad_out`` during the backward."""
        return _Tap.apply(out, self.anchor, slot)


@dataclass(eq=False)
class Layer:
    """One selected layer: its rule, its selected parameters and what one pass captured.

    ``params`` maps the rule's attribute (``"weight"``, ``"in_proj_weight"``,
    ``"out_proj.bias"``) to (full parameter name, offset, stop) in the layout.
    """

    name: str
    module: nn.Module
    rule: Rule
    params: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    calls: int = 0
    inp: Tensor | None = None
    grad_out: Tensor | None = None
    cache: dict[str, Any] = field(default_factory=dict)  # per pass: what norms and sum both read

    @property
    def kind(self) -> str:
        return type(self.module).__name__

    def reset(self) -> None:
        self.rule.release(self)
        self.calls, self.inp, self.grad_out = 0, None, None
        self.cache.clear()

    def add(self, out: Tensor, attr: str, value: Tensor, start: int = 0) -> None:
        """``out[offset + start : offset + start + value.numel()] += value`` for parameter ``attr``."""
        _, lo, hi = self.params[attr]
        n = value.numel()
        if lo + start + n > hi:
            raise RuntimeError(f"{self.name}.{attr}: {n} values at {start} overrun the parameter")
        out[lo + start : lo + start + n] += value.reshape(-1).to(out.dtype)


def unsupported(layer_name: str, kind: str, why: str) -> ValueError:
    """The one-line refusal of a layer (or a use of it) the ghost backend would get wrong."""
    return ValueError(f"layer {layer_name!r} ({kind}) {why}; use backend='vmap'")


class Rule:
    """Per-example norms and the weighted sum of one layer type's parameters.

    Subclasses set ``attrs`` (the parameter attributes they handle) and implement
    ``norms2`` and ``add_sum``; the default capture takes the layer's first positional
    input (batch first) and its output gradient.
    """

    attrs: tuple[str, ...] = ("weight", "bias")

    def min_ndim(self, module: nn.Module) -> int:
        """The fewest dimensions of an input with a batch dimension in front: (B, features)."""
        return 2

    def validate(self, module: nn.Module, layer_name: str, attr: str) -> None:
        """Refuse a parameter or a layer option the rule does not model (one-line ValueError)."""
        if attr not in self.attrs:
            raise unsupported(layer_name, type(module).__name__,
                              f"has parameter {attr!r}, which the ghost backend has no rule for "
                              f"(it handles {', '.join(self.attrs)})")

    # ------------------------------------------------------------------ capture
    def install(self, layer: Layer, cap: Capture) -> list[Any]:
        """Register this pass's hooks on the layer; returns their handles."""

        def post(module: nn.Module, args: tuple, out: Any) -> Tensor:
            return self.capture(layer, cap, args[0] if args else None, out)

        return [layer.module.register_forward_hook(post)]

    def capture(self, layer: Layer, cap: Capture, inp: Any, out: Any) -> Tensor:
        """Keep the input, check it is one per example, and tap the output."""
        count_call(layer)
        ok = isinstance(inp, Tensor) and inp.ndim >= self.min_ndim(layer.module) and inp.shape[0] == cap.b
        if not ok or not isinstance(out, Tensor) or out.shape[0] != cap.b:
            got = tuple(inp.shape) if isinstance(inp, Tensor) else type(inp).__name__
            raise unsupported(layer.name, layer.kind,
                              f"got an input of shape {got}, not one per example of the batch of {cap.b}: "
                              "its gradient is not per-example")
        layer.inp = inp.detach()
        return cap.tap(out, layer)

    def release(self, layer: Layer) -> None:
        """Undo what a pass that ended early left in place, before its capture is dropped."""

    def check_ran(self, layer: Layer) -> None:
        """After the forward: the layer ran (and captured what its rule needs)."""
        if layer.calls == 0:
            raise ValueError(f"selected layer {layer.name!r} ({layer.kind}) did not run in the forward; "
                             "select only parameters the model uses")

    # ------------------------------------------------------------------ the math
    def norms2(self, layer: Layer, b: int) -> dict[str, Tensor]:
        """(B,) squared norms (float64) of each example's gradient, per selected attribute."""
        raise NotImplementedError

    def add_sum(self, layer: Layer, c: Tensor, out: Tensor) -> None:
        """Add ``sum_i c_i G_i`` of each selected attribute to ``out`` (layout order)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ sketches (gradspec.sketch)
    def sketch_kind(self, module: nn.Module, attr: str) -> str:
        """How ``attr``'s per-example gradient is sketched: ``"kronecker"`` or
        ``"countsketch-kronecker"`` (never formed), or ``"dense"`` (formed by `per_example`)."""
        return "dense"

    def per_example(self, layer: Layer, b: int, attr: str) -> Tensor:
        """(B, numel) each example's gradient of ``attr``, materialised (small parameters)."""
        raise unsupported(layer.name, layer.kind, f"has no per-example gradient of {attr} for --sketch")

    def sketch_structured(self, layer: Layer, attr: str, c: Tensor, factors: Any, out: Tensor) -> None:
        """Add the sketch of each example's clipped gradient of ``attr`` to ``out`` (B, M), every
        block at once (``factors``: `gradspec.sketch.StackedFactors`), without forming it."""
        raise unsupported(layer.name, layer.kind, f"has no structured sketch of {attr} for --sketch")

    def add_sketch(self, layer: Layer, c: Tensor, sk: Any, out: Tensor) -> None:
        """Add ``c_i`` times the sketch of example i's gradient of every selected attribute to
        row i of ``out`` (B, M); ``sk`` is the run's `gradspec.sketch.SketchFactors`."""
        for attr, (name, _, _) in layer.params.items():
            if sk.specs[name].kind in ("exact", "dense"):
                g = self.per_example(layer, c.shape[0], attr)
                sk.add_flat(name, g * c.to(g.dtype)[:, None], out)
            else:
                self.sketch_structured(layer, attr, c, sk.stacked[name], out)


def count_call(layer: Layer) -> None:
    """Count a call of ``layer``; a second call in one forward is weight sharing, refused."""
    layer.calls += 1
    if layer.calls > 1:
        raise unsupported(layer.name, layer.kind,
                          "ran twice in one forward (weight sharing): the ghost backend needs one "
                          "call per selected layer")


# ---------------------------------------------------------------------- linear maps
def linear_weight_norm2(a: Tensor, g: Tensor) -> Tensor:
    """``||g_i^T a_i||_F^2`` (float64) per example for inputs a (B, T, d_in), output gradients g (B, T, d_out).

    The ghost norm ``sum_{t,s} (a_t . a_s)(g_t . g_s)`` costs ~ T^2 (d_in + d_out) per
    example, the materialised ``g^T a`` ~ T d_in d_out; the cheaper is taken (Bu et al.
    2022, mixed ghost clipping). The ghost Gram matrices then hold at most
    T min(d_in, d_out) values per example, no more than the input.
    """
    t, d_in, d_out = a.shape[1], a.shape[2], g.shape[2]
    f64 = torch.float64  # products in the layer's dtype, sums in float64
    if t == 1:
        return a.square().sum((1, 2), dtype=f64) * g.square().sum((1, 2), dtype=f64)
    if t * (d_in + d_out) <= d_in * d_out:
        return ((a @ a.transpose(1, 2)) * (g @ g.transpose(1, 2))).sum((1, 2), dtype=f64)
    return (g.transpose(1, 2) @ a).square().sum((1, 2), dtype=f64)


def linear_weight_sum(a: Tensor, cg: Tensor) -> Tensor:
    """``sum_i (c_i g_i)^T a_i`` over all examples and positions: (d_out, d_in)."""
    return cg.reshape(-1, cg.shape[-1]).T @ a.reshape(-1, a.shape[-1])


def bias_norm2(g: Tensor) -> Tensor:
    """``||sum_t g_t||^2`` (float64) per example: the bias gradient's, from g (B, T, d_out)."""
    return g.sum(1).square().sum(1, dtype=torch.float64)


def kron_add(x0: Tensor, x1: Tensor, f: Any, out: Tensor, rows: tuple[int, int] | None = None) -> None:
    """Add ``vec((x0 P0_j^T)^T (x1 P1_j^T))`` to block j's columns of ``out``, for every block j:
    the Kronecker sketch ``vec(P0 G P1^T)`` of each example's ``G = x0^T x1`` (x0 (B, T, d0), x1
    (B, T, d1)), never forming G. Two products with the stacked factors (``f``,
    `gradspec.sketch.StackedFactors`) and one batched product for all blocks. ``rows``: x0 fills
    only rows ``[r0, r1)`` of G (a row block of a packed weight, a group of a convolution)."""
    left = f.left if rows is None else f.left[:, rows[0] : rows[1]]
    b, t, j = x0.shape[0], x0.shape[1], f.blocks
    u = (x0 @ left.T.to(x0.dtype)).view(b, t, j, f.m0).permute(0, 2, 3, 1)  # (B, J, m0, T)
    v = (x1 @ f.right.T.to(x1.dtype)).view(b, t, j, f.m1).transpose(1, 2)  # (B, J, T, m1)
    f.add(u @ v, out)
