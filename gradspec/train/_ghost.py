"""Ghost clipping: the clipped sum of per-example gradients without per-example gradients.

A DP-SGD step that stores or applies only ``S = sum_i c_i g_i`` (``c_i`` the clip factor of
example i, `gradspec.privacy.clip_factors`) needs the per-example norms ``||g_i||`` and one
weighted sum, not the (B, p) matrix of rows. For a layer ``y = a W^T + b`` applied to the T
positions of an example (a: (T, d_in), output gradient e: (T, d_out)), the example's weight
gradient is ``G = e^T a`` and (Goodfellow 2015; Li et al. 2022 "ghost norm"; Bu et al. 2022)

    ||G||_F^2 = sum_{t,s} (a_t . a_s)(e_t . e_s)            (cost ~ T^2 (d_in + d_out))

or, materialised, ``||e^T a||_F^2`` (cost ~ T d_in d_out); each layer takes the cheaper
("mixed ghost clipping", Bu et al. 2022). Each layer type has a rule (its own module):

* ``nn.Linear``, transformers' ``Conv1D`` (GPT-2; the weight transposed), ``nn.Embedding``,
  ``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.GroupNorm``: `gradspec.train._ghost_rules`;
* ``nn.Conv1d``, ``nn.Conv2d`` (unfolded patches are the positions): `gradspec.train._ghost_conv`;
* ``nn.MultiheadAttention``'s input and output projections: `gradspec.train._ghost_mha`;
* a subclass of one of these that keeps its forward (``NonDynamicallyQuantizableLinear``)
  takes its base's rule.

The per-example norm is over all selected parameters jointly, ``||g_i||^2 = sum_layers
||G_i^layer||^2`` (per-parameter squares summed in float64), as the trainer's flat clipping
of the concatenated row (`gradspec.privacy.clip_rows`).

The clipped sum then needs no second backward ("book-keeping", Bu et al. 2023): with the
layer inputs and output gradients kept from the one backward, ``sum_i c_i G_i =
(c * e)^T a`` over all examples and positions, one matrix product per layer (an
``index_add`` for embeddings, the convolution's weight gradient for convolutions).

Sketched rows (issue 22; `GhostClipping.set_sketch` with a `gradspec.sketch.SketchPlan`, then
``__call__(..., sketch=True)``): from the same captured inputs and output gradients, each rule
adds ``c_i Phi g_i`` to the example's M-column row. A linear map's Kronecker block is
``vec(P0 G P1^T) = vec((e P0^T)^T (a P1^T))``: two small products with the J blocks' factors
stacked and one batched product for all blocks (`kron_add`; Conv1D swaps the roles, a convolution's groups and attention's row blocks
fill row blocks of P0's columns); an embedding's is a CountSketch of the vocabulary times a
Gaussian, one scatter-add; parameters planned ``exact`` or ``dense`` (biases, normalisation
weights) are formed per example (`Rule.per_example`) and copied or projected. The norms, and
so the clip factors, stay the exact ghost norms.

The one backward computes only the gradients with respect to the layers' outputs: each
selected layer's output is passed through an identity autograd function tied to a
zero-dimensional anchor, and ``torch.autograd.grad(sum_i l_i, anchor)`` is taken, so no
weight gradient is formed. Selected parameters count, others are constants.

What is refused, with a one-line error naming the layer type or parameter (a wrong norm is
the worst failure: the sensitivity and the reported epsilon would be wrong, exit 0):

* a selected parameter of any other layer type, or of a subclass with its own forward
  (use the ``vmap`` backend);
* a parameter shared by several modules (tied weights), a selected layer called more than
  once per forward (weight sharing), or not called at all while its output is needed;
* a layer whose input has another batch size than the batch (an input shared by the whole
  batch, such as BERT's and GPT-2's position ids of batch size 1, is expanded to the batch
  for embeddings, where that does not change the output, and refused otherwise);
* the options a rule does not model (an embedding's ``max_norm``, attention's ``bias_k``);
* an in-place operation on a selected layer's output (autograd raises);
* and, once, on the first batch of two or more examples (or on ``probe_batch``): the rows
  of two examples, read back through the book-keeping sum with weights (1, 0) and (0, 1),
  and their norms are compared with each example differentiated alone (a batch-of-one
  loop with ``torch.autograd.grad``), which catches a parameter used outside its layer
  (a functional call the hooks do not see), a forward that mixes examples, and an input
  laid out with the batch in another dimension than the rules assume. ``check=False``
  skips it (an expert switch that logs a warning; the trainer never turns it off).

References: Goodfellow 2015 (per-example norms of linear layers); Li et al. 2022 (ghost
clipping for sequences, "Large language models can be strong differentially private
learners"); Bu et al. 2022 (mixed ghost clipping), 2023 (book-keeping).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from gradspec._modes import _modes
from gradspec.privacy import clip_factors
from gradspec.sketch import SketchFactors, SketchPlan
from gradspec.train._engine import (
    Batch,
    EngineBase,
    ForwardFn,
    LossFn,
    _arm_probe,
    _batch_size,
    _rtol,
)
from gradspec.train._ghost_base import Capture, Layer, Rule, unsupported
from gradspec.train._ghost_conv import ConvRule
from gradspec.train._ghost_mha import MultiheadAttentionRule
from gradspec.train._ghost_rules import (
    EmbeddingRule,
    GroupNormRule,
    LayerNormRule,
    LinearRule,
    RMSNormRule,
)

logger = logging.getLogger(__name__)

__all__ = ["GhostClipping", "GhostResult", "SUPPORTED_LAYERS", "rule_for"]

_RULES: dict[type[nn.Module], Rule] = {
    nn.Linear: LinearRule(),
    nn.Embedding: EmbeddingRule(),
    nn.LayerNorm: LayerNormRule(),
    nn.RMSNorm: RMSNormRule(),
    nn.GroupNorm: GroupNormRule(),
    nn.Conv1d: ConvRule(1),
    nn.Conv2d: ConvRule(2),
    nn.MultiheadAttention: MultiheadAttentionRule(),
}
_HF_CONV1D = LinearRule(transposed=True)

#: Layer types whose selected parameters the ghost engine handles (and transformers' Conv1D).
SUPPORTED_LAYERS: tuple[type[nn.Module], ...] = tuple(_RULES)
_SUPPORTED_NAMES = ", ".join([t.__name__ for t in SUPPORTED_LAYERS] + ["Conv1D (transformers)"])

#: Methods a subclass must not override to take its base's rule.
_FORWARD_METHODS = ("forward", "_conv_forward")

#: What the batch-of-one check catches that the per-call checks do not (named when it is off).
_UNCHECKED = ("a selected parameter used outside its layer (a functional call, a weight tied "
              "behind the hooks' back), a forward that mixes examples, and a layer input laid out "
              "with the batch in another dimension")


def _is_hf_conv1d(cls: type) -> bool:
    if cls.__name__ != "Conv1D" or not cls.__module__.startswith("transformers"):
        return False
    from transformers.pytorch_utils import Conv1D

    return cls is Conv1D


def rule_for(module: nn.Module, layer_name: str = "") -> Rule:
    """The ghost rule of ``module``'s type; a one-line ValueError naming the type if none.

    A subclass of a supported type takes its base's rule only if it keeps the base's forward.
    """
    cls = type(module)
    if cls in _RULES:
        return _RULES[cls]
    for base in cls.__mro__:
        if base in _RULES or _is_hf_conv1d(base):
            own = [m for m in _FORWARD_METHODS if getattr(cls, m, None) is not getattr(base, m, None)]
            if own:
                raise unsupported(layer_name, cls.__name__, f"is a {base.__name__} subclass with its own "
                                  f"{own[0]}, which the ghost backend cannot model")
            return _RULES.get(base, _HF_CONV1D)
    raise ValueError(
        f"the ghost backend has no per-example norm rule for layer type {cls.__name__} "
        f"(layer {layer_name!r}; it handles {_SUPPORTED_NAMES}); use backend='vmap'"
    )


class GhostResult(NamedTuple):
    """Output of `GhostClipping.__call__`."""

    total: Tensor  # (p,) sum_i c_i g_i in layout order (c_i = 1 without clipping)
    norms: Tensor  # (B,) pre-clip norms ||g_i|| over all selected parameters
    losses: Tensor  # (B,) per-example losses, detached
    # with sketch=True (a plan set by `GhostClipping.set_sketch`):
    rows: Tensor | None = None  # (B, M) the sketched clipped rows c_i Phi g_i
    factors: Tensor | None = None  # (B,) the clip factors c_i
    param_norms: Tensor | None = None  # (B, parameters) float64 pre-clip norm per parameter


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
            module docstring). ``False`` is an expert switch: it logs a warning naming what
            is then no longer detected (norms can be wrong with no error), and ``check``
            stays readable for the run's metadata. The structural checks of every call are
            not switchable.
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
        self.check = bool(check)
        self._sketch: SketchFactors | None = None
        if not self.check:
            logger.warning("GhostClipping(check=False): the batch-of-one check is off, so %s are no longer "
                           "detected and give wrong per-example norms without an error", _UNCHECKED)
        _arm_probe(self, probe_batch, check)

    # ------------------------------------------------------------------ setup
    def _build_layers(self) -> list[Layer]:
        aliases: dict[int, list[str]] = {}
        for alias, param in self.model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(alias)
        # out_proj of an attention module is applied by the attention's own forward
        attention = {id(m.out_proj): n for n, m in self.model.named_modules()
                     if isinstance(m, nn.MultiheadAttention)}
        specs = {s.name: s for s in self.layout.params}
        layers: dict[str, Layer] = {}
        for name in self.names:
            others = [a for a in aliases[id(self.model.get_parameter(name))] if a != name]
            if others:
                raise ValueError(
                    f"parameter {name!r} is shared with {others[0]!r} (tied weights); the ghost "
                    "backend sees one layer per parameter; use backend='vmap'"
                )
            owner_name, _, attr = name.rpartition(".")
            owner = self.model.get_submodule(owner_name)
            if id(owner) in attention:
                owner_name, attr = attention[id(owner)], "out_proj." + attr
                owner = self.model.get_submodule(owner_name)
            rule = rule_for(owner, owner_name)
            rule.validate(owner, owner_name, attr)
            layer = layers.setdefault(owner_name, Layer(owner_name, owner, rule))
            spec = specs[name]
            layer.params[attr] = (name, spec.offset, spec.stop)
        return list(layers.values())

    # ------------------------------------------------------------------ sketches
    def sketch_kinds(self) -> dict[str, str]:
        """Per selected parameter, the sketch its layer's rule computes (`gradspec.sketch.make_plan`'s ``kinds``)."""
        return {name: layer.rule.sketch_kind(layer.module, attr)
                for layer in self._layers for attr, (name, _, _) in layer.params.items()}

    def set_sketch(self, plan: SketchPlan) -> None:
        """Sketch rows with ``plan`` from now on (``__call__(..., sketch=True)``); its factors
        are drawn once, on the model's device, in the model's dtype.

        Raises:
            ValueError: a plan of other parameters, a plan for formed gradients (version 3 or 4:
                masked), or one with a parameter kind the layer's rule cannot compute (named).
        """
        if plan.signed:
            raise ValueError(f"a version-{plan.version} sketch plan masks each gradient's signs, which ghost clipping "
                             "never forms: make the plan with version=gradspec.sketch.FACTORED_VERSION")
        if plan.names != self.names:
            raise ValueError(f"the sketch plan covers {plan.names[:3]}... but the engine's parameters are "
                             f"{self.names[:3]}...: build the plan from this engine's layout")
        kinds = self.sketch_kinds()
        for spec in plan.params:
            if spec.kind not in ("exact", "dense", kinds[spec.name]):
                raise ValueError(f"parameter {spec.name!r} is planned as {spec.kind!r} but its layer's rule "
                                 f"sketches it as {kinds[spec.name]!r}")
        self._sketch = SketchFactors(plan, dtype=self._dtype(), device=self._device())

    # ------------------------------------------------------------------ public
    def __call__(self, batch: Batch, max_norm: float | None, *, sketch: bool = False) -> GhostResult:
        """Clipped sum, pre-clip norms and losses of ``batch``.

        Args:
            batch: the examples.
            max_norm: the clipping norm C (factors ``C / max(||g_i||, C)``, the trainer's
                formula), or None for the plain sum (no clipping).
            sketch: also return each example's sketched clipped row, its clip factor and its
                pre-clip norm per parameter (`set_sketch` first).
        """
        if sketch and self._sketch is None:
            raise ValueError("GhostClipping(sketch=True) needs a plan: call set_sketch(plan) first")
        if _batch_size(batch) >= 2 and self._unprobed:
            self._probe(batch)
        total = torch.zeros(self.p, dtype=self._dtype(), device=self._device())
        norms, losses, rows, kept_factors, param_norms = [], [], [], [], []

        def each(loss: Tensor, norms2: Tensor, norm: Tensor, factors: Tensor) -> None:
            if sketch:
                out = torch.zeros(loss.shape[0], self._sketch.plan.M, dtype=total.dtype, device=total.device)
                for layer in self._layers:
                    layer.rule.add_sketch(layer, factors, self._sketch, out)
                rows.append(out)
                kept_factors.append(factors)
                param_norms.append(norms2.clamp(min=0).sqrt())
            norms.append(norm)
            losses.append(loss)

        self._clipped_parts(batch, max_norm, total, each)
        if not norms:
            empty = torch.zeros(0, device=total.device)
            if not sketch:
                return GhostResult(total, empty, empty)
            m, k = self._sketch.plan.M, len(self.names)
            return GhostResult(total, empty, empty, torch.zeros(0, m, dtype=total.dtype, device=total.device),
                               empty.double(), torch.zeros(0, k, dtype=torch.float64, device=total.device))
        if not sketch:
            return GhostResult(total, torch.cat(norms), torch.cat(losses))
        return GhostResult(total, torch.cat(norms), torch.cat(losses), torch.cat(rows), torch.cat(kept_factors),
                           torch.cat(param_norms))

    def clipped_energies(self, batch: Batch, max_norm: float | None) -> tuple[Tensor, Tensor, Tensor]:
        """(the clipped sum, each example's squared clipped norm per parameter, (B, parameters)
        float64, and its pre-clip norm, (B,)) of ``batch``, without forming rows: the warm-up
        batch (`gradspec.train._norm_shares.warmup_batch`) of an energy-weighted sketch plan
        (`gradspec.sketch.energy_weights`) and of the run's norm shares."""
        total = torch.zeros(self.p, dtype=self._dtype(), device=self._device())
        energies: list[Tensor] = []
        norms: list[Tensor] = []

        def each(loss: Tensor, norms2: Tensor, norm: Tensor, factors: Tensor) -> None:
            energies.append(norms2.clamp(min=0) * factors.to(norms2.dtype)[:, None] ** 2)
            norms.append(norm)

        self._clipped_parts(batch, max_norm, total, each)
        k = len(self.names)
        if not energies:
            return total, torch.zeros(0, k, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
        return total, torch.cat(energies), torch.cat(norms)

    def _clipped_parts(self, batch: Batch, max_norm: float | None, total: Tensor,
                       each: Callable[[Tensor, Tensor, Tensor, Tensor], None]) -> None:
        """Per microbatch of ``batch``: its clipped sum added to ``total``, then ``each(losses,
        per-parameter squared norms (float64), pre-clip norms, clip factors)`` while the layers'
        captures are held (a sketch reads them); released after it, also when it raises."""
        b = _batch_size(batch)
        step = self.microbatch or max(b, 1)
        for start in range(0, b, step):
            part = {k: v[start : start + step] for k, v in batch.items()}
            loss = self._capture(part)
            try:
                # per-parameter squared norms, summed in float64 (the clip factor's norm)
                norms2 = self._norms2(part_size := loss.shape[0])
                norm = norms2.sum(1).clamp_(min=0).sqrt_()
                factors = (clip_factors(norm, max_norm) if max_norm is not None
                           else torch.ones(part_size, dtype=norm.dtype, device=norm.device))
                self._weighted_sum(factors, out=total)
                each(loss, norms2, norm, factors)
            finally:
                self._release()

    # ------------------------------------------------------------------ one pass
    def _dtype(self) -> torch.dtype:
        return self.model.get_parameter(self.names[0]).dtype

    def _device(self) -> torch.device:
        return self.model.get_parameter(self.names[0]).device

    def _capture(self, batch: Batch) -> Tensor:
        """Forward and backward of one slice; fills each layer's input and output gradient."""
        b = _batch_size(batch)
        anchor = torch.zeros((), dtype=self._dtype(), device=self._device(), requires_grad=True)
        cap = Capture(b, anchor)
        handles = []
        try:
            for layer in self._layers:
                layer.reset()
                handles += layer.rule.install(layer, cap)
            with _modes(self.model, False), torch.enable_grad():
                losses = self.loss(self.forward(self.model, batch), batch)
                if tuple(losses.shape) != (b,):
                    raise ValueError(
                        f"the loss must return one value per example, shape ({b},), got "
                        f"{tuple(losses.shape)}: use reduction='none'"
                    )
                if losses.requires_grad:
                    torch.autograd.grad(losses.sum(), anchor, allow_unused=True)
            for layer in self._layers:
                layer.rule.check_ran(layer)
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
            for h in reversed(handles):
                h.remove()
        return losses.detach()

    def _release(self) -> None:
        for layer in self._layers:
            layer.reset()

    # ------------------------------------------------------------------ the math
    def _norms2(self, b: int) -> Tensor:
        """(B, n_params) float64 squared norms of each example's gradient of each selected
        parameter (columns in ``self.names`` order)."""
        cols: dict[str, Tensor] = {}
        for layer in self._layers:
            for attr, col in layer.rule.norms2(layer, b).items():
                cols[layer.params[attr][0]] = col
        return torch.stack([cols[n] for n in self.names], dim=1)

    def _weighted_sum(self, c: Tensor, *, out: Tensor) -> Tensor:
        """Add ``sum_i c_i g_i`` (layout order) to ``out`` from the captured inputs/gradients."""
        for layer in self._layers:
            layer.rule.add_sum(layer, c, out)
        return out

    # ------------------------------------------------------------------ probe
    def _probe(self, batch: Batch) -> None:
        """Rows and norms of two examples against each example differentiated alone."""
        part = {k: v[:2] for k, v in batch.items()}
        self._capture(part)
        try:
            norms2 = self._norms2(2)
            rows = []
            for i in range(2):
                c = torch.zeros(2, dtype=self._dtype(), device=self._device())
                c[i] = 1
                rows.append(self._weighted_sum(c, out=torch.zeros(self.p, dtype=self._dtype(),
                                                                   device=self._device())))
        finally:
            self._release()
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
        floor = 1e-3 * math.sqrt(sum(float(w.square().sum()) for w in wants))
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
                    "its layer's forward (a functional call or tied weight), the forward mixes "
                    "examples, or a layer's input has the batch in another dimension; use backend='vmap'"
                )
        self._unprobed = False

