"""Ghost-clipping rule of ``nn.MultiheadAttention``'s projections.

The module's forward (``F.multi_head_attention_forward``) applies its parameters itself: the
input projection ``in_proj_weight``/``in_proj_bias`` (or ``q/k/v_proj_weight`` when key or
value has another width), in one ``F.linear`` call for self-attention or in row blocks of
the packed weight otherwise, and the output projection with ``out_proj.weight`` and
``out_proj.bias``, whose ``Linear`` module (``NonDynamicallyQuantizableLinear``) is never
called. So hooks on the module's children see nothing; instead, while the module runs,
``torch.nn.functional.linear`` is wrapped: a call whose weight is (a row block of) one of
this module's projection weights keeps its input and taps its output, and every other call
passes through untouched. Each projection is then a linear layer on the example's positions
(`linear_weight_norm2`, `linear_weight_sum`), a row block's per-example gradient filling its
rows of the packed weight.

The wrapper is installed by the module's forward pre-hook and removed by its forward hook
(and by the engine whenever a pass ends), for one module call at a time; the engine is not
meant to run the same model from several threads at once.

PyTorch's fused fast path (``torch.backends.mha``), which calls no ``F.linear``, is turned off
while the engine's forward runs. Checked on every call, refused by name otherwise: the
selected rows are each projected exactly once; the input projections'
inputs are ``(L, B, d)`` with the batch in dimension 1 (``F.multi_head_attention_forward``'s
contract); and the output projection's rows are laid out ``(L, B)``, which is checked by
storage against the module's own output. ``bias_k``/``bias_v`` (``add_bias_kv=True``) are
refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from gradspec.train._ghost_base import (
    Capture,
    Layer,
    Rule,
    bias_norm2,
    count_call,
    kron_add,
    linear_weight_norm2,
    linear_weight_sum,
    unsupported,
)

_WEIGHTS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "out_proj.weight")
_BIASES = ("in_proj_bias", "out_proj.bias")
_OUT = "out_proj.weight"


@dataclass(eq=False)
class _Site:
    """One projection call: which rows of which weight and bias it used, and what it captured."""

    weight: str
    rows: tuple[int, int]
    bias: str | None
    bias_rows: tuple[int, int]
    inp: Tensor  # as F.linear got it: (L, B, d) for an input projection, (L * B, E) for the output one
    y: Tensor | None = None  # the (tapped) output, until the layout check
    grad_out: Tensor | None = None
    positions: int = 0  # L

    @property
    def out(self) -> bool:
        return self.weight == _OUT


def _block(part: Tensor, base: Tensor) -> tuple[int, int] | None:
    """The rows of ``base`` that ``part`` (base itself or a row block of it) covers."""
    if part is base:
        return 0, base.shape[0]
    if part._base is not base or part.stride() != base.stride() or part.shape[1:] != base.shape[1:]:
        return None
    start, rem = divmod(part.storage_offset() - base.storage_offset(), base.stride(0))
    return None if rem or start < 0 else (start, start + part.shape[0])


class MultiheadAttentionRule(Rule):
    """``nn.MultiheadAttention``: in_proj_weight/bias, q/k/v_proj_weight, out_proj.weight/bias."""

    attrs = (*_WEIGHTS, *_BIASES)

    def validate(self, module: nn.Module, layer_name: str, attr: str) -> None:
        if attr in ("bias_k", "bias_v"):
            raise unsupported(layer_name, "MultiheadAttention", f"has {attr} (add_bias_kv=True), which the "
                              "ghost backend does not model")
        super().validate(module, layer_name, attr)

    def _params(self, m: nn.Module) -> dict[int, str]:
        named = {"in_proj_weight": m.in_proj_weight, "q_proj_weight": m.q_proj_weight,
                 "k_proj_weight": m.k_proj_weight, "v_proj_weight": m.v_proj_weight,
                 "out_proj.weight": m.out_proj.weight, "in_proj_bias": m.in_proj_bias,
                 "out_proj.bias": m.out_proj.bias}
        return {id(p): attr for attr, p in named.items() if p is not None}

    # ------------------------------------------------------------------ capture
    def install(self, layer: Layer, cap: Capture) -> list[Any]:
        m = layer.module
        owned = self._params(m)
        params = {attr: p for attr in (*_WEIGHTS, *_BIASES) if (p := _get(m, attr)) is not None}

        def find(t: Tensor | None, kinds: tuple[str, ...]) -> tuple[str, tuple[int, int]] | None:
            if t is None:
                return None
            base = t if t._base is None else t._base
            attr = owned.get(id(base))
            if attr not in kinds:
                return None
            rows = _block(t, params[attr])
            if rows is None:
                raise unsupported(layer.name, layer.kind, f"used a part of {attr} that is not a block of its rows")
            return attr, rows

        def wrapper(saved):
            def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
                y = saved(input, weight, bias)
                w, bb = find(weight, _WEIGHTS), find(bias, _BIASES)
                if w is None or not (w[0] in layer.params or (bb is not None and bb[0] in layer.params)):
                    return y
                site = _Site(w[0], w[1], bb[0] if bb else None, bb[1] if bb else (0, 0), input.detach())
                y = cap.tap(y, site)
                site.y = y
                layer.cache.setdefault("sites", []).append(site)
                return y
            return linear

        def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            count_call(layer)
            layer.cache["sites"] = []
            saved = F.linear
            mine = wrapper(saved)
            F.linear = mine

            def restore() -> None:
                if F.linear is mine:
                    F.linear = saved
            layer.cache["restore"] = restore

        def post(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            layer.cache.pop("restore")()
            self._check_sites(layer, cap.b, out[0] if isinstance(out, tuple) else out)

        return [_FastPathOff(), m.register_forward_pre_hook(pre, with_kwargs=True),
                m.register_forward_hook(post, with_kwargs=True)]

    def release(self, layer: Layer) -> None:
        """Unwrap F.linear if a pass ended inside this module's forward (an exception)."""
        restore = layer.cache.pop("restore", None)
        if restore is not None:
            restore()

    def _check_sites(self, layer: Layer, b: int, out: Any) -> None:
        m = layer.module
        sites: list[_Site] = layer.cache["sites"]
        for s in sites:
            x = s.inp
            if s.out:
                seq = out.transpose(0, 1) if m.batch_first and isinstance(out, Tensor) else out
                ok = (isinstance(seq, Tensor) and seq.ndim == 3 and seq.shape[1] == b and x.ndim == 2
                      and s.y.shape[0] == seq.shape[0] * b and s.y.stride() == (s.y.shape[1], 1)
                      and seq.data_ptr() == s.y.data_ptr() and seq.stride() == (b * s.y.shape[1], s.y.shape[1], 1))
                if not ok:
                    raise unsupported(layer.name, layer.kind, "computed its output projection in a layout the "
                                      "ghost backend does not recognise (rows not ordered (position, example))")
                s.positions = seq.shape[0]
            elif x.ndim != 3 or x.shape[1] != b:
                raise unsupported(layer.name, layer.kind,
                                  f"got an input of shape {tuple(x.shape)} (sequence first), not one per example "
                                  f"of the batch of {b}: its gradient is not per-example")
            else:
                s.positions = x.shape[0]
            s.y = None
        for attr in layer.params:
            n = _get(m, attr).shape[0]
            got = sorted([s.rows for s in sites if s.weight == attr] + [s.bias_rows for s in sites if s.bias == attr])
            tiled = bool(got) and got[0][0] == 0 and got[-1][1] == n and all(
                prev[1] == nxt[0] for prev, nxt in zip(got, got[1:], strict=False))
            if not tiled:
                raise unsupported(layer.name, layer.kind,
                                  f"ran without projecting each row of {attr} once through F.linear (its fused "
                                  "fast path, or a torch whose attention no longer calls F.linear)")

    # ------------------------------------------------------------------ the math
    @staticmethod
    def _flat(site: _Site, b: int) -> tuple[Tensor, Tensor]:
        """(input (B, L, d), output gradient (B, L, r)) of one projection call."""
        x, L = site.inp, site.positions
        a = x.reshape(L, b, x.shape[-1]).transpose(0, 1)
        r = site.rows[1] - site.rows[0]
        g = site.grad_out
        if g is None:
            return a, torch.zeros(b, L, r, dtype=x.dtype, device=x.device)
        return a, g.reshape(L, b, r).transpose(0, 1)

    def norms2(self, layer: Layer, b: int) -> dict[str, Tensor]:
        device = layer.module.out_proj.weight.device
        out = {attr: torch.zeros(b, dtype=torch.float64, device=device) for attr in layer.params}
        for s in layer.cache["sites"]:
            a, g = self._flat(s, b)
            if s.weight in out:
                out[s.weight] = out[s.weight] + linear_weight_norm2(a, g)
            if s.bias in out:
                out[s.bias] = out[s.bias] + bias_norm2(g)
        return out

    def add_sum(self, layer: Layer, c: Tensor, out: Tensor) -> None:
        b = c.shape[0]
        for s in layer.cache["sites"]:
            a, g = self._flat(s, b)
            cg = g * c.to(g.dtype)[:, None, None]
            if s.weight in layer.params:
                layer.add(out, s.weight, linear_weight_sum(a, cg), start=s.rows[0] * a.shape[-1])
            if s.bias in layer.params:
                layer.add(out, s.bias, cg.sum((0, 1)), start=s.bias_rows[0])

    def sketch_kind(self, module: nn.Module, attr: str) -> str:
        return "kronecker" if attr in _WEIGHTS else "dense"

    def per_example(self, layer: Layer, b: int, attr: str) -> Tensor:
        param = _get(layer.module, attr)
        rows = torch.zeros(b, *param.shape, dtype=param.dtype, device=param.device)
        for s in layer.cache["sites"]:
            a, g = self._flat(s, b)
            if s.weight == attr:
                rows[:, s.rows[0] : s.rows[1]] += g.transpose(1, 2) @ a
            if s.bias == attr:
                rows[:, s.bias_rows[0] : s.bias_rows[1]] += g.sum(1)
        return rows.reshape(b, -1)

    def sketch_structured(self, layer: Layer, attr: str, c: Tensor, factors: Any, out: Tensor) -> None:
        for s in layer.cache["sites"]:
            if s.weight == attr:  # each call fills a row block of the (packed) weight
                a, g = self._flat(s, c.shape[0])
                kron_add(g * c.to(g.dtype)[:, None, None], a, factors, out, rows=s.rows)


class _FastPathOff:
    """Turns PyTorch's fused attention fast path off (it calls no F.linear) until ``remove()``.

    The engine removes handles in reverse order, so nested ones restore the original flag.
    """

    def __init__(self) -> None:
        self._was = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)

    def remove(self) -> None:
        torch.backends.mha.set_fastpath_enabled(self._was)


def _get(m: nn.Module, attr: str) -> Tensor | None:
    owner, _, name = attr.rpartition(".")
    return getattr(m.get_submodule(owner) if owner else m, name)
