"""Ghost-clipping rules of the dense layers: ``nn.Linear``, transformers' ``Conv1D`` (GPT-2),
``nn.Embedding``, and the affine normalisations ``nn.LayerNorm``, ``nn.RMSNorm``,
``nn.GroupNorm``.

* Linear, ``y = a W^T + b`` on positions t of an example: ``G = g^T a``, its norm by the
  ghost trick or materialised (`linear_weight_norm2`), the bias ``sum_t g_t``. Conv1D is the
  same map with the weight stored transposed (``y = a W + b``, W: (d_in, d_out)).
* Embedding, rows ``ids_t`` looked up: ``G = sum_t onehot(ids_t) g_t`` and
  ``||G||^2 = sum_{t,s} [ids_t = ids_s] (g_t . g_s)``; ``padding_idx`` rows get no gradient.
  An index tensor of batch size 1 shared by the batch (BERT's and GPT-2's position ids) is
  expanded to the batch, which does not change the output of a broadcast sum.
* The normalisations ``y = xhat * w + b`` with ``xhat`` the input normalised per example
  (over its last dims, or per group of channels): ``G_w = sum_pos g * xhat``, ``G_b =
  sum_pos g``, small enough to materialise per example (once per pass, read by both the
  norms and the sum).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from gradspec.train._ghost_base import (
    Capture,
    Layer,
    Rule,
    bias_norm2,
    kron_add,
    linear_weight_norm2,
    linear_weight_sum,
    unsupported,
)


def _flat(layer: Layer, b: int, d_out: int) -> tuple[Tensor, Tensor]:
    """(input, output gradient) of a linear-like layer as (B, T, ·); a missing gradient is zero."""
    inp = layer.inp
    a = inp.reshape(b, -1, inp.shape[-1])
    g = layer.grad_out
    if g is None:
        g = torch.zeros(b, a.shape[1], d_out, dtype=a.dtype, device=a.device)
    return a, g.reshape(b, a.shape[1], d_out)


class LinearRule(Rule):
    """``nn.Linear`` (and transformers' ``Conv1D`` with ``transposed``)."""

    def __init__(self, *, transposed: bool = False) -> None:
        self.transposed = transposed  # Conv1D: weight (d_in, d_out)

    def _d_out(self, module: nn.Module) -> int:
        return module.weight.shape[1 if self.transposed else 0]

    def norms2(self, layer: Layer, b: int) -> dict[str, Tensor]:
        a, g = _flat(layer, b, self._d_out(layer.module))
        out = {}
        if "weight" in layer.params:
            out["weight"] = linear_weight_norm2(a, g)
        if "bias" in layer.params:
            out["bias"] = bias_norm2(g)
        return out

    def add_sum(self, layer: Layer, c: Tensor, out: Tensor) -> None:
        a, g = _flat(layer, c.shape[0], self._d_out(layer.module))
        cg = g * c.to(g.dtype)[:, None, None]
        if "weight" in layer.params:
            w = linear_weight_sum(a, cg)
            layer.add(out, "weight", w.T if self.transposed else w)
        if "bias" in layer.params:
            layer.add(out, "bias", cg.sum((0, 1)))

    def sketch_kind(self, module: nn.Module, attr: str) -> str:
        return "kronecker" if attr == "weight" else "dense"

    def per_example(self, layer: Layer, b: int, attr: str) -> Tensor:
        a, g = _flat(layer, b, self._d_out(layer.module))
        if attr == "bias":
            return g.sum(1)
        w = g.transpose(1, 2) @ a  # (B, d_out, d_in)
        return (w.transpose(1, 2) if self.transposed else w).reshape(b, -1)

    def sketch_structured(self, layer: Layer, attr: str, c: Tensor, factors: Any, out: Tensor) -> None:
        a, g = _flat(layer, c.shape[0], self._d_out(layer.module))
        cg = g * c.to(g.dtype)[:, None, None]
        # the weight's rows are d_out (Linear) or d_in (Conv1D, stored transposed)
        kron_add(*((a, cg) if self.transposed else (cg, a)), factors, out)


class EmbeddingRule(Rule):
    """``nn.Embedding`` (without ``max_norm`` or ``scale_grad_by_freq``)."""

    attrs = ("weight",)

    def min_ndim(self, module: nn.Module) -> int:
        return 1

    def validate(self, module: nn.Module, layer_name: str, attr: str) -> None:
        super().validate(module, layer_name, attr)
        if module.max_norm is not None or module.scale_grad_by_freq:
            raise unsupported(layer_name, "Embedding", "uses max_norm or scale_grad_by_freq, which the "
                              "ghost backend does not model")

    def install(self, layer: Layer, cap: Capture) -> list[Any]:
        def pre(module: nn.Module, args: tuple) -> tuple | None:
            if args and isinstance(args[0], Tensor) and args[0].ndim >= 1 and args[0].shape[0] == 1 and cap.b > 1:
                # an index tensor shared by the batch (position ids): one lookup per example
                return (args[0].expand(cap.b, *args[0].shape[1:]), *args[1:])
            return None

        return [layer.module.register_forward_pre_hook(pre), *super().install(layer, cap)]

    def _ids_grads(self, layer: Layer, b: int) -> tuple[Tensor, Tensor]:
        m = layer.module
        ids = layer.inp.reshape(b, -1)
        g = layer.grad_out
        if g is None:
            g = torch.zeros(b, ids.shape[1], m.embedding_dim, dtype=m.weight.dtype, device=m.weight.device)
        return ids, g.reshape(b, ids.shape[1], m.embedding_dim)

    def norms2(self, layer: Layer, b: int) -> dict[str, Tensor]:
        m = layer.module
        ids, g = self._ids_grads(layer, b)
        if m.padding_idx is not None:
            g = g * (ids != m.padding_idx).unsqueeze(-1).to(g.dtype)
        same = (ids.unsqueeze(2) == ids.unsqueeze(1)).to(g.dtype)
        return {"weight": (same * (g @ g.transpose(1, 2))).sum((1, 2), dtype=torch.float64)}

    def add_sum(self, layer: Layer, c: Tensor, out: Tensor) -> None:
        m = layer.module
        ids, g = self._ids_grads(layer, c.shape[0])
        keep = (g * c.to(g.dtype)[:, None, None]).reshape(-1, g.shape[-1])
        ids = ids.reshape(-1)
        if m.padding_idx is not None:
            mask = ids != m.padding_idx
            ids, keep = ids[mask], keep[mask]
        _, lo, hi = layer.params["weight"]
        out[lo:hi].view(m.weight.shape).index_add_(0, ids, keep.to(out.dtype))

    def sketch_kind(self, module: nn.Module, attr: str) -> str:
        return "countsketch-kronecker"

    def _kept(self, layer: Layer, b: int) -> tuple[Tensor, Tensor]:
        """(ids, output gradients with padding rows zeroed), (B, T) and (B, T, D)."""
        m = layer.module
        ids, g = self._ids_grads(layer, b)
        if m.padding_idx is not None:
            g = g * (ids != m.padding_idx).unsqueeze(-1).to(g.dtype)
        return ids, g

    def per_example(self, layer: Layer, b: int, attr: str) -> Tensor:
        m = layer.module
        ids, g = self._kept(layer, b)
        rows = torch.zeros(b, m.num_embeddings, m.embedding_dim, dtype=g.dtype, device=g.device)
        rows.scatter_add_(1, ids.unsqueeze(-1).expand(-1, -1, m.embedding_dim), g)
        return rows.reshape(b, -1)

    def sketch_structured(self, layer: Layer, attr: str, c: Tensor, f: Any, out: Tensor) -> None:
        ids, g = self._kept(layer, c.shape[0])
        cg = g * c.to(g.dtype)[:, None, None]
        # S G P1^T with S the CountSketch of the rows: sum_t sign(x_t) e_{hash(x_t)} (P1 g_t)^T, every block
        b, t, j, m1 = cg.shape[0], cg.shape[1], f.blocks, f.m1
        v = (cg @ f.right.T.to(cg.dtype)).view(b, t, j, m1)
        v = (v * f.sign.to(cg.dtype)[:, ids].permute(1, 2, 0).unsqueeze(-1)).transpose(1, 2)  # (B, J, T, m1)
        where = f.bucket[:, ids].permute(1, 0, 2).unsqueeze(-1).expand(-1, -1, -1, m1)  # (B, J, T, m1)
        y = torch.zeros(b, j, f.m0, m1, dtype=v.dtype, device=v.device)
        f.add(y.scatter_add_(2, where, v), out)


class AffineNormRule(Rule):
    """An elementwise affine map after a per-example normalisation: LayerNorm, RMSNorm, GroupNorm."""

    def min_ndim(self, module: nn.Module) -> int:  # a batch dimension before the normalised ones
        return len(module.normalized_shape) + 1

    def normalized(self, module: nn.Module, x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        """``xhat`` and the dimensions of x the per-example gradients sum over."""
        raise NotImplementedError

    def rows(self, layer: Layer, b: int) -> dict[str, Tensor]:
        """Per-example weight and bias gradients, (B, *parameter shape); once per pass."""
        if "rows" not in layer.cache:
            m, x = layer.module, layer.inp
            xhat, dims = self.normalized(m, x)
            g = layer.grad_out if layer.grad_out is not None else torch.zeros_like(x)
            shape = (b, *m.weight.shape)
            rows = {}
            if "weight" in layer.params:
                rows["weight"] = ((g * xhat).sum(dims) if dims else g * xhat).reshape(shape)
            if "bias" in layer.params:
                rows["bias"] = (g.sum(dims) if dims else g).reshape(shape)
            layer.cache["rows"] = rows
        return layer.cache["rows"]

    def norms2(self, layer: Layer, b: int) -> dict[str, Tensor]:
        rows = self.rows(layer, b)
        return {attr: rows[attr].flatten(1).square().sum(1, dtype=torch.float64) for attr in layer.params}

    def add_sum(self, layer: Layer, c: Tensor, out: Tensor) -> None:
        rows = self.rows(layer, c.shape[0])
        for attr in layer.params:
            r = rows[attr].flatten(1)
            layer.add(out, attr, c.to(r.dtype) @ r)

    def per_example(self, layer: Layer, b: int, attr: str) -> Tensor:
        return self.rows(layer, b)[attr].flatten(1)


class LayerNormRule(AffineNormRule):
    def normalized(self, module: nn.Module, x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        shape = tuple(module.normalized_shape)
        return F.layer_norm(x, shape, None, None, module.eps), tuple(range(1, x.ndim - len(shape)))


class RMSNormRule(AffineNormRule):
    attrs = ("weight",)

    def normalized(self, module: nn.Module, x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        shape = tuple(module.normalized_shape)
        return F.rms_norm(x, shape, None, module.eps), tuple(range(1, x.ndim - len(shape)))


class GroupNormRule(AffineNormRule):
    def min_ndim(self, module: nn.Module) -> int:  # (B, C, *)
        return 2

    def normalized(self, module: nn.Module, x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        return F.group_norm(x, module.num_groups, None, None, module.eps), tuple(range(2, x.ndim))
