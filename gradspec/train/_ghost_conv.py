"""Ghost-clipping rule of ``nn.Conv1d`` and ``nn.Conv2d``.

A convolution is a linear map applied at T output positions: with the example's input
unfolded into patches ``A`` (T, C_in/G * k) per group of channels (``F.unfold`` after the
layer's own padding) and its output gradient ``g`` (T, C_out/G), the per-example weight
gradient of a group is ``g^T A`` and its squared norm is that of a linear layer on T
positions (`linear_weight_norm2`: the ghost Gram trick ``sum_{t,s} (A_t . A_s)(g_t . g_s)``
when cheaper than materialising, else ``||g^T A||^2``), summed over the groups. The bias
gradient is ``sum_t g_t``. The clipped sum is the convolution's own weight gradient of the
weighted output gradients ``c_i g_i`` (``torch.nn.grad.conv{1,2}d_weight``), so no patch
matrix is kept between the norms and the sum.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn import grad as conv_grad

from gradspec.train._ghost_base import Layer, Rule, kron_add, linear_weight_norm2, unsupported


class ConvRule(Rule):
    """``nn.Conv1d`` (``dims=1``) and ``nn.Conv2d`` (``dims=2``), any stride, dilation,
    groups, padding (numbers or ``"same"``/``"valid"``) and padding mode."""

    def __init__(self, dims: int) -> None:
        self.dims = dims

    def min_ndim(self, module: nn.Module) -> int:  # (B, C, *spatial)
        return self.dims + 2

    def _padded(self, m: nn.Module, x: Tensor) -> Tensor:
        """The input with the layer's padding applied (so the convolution itself pads nothing)."""
        pad = list(m._reversed_padding_repeated_twice)
        if not any(pad):
            return x
        return F.pad(x, pad, mode="constant" if m.padding_mode == "zeros" else m.padding_mode)

    def _pairs(self, layer: Layer, b: int) -> tuple[Tensor, Tensor | None, tuple[int, ...]]:
        """(padded input, output gradient or None, output spatial shape)."""
        m, x = layer.module, layer.inp
        if x.ndim != self.dims + 2:
            raise unsupported(layer.name, layer.kind, f"got an input of {x.ndim} dimensions, not "
                              f"(B, C, {'L' if self.dims == 1 else 'H, W'})")
        xp = self._padded(m, x)
        return xp, layer.grad_out, self._out_shape(m, xp)

    def _out_shape(self, m: nn.Module, xp: Tensor) -> tuple[int, ...]:
        return tuple(
            (xp.shape[2 + i] - m.dilation[i] * (m.kernel_size[i] - 1) - 1) // m.stride[i] + 1
            for i in range(self.dims)
        )

    def norms2(self, layer: Layer, b: int) -> dict[str, Tensor]:
        m = layer.module
        xp, g, spatial = self._pairs(layer, b)
        t = math.prod(spatial)
        c_out, groups = m.out_channels, m.groups
        if g is None:
            g = torch.zeros(b, c_out, *spatial, dtype=xp.dtype, device=xp.device)
        out = {}
        if "weight" in layer.params:
            a, e = self._per_group(layer, xp, g, t)
            out["weight"] = linear_weight_norm2(a.flatten(0, 1), e.flatten(0, 1)).view(b, groups).sum(1)
        if "bias" in layer.params:
            out["bias"] = g.reshape(b, c_out, t).sum(2).square().sum(1, dtype=torch.float64)
        return out

    def _per_group(self, layer: Layer, xp: Tensor, g: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """(patches (B, G, T, C_in/G k), output gradients (B, G, T, C_out/G)) per group of channels."""
        m, b = layer.module, xp.shape[0]
        if self.dims == 1:  # as a 2-d convolution of height 1
            xp4 = xp.unsqueeze(2)
            ks, dil, st = (1, *m.kernel_size), (1, *m.dilation), (1, *m.stride)
        else:
            xp4, ks, dil, st = xp, m.kernel_size, m.dilation, m.stride
        patches = F.unfold(xp4, kernel_size=ks, dilation=dil, padding=0, stride=st)  # (B, C_in k, T)
        if patches.shape[-1] != t:
            raise unsupported(layer.name, layer.kind, f"has {patches.shape[-1]} patch positions but an "
                              f"output of {t}: its forward is not the convolution the rule models")
        groups = m.groups
        d_in, d_out = patches.shape[1] // groups, m.out_channels // groups
        a = patches.view(b, groups, d_in, t).transpose(2, 3)
        e = g.reshape(b, groups, d_out, t).transpose(2, 3)
        return a, e

    def _sketch_inputs(self, layer: Layer, b: int) -> tuple[Tensor, Tensor, int] | None:
        xp, g, spatial = self._pairs(layer, b)
        return None if g is None else (xp, g, math.prod(spatial))

    def sketch_kind(self, module: nn.Module, attr: str) -> str:
        # the weight as a matrix (C_out, C_in/G * k): Kronecker on out channels x patch entries
        return "kronecker" if attr == "weight" else "dense"

    def per_example(self, layer: Layer, b: int, attr: str) -> Tensor:
        m = layer.module
        got = self._sketch_inputs(layer, b)
        numel = getattr(m, attr).numel()
        if got is None:
            return torch.zeros(b, numel, dtype=m.weight.dtype, device=m.weight.device)
        xp, g, t = got
        if attr == "bias":
            return g.reshape(b, m.out_channels, t).sum(2)
        a, e = self._per_group(layer, xp, g, t)
        return (e.transpose(2, 3) @ a).reshape(b, numel)  # (B, G, C_out/G, C_in/G k)

    def sketch_structured(self, layer: Layer, attr: str, c: Tensor, factors: Any, out: Tensor) -> None:
        got = self._sketch_inputs(layer, c.shape[0])
        if got is None:
            return
        xp, g, t = got
        a, e = self._per_group(layer, xp, g, t)
        e = e * c.to(e.dtype).view(-1, 1, 1, 1)
        d_out = e.shape[-1]
        for gi in range(a.shape[1]):  # group gi fills the weight's rows [gi d_out, (gi + 1) d_out)
            kron_add(e[:, gi], a[:, gi], factors, out, rows=(gi * d_out, (gi + 1) * d_out))

    def add_sum(self, layer: Layer, c: Tensor, out: Tensor) -> None:
        m = layer.module
        b = c.shape[0]
        xp, g, spatial = self._pairs(layer, b)
        if g is None:
            return  # no gradient: nothing to add
        cg = g * c.to(g.dtype).view(b, *([1] * (g.ndim - 1)))
        if "weight" in layer.params:
            weight_grad = conv_grad.conv1d_weight if self.dims == 1 else conv_grad.conv2d_weight
            w = weight_grad(xp, m.weight.shape, cg, stride=m.stride, padding=0, dilation=m.dilation,
                            groups=m.groups)
            layer.add(out, "weight", w)
        if "bias" in layer.params:
            layer.add(out, "bias", cg.sum((0, *range(2, cg.ndim))))
