"""Ghost clipping: the clipped sum of per-example gradients without per-example gradients.

A DP-SGD step that stores or applies only ``S = sum_i c_i g_i`` (``c_i`` the clip factor of
example i, `gradspec.privacy.clip_factors`) needs the per-example norms ``||g_i||`` and one
weighted sum, not the (B, p) matrix of rows. For a layer ``y = a W^T + b`` applied to the T
positions of an example (a: (T, d_in), output gradient e: (T, d_out)), the example's weight
gradient is ``G = e^T a`` and (Goodfellow 2015; Li et al. 2022 "ghost norm"; Bu et al. 2022)

    ||G||_F^2 = sum_{t,s} (a_t . a_s)(e_t . e_s)            (cost ~ T^2 (d_in + d_out))

or, materialised, ``||e^T a||_F^2`` (cost ~ T d_in d_out); each layer takes the cheaper
("mixed ghost clipping", Bu et al. 2022). An embedding looks up rows ``ids_t``, so its
gradient is ``sum_t onehot(ids_t) e_t`` and ``||G||^2 = sum_{t,s} [ids_t = ids_s](e_t . e_s)``
(padding_idx rows get no gradient and are left out). LayerNorm weights and all biases are
small enough to materialise per example. The per-example norm is over all selected
parameters jointly, ``||g_i||^2 = sum_layers ||G_i^layer||^2``, as the trainer's flat
clipping of the concatenated row (`gradspec.privacy.clip_per_example`).

The clipped sum then needs no second backward ("book-keeping", Bu et al. 2023): with the
layer inputs and output gradients kept from the one backward, ``sum_i c_i G_i =
(c * e)^T a`` over all examples and positions, one matrix product per layer (an
``index_add`` for embeddings).

The one backward computes only the gradients with respect to the layers' outputs: each
selected layer's output is passed through an identity autograd function tied to a
zero-dimensional anchor, and ``torch.autograd.grad(sum_i l_i, anchor)`` is taken, so no
weight gradient is formed. Selected parameters count, others are constants.

What is refused, with a one-line error naming the layer type or parameter (a wrong norm is
the worst failure: the sensitivity and the reported epsilon would be wrong, exit 0):

* a selected parameter of a layer type other than ``nn.Linear``, ``nn.Embedding``,
  ``nn.LayerNorm`` (use the ``vmap`` backend);
* a parameter shared by several modules (tied weights), a selected layer called more than
  once per forward (weight sharing), or not called at all while its output is needed;
* a layer whose input has another batch size than the batch (an input shared by the whole
  batch, such as BERT's position ids of batch size 1, is expanded to the batch for
  embeddings, where that does not change the output, and refused otherwise);
* an embedding with ``max_norm`` or ``scale_grad_by_freq``;
* an in-place operation on a selected layer's output (autograd raises);
* and, once, on the first batch of two or more examples (or on ``probe_batch``): the rows
  of two examples, read back through the book-keeping sum with weights (1, 0) and (0, 1),
  and their norms are compared with each example differentiated alone (a batch-of-one
  loop with ``torch.autograd.grad``), which catches a parameter used outside its layer
  (a functional call the hooks do not see) and a forward that mixes examples.

References: Goodfellow 2015 (per-example norms of linear layers); Li et al. 2022 (ghost
clipping for sequences, "Large language models can be strong differentially private
learners"); Bu et al. 2022 (mixed ghost clipping), 2023 (book-keeping).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor, nn

from gradspec._modes import _modes
from gradspec.privacy import clip_factors
from gradspec.train._engine import (
    Batch,
    EngineBase,
    ForwardFn,
    LossFn,
    _arm_probe,
    _batch_size,
    _rtol,
)

logger = logging.getLogger(__name__)

__all__ = ["GhostClipping", "GhostResult", "SUPPORTED_LAYERS"]

#: Layer types whose selected parameters the ghost engine handles.
SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = (nn.Linear, nn.Embedding, nn.LayerNorm)


class GhostResult(NamedTuple):
    """Output of `GhostClipping.__call__`."""

    total: Tensor  # (p,) sum_i c_i g_i in layout order (c_i = 1 without clipping)
    norms: Tensor  # (B,) pre-clip norms ||g_i|| over all selected parameters
    losses: Tensor  # (B,) per-example losses, detached


class _Tap(torch.autograd.Function):
    """Identity on a layer's output whose backward keeps the output gradient."""

    @staticmethod
    def forward(ctx, out: Tensor, anchor: Tensor, slot: _Layer) -> Tensor:  # noqa: ARG004
        ctx.slot = slot
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.slot.grad_out = grad.detach()
        return grad, None, None


@dataclass(eq=False)
class _Layer:
    """One selected layer: its parameters (name, offset, stop) and what one pass captured."""

    name: str
    module: nn.Module
    params: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # "weight" -> (full, a, b)
    calls: int = 0
    inp: Tensor | None = None
    grad_out: Tensor | None = None
    ghost: bool = True  # Linear: ghost norm (else materialised)
    ln_rows: tuple[Tensor, Tensor] | None = None  # LayerNorm: per-example rows of this pass

    def reset(self) -> None:
        self.calls, self.inp, self.grad_out, self.ln_rows = 0, None, None, None


class GhostClipping(EngineBase):
    """Per-example norms and the clipped sum of a model's selected parameters, by ghost clipping.

    Built once per run, like `PerExampleGradients`; each call handles one batch with one
    forward and one backward (per microbatch) and returns the clipped sum, the norms and the
    losses. The model runs in ``eval()`` mode (dropout off); its modes, flags and ``.grad``
    are left as they were.

    Args:
        model: the module.
        forward: ``forward(call, batch) -> outputs`` (``call`` invokes the model).
        loss: ``loss(outputs, batch) -> (B,)`` per-example losses.
        names: the selected parameters; the sum follows ``layout_for(model, names)``.
        microbatch: most examples per forward/backward (bounds memory); None = all at once.
        check: compare once the rows of two examples with a batch-of-one loop (see the
            module docstring); the structural checks of every call are not switchable.
        probe_batch: a batch (>= 2 examples) to run that comparison on at construction.

    Raises:
        ValueError: a selected parameter in an unsupported layer type, tied weights, or
            (probe) rows that differ from the batch-of-one reference.
    """

    def __init__(
        self,
        model: nn.Module,
        forward: ForwardFn,
        loss: LossFn,
        names: Sequence[str],
        *,
        microbatch: int | None = None,
        check: bool = True,
        probe_batch: Batch | None = None,
    ) -> None:
        self._bind(model, forward, loss, names, microbatch)
        self._layers = self._build_layers()
        _arm_probe(self, probe_batch, check)

    # ------------------------------------------------------------------ setup
    def _build_layers(self) -> list[_Layer]:
        aliases: dict[int, list[str]] = {}
        for alias, param in self.model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(alias)
        specs = {s.name: s for s in self.layout.params}
        layers: dict[str, _Layer] = {}
        for name in self.names:
            others = [a for a in aliases[id(self.model.get_parameter(name))] if a != name]
            if others:
                raise ValueError(
                    f"parameter {name!r} is shared with {others[0]!r} (tied weights); the ghost "
                    "backend sees one layer per parameter; use backend='vmap'"
                )
            owner_name, _, attr = name.rpartition(".")
            owner = self.model.get_submodule(owner_name)
            kind = type(owner).__name__
            if type(owner) not in SUPPORTED_LAYERS:
                raise ValueError(
                    f"the ghost backend has no per-example norm rule for layer type {kind} "
                    f"(parameter {name!r}; it handles Linear, Embedding, LayerNorm); use "
                    "backend='vmap'"
                )
            if attr not in ("weight", "bias"):
                raise ValueError(f"parameter {name!r} of {kind} is neither its weight nor its bias")
            if isinstance(owner, nn.Embedding) and (owner.max_norm is not None or owner.scale_grad_by_freq):
                raise ValueError(
                    f"embedding {owner_name!r} uses max_norm or scale_grad_by_freq, which the ghost "
                    "backend does not model; use backend='vmap'"
                )
            layer = layers.setdefault(owner_name, _Layer(owner_name, owner))
            spec = specs[name]
            layer.params[attr] = (name, spec.offset, spec.stop)
        return list(layers.values())

    # ------------------------------------------------------------------ public
    def __call__(self, batch: Batch, max_norm: float | None) -> GhostResult:
        """Clipped sum, pre-clip norms and losses of ``batch``.

        Args:
            batch: the examples.
            max_norm: the clipping norm C (factors ``C / max(||g_i||, C)``, the trainer's
                formula), or None for the plain sum (no clipping).
        """
        b = _batch_size(batch)
        if b >= 2 and self._unprobed:
            self._probe(batch)
        step = self.microbatch or max(b, 1)
        total = torch.zeros(self.p, dtype=self._dtype(), device=self._device())
        norms, losses = [], []
        for start in range(0, b, step):
            part = {k: v[start : start + step] for k, v in batch.items()}
            loss = self._capture(part)
            # per-layer squared norms summed in float64 (the clip factor's norm)
            norm = self._norms2(part_size := loss.shape[0]).double().sum(1).clamp_(min=0).sqrt_()
            factors = (clip_factors(norm, max_norm) if max_norm is not None
                       else torch.ones(part_size, dtype=norm.dtype, device=norm.device))
            self._weighted_sum(factors, out=total)
            self._release()
            norms.append(norm)
            losses.append(loss)
        if not norms:
            empty = torch.zeros(0, device=total.device)
            return GhostResult(total, empty, empty)
        return GhostResult(total, torch.cat(norms), torch.cat(losses))

    # ------------------------------------------------------------------ one pass
    def _dtype(self) -> torch.dtype:
        return self.model.get_parameter(self.names[0]).dtype

    def _device(self) -> torch.device:
        return self.model.get_parameter(self.names[0]).device

    def _capture(self, batch: Batch) -> Tensor:
        """Forward and backward of one slice; fills each layer's input and output gradient."""
        b = _batch_size(batch)
        anchor = torch.zeros((), dtype=self._dtype(), device=self._device(), requires_grad=True)
        handles = []

        def pre(module, args):
            if isinstance(module, nn.Embedding) and args and args[0].shape[0] == 1 and b > 1:
                # an index tensor shared by the batch (position ids): one lookup per example
                return (args[0].expand(b, *args[0].shape[1:]), *args[1:])
            return None

        def post(module, args, out, layer):
            layer.calls += 1
            if layer.calls > 1:
                raise ValueError(
                    f"layer {layer.name!r} ({type(module).__name__}) ran twice in one forward "
                    "(weight sharing): the ghost backend needs one call per selected layer; use "
                    "backend='vmap'"
                )
            inp = args[0] if args else None
            flat_ok = isinstance(inp, Tensor) and (inp.ndim >= 2 or isinstance(module, nn.Embedding))
            if not flat_ok or inp.shape[0] != b or not isinstance(out, Tensor) or out.shape[0] != b:
                got = tuple(inp.shape) if isinstance(inp, Tensor) else type(inp).__name__
                raise ValueError(
                    f"layer {layer.name!r} ({type(module).__name__}) got an input of shape {got}, "
                    f"not one per example of the batch of {b}: its gradient is not per-example; "
                    "use backend='vmap'"
                )
            layer.inp = inp.detach()
            return _Tap.apply(out, anchor, layer)

        try:
            for layer in self._layers:
                layer.reset()
                if isinstance(layer.module, nn.Embedding):
                    handles.append(layer.module.register_forward_pre_hook(pre))
                handles.append(layer.module.register_forward_hook(
                    lambda m, a, o, _l=layer: post(m, a, o, _l)))
            with _modes(self.model, False), torch.enable_grad():
                losses = self.loss(self.forward(self.model, batch), batch)
                if tuple(losses.shape) != (b,):
                    raise ValueError(
                        f"the loss must return one value per example, shape ({b},), got "
                        f"{tuple(losses.shape)}: use reduction='none'"
                    )
                if losses.requires_grad:
                    torch.autograd.grad(losses.sum(), anchor, allow_unused=True)
        except RuntimeError as err:
            self._release()
            if "modified inplace" in str(err) and "Tap" in str(err):
                raise ValueError(
                    "the model modifies a selected layer's output in place (e.g. ReLU(inplace=True)), "
                    "which hides the output gradient; use backend='vmap' or an out-of-place op"
                ) from err
            raise
        except BaseException:
            self._release()
            raise
        finally:
            for h in handles:
                h.remove()
        for layer in self._layers:
            if layer.calls == 0:
                self._release()
                raise ValueError(
                    f"selected layer {layer.name!r} ({type(layer.module).__name__}) did not run in "
                    "the forward; select only parameters the model uses"
                )
        return losses.detach()

    def _release(self) -> None:
        for layer in self._layers:
            layer.reset()

    # ------------------------------------------------------------------ the math
    @staticmethod
    def _flat(layer: _Layer, b: int) -> tuple[Tensor, Tensor]:
        """(input, output gradient) as (B, T, ·); a missing output gradient is zero."""
        inp = layer.inp
        out_dim = _out_dim(layer.module)
        if isinstance(layer.module, nn.Embedding):
            ids = inp.reshape(b, -1)
            g = layer.grad_out
            if g is None:
                w = layer.module.weight
                g = torch.zeros(b, ids.shape[1], out_dim, dtype=w.dtype, device=w.device)
            return ids, g.reshape(b, ids.shape[1], out_dim)
        a = inp.reshape(b, -1, inp.shape[-1])
        g = layer.grad_out
        if g is None:
            g = torch.zeros(b, a.shape[1], out_dim, dtype=a.dtype, device=a.device)
        return a, g.reshape(b, a.shape[1], -1)

    def _norms2(self, b: int) -> Tensor:
        """(B, n_params) squared norms of each example's gradient of each selected parameter
        (columns in ``self.names`` order)."""
        cols: dict[str, Tensor] = {}
        for layer in self._layers:
            m = layer.module
            if isinstance(m, nn.LayerNorm):
                gw, gb = self._layer_norm_rows(layer, b)
                for attr, rows in (("weight", gw), ("bias", gb)):
                    if attr in layer.params:
                        cols[layer.params[attr][0]] = rows.flatten(1).square().sum(1)
                continue
            a, g = self._flat(layer, b)
            if isinstance(m, nn.Embedding):
                if m.padding_idx is not None:
                    g = g * (a != m.padding_idx).unsqueeze(-1).to(g.dtype)
                same = (a.unsqueeze(2) == a.unsqueeze(1)).to(g.dtype)
                cols[layer.params["weight"][0]] = (same * (g @ g.transpose(1, 2))).sum((1, 2))
                continue
            if "weight" in layer.params:
                t, d_in, d_out = a.shape[1], a.shape[2], g.shape[2]
                if t == 1:
                    w = a.square().sum((1, 2)) * g.square().sum((1, 2))
                elif t * (d_in + d_out) <= d_in * d_out:  # ghost: cheaper than materialising
                    w = ((a @ a.transpose(1, 2)) * (g @ g.transpose(1, 2))).sum((1, 2))
                else:
                    w = (g.transpose(1, 2) @ a).square().sum((1, 2))
                cols[layer.params["weight"][0]] = w
            if "bias" in layer.params:
                cols[layer.params["bias"][0]] = g.sum(1).square().sum(1)
        return torch.stack([cols[n] for n in self.names], dim=1)

    @staticmethod
    def _layer_norm_rows(layer: _Layer, b: int) -> tuple[Tensor, Tensor]:
        """Per-example LayerNorm weight and bias gradients, (B, *normalized_shape) each.

        Computed once per pass: the norms and the weighted sum both read them.
        """
        if layer.ln_rows is not None:
            return layer.ln_rows
        m = layer.module
        x = layer.inp
        dims = tuple(range(x.ndim - len(m.normalized_shape), x.ndim))
        mean = x.mean(dims, keepdim=True)
        var = x.var(dims, keepdim=True, unbiased=False)
        xhat = (x - mean) * torch.rsqrt(var + m.eps)
        g = layer.grad_out if layer.grad_out is not None else torch.zeros_like(x)
        inner = tuple(range(1, x.ndim - len(m.normalized_shape)))
        gw = (g * xhat).sum(inner) if inner else g * xhat
        gb = g.sum(inner) if inner else g
        layer.ln_rows = (gw.reshape(b, *m.normalized_shape), gb.reshape(b, *m.normalized_shape))
        return layer.ln_rows

    def _weighted_sum(self, c: Tensor, *, out: Tensor) -> Tensor:
        """Add ``sum_i c_i g_i`` (layout order) to ``out`` from the captured inputs/gradients."""
        b = c.shape[0]
        for layer in self._layers:
            m = layer.module
            if isinstance(m, nn.LayerNorm):
                gw, gb = self._layer_norm_rows(layer, b)
                for attr, rows in (("weight", gw), ("bias", gb)):
                    if attr in layer.params:
                        _, lo, hi = layer.params[attr]
                        out[lo:hi] += (c.to(rows.dtype) @ rows.flatten(1)).to(out.dtype)
                continue
            a, g = self._flat(layer, b)
            cg = g * c.to(g.dtype)[:, None, None]
            if isinstance(m, nn.Embedding):
                _, lo, hi = layer.params["weight"]
                keep = cg.reshape(-1, cg.shape[-1])
                ids = a.reshape(-1)
                if m.padding_idx is not None:
                    mask = ids != m.padding_idx
                    ids, keep = ids[mask], keep[mask]
                out[lo:hi].view(m.weight.shape).index_add_(0, ids, keep.to(out.dtype))
                continue
            if "weight" in layer.params:
                _, lo, hi = layer.params["weight"]
                w = cg.reshape(-1, cg.shape[-1]).T @ a.reshape(-1, a.shape[-1])
                out[lo:hi] += w.reshape(-1).to(out.dtype)
            if "bias" in layer.params:
                _, lo, hi = layer.params["bias"]
                out[lo:hi] += cg.sum((0, 1)).to(out.dtype)
        return out

    # ------------------------------------------------------------------ probe
    def _probe(self, batch: Batch) -> None:
        """Rows and norms of two examples against each example differentiated alone."""
        part = {k: v[:2] for k, v in batch.items()}
        loss = self._capture(part)
        norms2 = self._norms2(2)
        rows = []
        for i in range(2):
            c = torch.zeros(2, dtype=self._dtype(), device=self._device())
            c[i] = 1
            rows.append(self._weighted_sum(c, out=torch.zeros(self.p, dtype=self._dtype(), device=self._device())))
        self._release()
        del loss
        params = [self.model.get_parameter(n) for n in self.names]
        flags = [(p, p.requires_grad) for p in params]
        refs = []
        try:
            for p in params:
                p.requires_grad_(True)
            with _modes(self.model, False), torch.enable_grad():
                for i in range(2):
                    one = {k: v[i : i + 1] for k, v in part.items()}
                    li = self.loss(self.forward(self.model, one), one).sum()
                    refs.append(torch.autograd.grad(li, params, allow_unused=True))
        finally:
            for p, flag in flags:
                p.requires_grad_(flag)
        wants = [torch.stack([(r[j] if r[j] is not None else torch.zeros_like(param)).reshape(-1).double()
                              for r in refs]) for j, param in enumerate(params)]
        # A parameter whose true gradient is ~0 (BERT's key bias: softmax ignores a shift) is
        # compared against a floor of 1e-3 of the whole rows' norm, not its own rounding noise.
        floor = 1e-3 * float(torch.linalg.vector_norm(torch.cat(wants, dim=1)))
        for j, (name, param) in enumerate(zip(self.names, params, strict=True)):
            spec = self.layout.params[j]
            want = wants[j]
            got = torch.stack([r[spec.offset : spec.stop].double() for r in rows])
            gap = float(torch.linalg.vector_norm(got - want))
            scale = max(float(torch.linalg.vector_norm(want)), floor, 1e-300)
            norm_gap = float((norms2[:, j].double().clamp(min=0).sqrt() - want.norm(dim=1)).abs().max())
            tol = _rtol(param.dtype)
            if gap > tol * scale or norm_gap > tol * scale:
                rel = max(gap, norm_gap) / scale
                raise ValueError(
                    f"ghost-clipping gradients of {name!r} differ from each example differentiated "
                    f"alone (relative error {rel:.2g} on 2 examples): the parameter is used outside "
                    "its layer's forward (a functional call or tied weight), or the forward mixes "
                    "examples; use backend='vmap'"
                )
        self._unprobed = False


def _out_dim(module: nn.Module) -> int:
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, nn.Embedding):
        return module.embedding_dim
    raise TypeError(type(module).__name__)
