"""Per-example gradients of the selected parameters, as rows of a matrix.

For a batch of B examples with per-example losses l_i(theta), the row i is
grad_theta l_i, flattened in C order per parameter and concatenated in the
order of ``model.named_parameters()`` (the ``ParamLayout``). Two backends give
the same numbers (a third, ``ghost``, forms no rows, only their norms and clipped sum:
``gradspec.train._ghost.GhostClipping``):

* ``vmap``: ``torch.func.vmap(torch.func.grad_and_value(f))`` where ``f`` runs
  ``functional_call`` on one example (unsqueezed to a batch of one). Any model
  ``functional_call`` can run works; losses come for free with the gradients.
* ``hooks``: Opacus's ``GradSampleModule`` (module hooks, one backward pass
  over the batch). Only layers Opacus has a grad sampler for are accepted.

Both differentiate only with respect to the named parameters; every other
parameter is a constant. Dropout is off: the model is put in ``eval()`` mode
while gradients are computed and its modes are restored afterwards
(``train_mode=True`` keeps dropout on; see ``PerExampleGradients``).
Models with BatchNorm have no per-example gradients (an example's output
depends on the others) and are not supported.

A wrong "per-example" gradient is the worst failure a DP toolkit can have: a row
that is really a sum over the batch is clipped as if it were one example, so the
sensitivity, and the epsilon reported for the run, are wrong while everything
exits 0. Hence the checks (``PerExampleGradients``):

* always, both backends: one gradient row per example for every selected
  parameter (``(B, *param.shape)``) and one loss per example (``(B,)``), else a
  ``ValueError`` naming the parameter before any row is returned. Opacus's hooks
  return one summed row when a layer's input is shared across the batch (GPT-2's
  ``wpe``, BERT's ``position_embeddings``: their position ids have batch size 1);
* always, ``hooks``: the rows of each parameter add up to its ordinary batch
  gradient (``.grad``), which catches uses of a parameter the hooks do not see;
* once, on the first batch of two or more examples (or at construction, given a
  ``probe_batch``): the rows of two examples equal those of each example
  differentiated alone with ``torch.func.grad`` (a batch-of-one reference).

Hugging Face models need a ready 4D attention mask under ``vmap``; it must keep
the model's own attention pattern (causal + padding for decoders such as GPT-2):
see ``attention_mask_4d`` and ``attention_is_causal`` (in ``gradspec._attention``).

References: Abadi et al. 2016 (DP-SGD); Yousefpour et al. 2021 (Opacus).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from gradspec._enums import PerExampleBackend, parse_choice
from gradspec._modes import _modes
from gradspec.privacy import OPACUS_CLIP_EPS, clip_rows
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

#: Added to a norm before dividing by it in `clipped_sum` (as Opacus does).
CLIP_EPS = OPACUS_CLIP_EPS


class PerExampleGradients(EngineBase):
    """Per-example gradients of a model's selected parameters.

    Built once per run; each call computes the rows of one batch. Every call checks that
    each selected parameter got exactly one row per example and the loss one value per
    example, and raises before returning any row otherwise (see the module docstring);
    once, the rows of two examples are compared with a batch-of-one reference.

    Args:
        model: the module (not modified: modes, ``requires_grad`` flags and ``.grad``
            are restored after each call).
        forward: ``forward(call, batch) -> outputs`` where ``call`` invokes the model.
        loss: ``loss(outputs, batch) -> (B,)`` per-example losses (``reduction="none"``;
            a batch mean is refused, it would scale every row by 1/B under ``hooks``).
        names: the parameters to differentiate (others are constants); rows follow
            ``layout_for(model, names)``, i.e. ``named_parameters`` order.
        backend: ``vmap`` (torch.func) or ``hooks`` (Opacus ``GradSampleModule``).
        microbatch: most examples per vmap/backward call in ``iter_microbatches``
            (bounds memory); None = the whole batch at once.
        dtype: dtype of the rows; None keeps the parameters' dtype (float64 tests).
        train_mode: run the model in train mode (dropout on). Off by default: the model
            is in ``eval()`` during the computation. With ``vmap``, each example then
            draws its own dropout mask (``randomness="different"``), so the numbers
            differ from ``hooks``, which draws one batched mask.
        check: compare, once, the rows of two examples with each example differentiated
            alone (``torch.func.grad``, model in eval mode, no randomness drawn): at
            construction on ``probe_batch`` if given, else on the first batch of two or
            more examples, before any of its rows is returned. The shape checks of every
            call are not switchable.
        probe_batch: a batch (two or more examples, on the model's device) to run that
            comparison on at construction, so that a parameter the backend gets wrong
            (``hooks``: GPT-2's ``transformer.wpe.weight``) is refused before a run starts.

    Raises:
        ValueError: unknown backend, bad names, (``hooks``) a selected parameter in a layer
            Opacus cannot handle, or (with ``probe_batch``) a parameter whose rows are not
            per-example; the message names the parameter.

    Example:
        >>> model = nn.Sequential(nn.Linear(3, 2))
        >>> pe = PerExampleGradients(
        ...     model, lambda call, b: call(b["x"]),
        ...     lambda out, b: nn.functional.cross_entropy(out, b["y"], reduction="none"),
        ...     ["0.weight"])
        >>> rows, losses = pe({"x": torch.randn(4, 3), "y": torch.tensor([0, 1, 0, 1])})
        >>> tuple(rows.shape), tuple(losses.shape)
        ((4, 6), (4,))
    """

    def __init__(
        self,
        model: nn.Module,
        forward: ForwardFn,
        loss: LossFn,
        names: Sequence[str],
        *,
        backend: PerExampleBackend | str = PerExampleBackend.VMAP,
        microbatch: int | None = None,
        dtype: torch.dtype | None = torch.float32,
        train_mode: bool = False,
        check: bool = True,
        probe_batch: Batch | None = None,
    ) -> None:
        self.backend = parse_choice(PerExampleBackend, backend, "per-example backend")
        if self.backend in (PerExampleBackend.GHOST, PerExampleBackend.AUTO):
            raise ValueError(
                f"backend {self.backend.value!r} is the trainer's choice; 'ghost' forms no per-example "
                "rows (only norms and the clipped sum: gradspec.train.GhostClipping); use backend "
                "'vmap' or 'hooks' for rows"
            )
        ordered = self._bind(model, forward, loss, names, microbatch)
        self.dtype, self.train_mode = dtype, bool(train_mode)
        self._shapes = [tuple(p.shape) for _, p in ordered]
        self._owners = [model.get_submodule(n.rpartition(".")[0]) for n in self.names]
        if self.train_mode:
            _check_no_batch_norm(model)
        if self.backend == PerExampleBackend.HOOKS:
            _check_hooks_support(model, self.names, self._owners)
        else:
            self._grad_fn = torch.func.vmap(
                torch.func.grad_and_value(self._example_loss),
                in_dims=(None, None, 0),
                randomness="different",
            )
        _arm_probe(self, probe_batch, check)

    # ------------------------------------------------------------------ public
    def __call__(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """Per-example gradients and losses of ``batch``.

        Returns:
            ``(grads, losses)``: grads ``(B, p)`` in layout order, losses ``(B,)`` detached.

        Raises:
            ValueError: a selected parameter got other than one row per example, or the
                loss other than one value per example (the message names the parameter).
        """
        parts = list(self.iter_microbatches(batch))
        if len(parts) == 1:
            return parts[0]
        if not parts:  # empty batch (Poisson sampling can draw one)
            device = next(iter(batch.values())).device
            dtype = self.dtype or self.model.get_parameter(self.names[0]).dtype
            return torch.zeros(0, self.p, dtype=dtype, device=device), torch.zeros(0, device=device)
        return torch.cat([g for g, _ in parts]), torch.cat([loss for _, loss in parts])

    def iter_microbatches(self, batch: Batch) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield ``(grads, losses)`` for consecutive slices of at most ``microbatch`` examples."""
        b = _batch_size(batch)
        if self._unprobed and b >= 2:
            self._probe(batch)
        step = self.microbatch or max(b, 1)
        for start in range(0, b, step):
            part = {k: v[start : start + step] for k, v in batch.items()}
            grads, losses = self._compute(part, self.train_mode)
            yield self._flatten(grads), losses

    def clipped_sum(self, batch: Batch, max_norm: float) -> tuple[Tensor, Tensor, Tensor]:
        """Sum of the clipped per-example gradients, without keeping all rows.

        Each row g_i is scaled by min(1, C / (||g_i|| + 1e-6)) (Abadi et al. 2016; the
        epsilon as in Opacus: `gradspec.privacy.clip_factors` with ``eps=1e-6``), then the
        rows are summed, one microbatch at a time. The trainer's DP step clips with
        ``eps=0`` instead (the exact ``min(1, C / ||g_i||)``).

        Returns:
            ``(sum (p,), norms (B,), losses (B,))``; norms are before clipping.
        """
        if max_norm <= 0:
            raise ValueError(f"max_norm must be positive, got {max_norm}")
        total, norms, losses = None, [], []
        for grads, loss in self.iter_microbatches(batch):
            clipped, norm, _ = clip_rows(grads, max_norm, eps=CLIP_EPS)  # float64 norms, <= C exactly
            part = clipped.sum(0)
            total = part if total is None else total.add_(part)
            norms.append(norm)
            losses.append(loss)
        if total is None:  # empty batch
            device = next(iter(batch.values())).device
            dtype = self.dtype or self.model.get_parameter(self.names[0]).dtype
            zeros = torch.zeros(0, device=device)
            return torch.zeros(self.p, dtype=dtype, device=device), zeros, zeros
        return total, torch.cat(norms), torch.cat(losses)

    # ------------------------------------------------------------------ checks
    def _compute(self, batch: Batch, train: bool) -> tuple[list[Tensor], Tensor]:
        """Per-parameter gradients ``(B, *shape)`` and losses ``(B,)`` of one slice, checked."""
        b = _batch_size(batch)
        if self.backend == PerExampleBackend.HOOKS:
            return self._hooks(batch, train)  # checks its rows before their sums
        grads, losses = self._vmap(batch, train)
        self._check_rows(grads, b)
        self._check_losses(losses, b)
        return grads, losses

    def _check_rows(self, grads: Sequence[Tensor], b: int) -> None:
        """Raise unless every selected parameter has one gradient row per example."""
        for name, shape, g in zip(self.names, self._shapes, grads, strict=True):
            if tuple(g.shape) == (b, *shape):
                continue
            if self.backend == PerExampleBackend.HOOKS:
                why = (
                    "its layer's input is shared by the whole batch (e.g. position ids of batch "
                    "size 1), so Opacus summed the examples; use backend='vmap', which "
                    "differentiates each example alone"
                )
            else:
                why = "the forward does not keep the examples apart"
            raise ValueError(
                f"per-example gradient of {name!r} from backend {self.backend.value!r} has shape "
                f"{tuple(g.shape)}, not one row per example {(b, *shape)}: {why}"
            )

    def _check_losses(self, losses: Tensor, b: int) -> None:
        if tuple(losses.shape) != (b,):
            raise ValueError(
                f"the loss must return one value per example, shape ({b},), got "
                f"{tuple(losses.shape)}: use reduction='none' (a batch mean would scale every "
                "per-example gradient by 1/B)"
            )

    def _probe(self, batch: Batch) -> None:
        """Compare the rows of two examples with each example differentiated alone.

        The reference is ``torch.func.grad`` of the loss of one example run as a batch of
        one (no ``vmap``, no hooks), the loop Opacus's tests use. Relative tolerance per
        parameter: 1e-7 in float64, 1e-3 in float32, 5e-2 in lower precision.
        """
        part = {k: v[:2] for k, v in batch.items()}
        grads, _ = self._compute(part, train=False)
        params, consts = self._split_params()
        grad_one = torch.func.grad(self._example_loss)
        with _modes(self.model, False):
            refs = [grad_one(params, consts, {k: v[i] for k, v in part.items()}) for i in range(2)]
        # A parameter whose true gradient is ~0 (BERT's key bias: softmax ignores a shift of
        # all scores) is compared against 1e-3 of the whole rows' norm, not its rounding noise.
        floor = 1e-3 * math.sqrt(sum(float(torch.stack([r[n] for r in refs]).double().square().sum())
                                     for n in self.names))
        for name, g in zip(self.names, grads, strict=True):
            want = torch.stack([r[name] for r in refs]).double()
            gap = float(torch.linalg.vector_norm(g.double() - want))
            scale = max(float(torch.linalg.vector_norm(want)), floor)
            if gap > _rtol(g.dtype) * scale:  # False for NaN: non-finite rows are the caller's
                rel = gap / max(scale, 1e-300)
                hint = "; use backend='vmap'" if self.backend == PerExampleBackend.HOOKS else ""
                raise ValueError(
                    f"per-example gradients of {name!r} from backend {self.backend.value!r} differ "
                    f"from each example differentiated alone (relative error {rel:.2g} on 2 "
                    f"examples; does the forward mix examples?){hint}"
                )
        self._unprobed = False

    # ------------------------------------------------------------------ vmap
    def _example_loss(self, params: dict[str, Tensor], consts: dict[str, Tensor], example: Batch):
        batch = {k: v.unsqueeze(0) for k, v in example.items()}

        def call(*args, **kwargs):
            return torch.func.functional_call(self.model, (params, consts), args, kwargs)

        losses = self.loss(self.forward(call, batch), batch)
        self._check_losses(losses, 1)
        return losses.sum()

    def _split_params(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        selected = set(self.names)
        params, consts = {}, {}
        for n, p in self.model.named_parameters():
            (params if n in selected else consts)[n] = p.detach()
        return params, consts

    def _vmap(self, batch: Batch, train: bool) -> tuple[list[Tensor], Tensor]:
        params, consts = self._split_params()
        try:
            with _modes(self.model, train):
                grads, losses = self._grad_fn(params, consts, batch)
        except RuntimeError as err:
            if "data-dependent control flow" not in str(err):
                raise
            raise ValueError(
                "the model's forward branches on tensor values (e.g. `if mask.all()`), which "
                "vmap cannot run; for Hugging Face models pass a ready 4D attention mask that "
                "keeps the model's own masking, gradspec.attention_mask_4d("
                "mask, dtype, causal=attention_is_causal(model)) (decoders such as GPT-2 need "
                "causal=True: a padding-only mask turns them into another model), or use "
                "backend='hooks'"
            ) from err
        return [grads[n] for n in self.names], losses.detach()

    def _flatten(self, grads: Sequence[Tensor]) -> Tensor:
        b = grads[0].shape[0]
        dtype = self.dtype or grads[0].dtype
        out = torch.empty(b, self.p, dtype=dtype, device=grads[0].device)
        if all(g.dtype == dtype for g in grads):
            torch.cat([g.reshape(b, -1) for g in grads], dim=1, out=out)
        else:
            for spec, g in zip(self.layout.params, grads, strict=True):
                out[:, spec.offset : spec.stop].copy_(g.reshape(b, -1))
        return out

    # ------------------------------------------------------------------ hooks
    def _hooks(self, batch: Batch, train: bool) -> tuple[list[Tensor], Tensor]:
        from opacus import GradSampleModule

        b = _batch_size(batch)
        params = [self.model.get_parameter(n) for n in self.names]
        flags = [(p, p.requires_grad) for p in self.model.parameters()]
        saved_grads = [p.grad for p in params]
        gsm = None
        try:
            for p, _ in flags:
                p.requires_grad_(False)
            for p in params:
                p.requires_grad_(True)
                p.grad = None
            with (
                _modes(self.model, train, self._owners),
                torch.enable_grad(),
                warnings.catch_warnings(),
            ):
                # The first hooked layer's input needs no gradient; its hook still fires (fine).
                warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
                gsm = GradSampleModule(self.model, batch_first=True, loss_reduction="sum")
                losses = self.loss(self.forward(gsm, batch), batch)
                self._check_losses(losses, b)
                losses.sum().backward()
                grads = [p.grad_sample for p in params]
                totals = [p.grad for p in params]
            if any(not isinstance(g, Tensor) for g in grads):
                raise ValueError(
                    "Opacus returned no single per-example gradient for some selected parameter "
                    "(is it unused, or used in several forward passes?); use backend='vmap'"
                )
            self._check_rows(grads, b)  # before the sums: one summed row adds up trivially
            self._check_sums(grads, totals)
            return grads, losses.detach()
        finally:
            if gsm is not None:
                gsm.cleanup()
            for m in self._owners:
                for attr in ("activations", "max_batch_len"):
                    if hasattr(m, attr):
                        delattr(m, attr)
            for p, g in zip(params, saved_grads, strict=True):
                p.grad = g
            for p, flag in flags:
                p.requires_grad_(flag)

    def _check_sums(self, grads: Sequence[Tensor], totals: Sequence[Tensor | None]) -> None:
        """Raise unless each parameter's rows add up to its batch gradient ``.grad``.

        Opacus computes a row from the inputs and output gradients of the parameter's own
        layer; a use of the parameter elsewhere (a tied weight applied functionally) reaches
        ``.grad`` but no row. The gap is measured against sum_i ||g_i||, so cancellation
        across examples does not trip it.
        """
        for name, g, total in zip(self.names, grads, totals, strict=True):
            if total is None:
                continue
            gap = float(torch.linalg.vector_norm(g.sum(0) - total))
            scale = float(torch.linalg.vector_norm(g.flatten(1), dim=1).sum())  # no (B, p) copy
            if gap > _rtol(g.dtype) * scale:
                rel = gap / max(scale, 1e-300)
                raise ValueError(
                    f"the hooks backend's per-example gradients of {name!r} do not add up to its "
                    f"batch gradient (relative gap {rel:.2g}): the parameter is also used outside "
                    "its layer's forward, which the hooks do not see; use backend='vmap'"
                )


def _check_no_batch_norm(model: nn.Module) -> None:
    """Raise when ``train_mode`` would run a BatchNorm layer in train mode.

    In train mode BatchNorm normalizes with the statistics of the batch, so each example's
    output, and gradient, depends on the others (and the running statistics move). In eval
    mode it is a fixed affine map, which is why only ``train_mode=True`` is refused.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"train_mode=True would run {type(module).__name__} layer {name!r} on batch "
                "statistics, which couple the examples (no gradient is per-example); use "
                "train_mode=False (it then uses its running statistics)"
            )


def _check_hooks_support(model: nn.Module, names: Sequence[str], owners: Sequence[nn.Module]):
    """Raise a ValueError naming the layer when Opacus hooks cannot handle a selected parameter.

    Refused: layers without an Opacus grad sampler, layers with buffers (BatchNorm), and
    parameters shared by several layers (tied weights, e.g. GPT-2's ``wte`` and
    ``lm_head``), whose rows Opacus cannot combine. Inputs shared across the batch are
    only visible at run time (``PerExampleGradients._check_rows``).
    """
    from opacus import GradSampleModule

    aliases: dict[int, list[str]] = {}
    for alias, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(alias)
    for name in names:
        others = [a for a in aliases[id(model.get_parameter(name))] if a != name]
        if others:
            raise ValueError(
                f"parameter {name!r} is shared with {others[0]!r} (tied weights); the hooks "
                "backend cannot combine its per-example gradients over several layers; use "
                "backend='vmap'"
            )
    for name, owner in zip(names, owners, strict=True):
        kind = type(owner).__name__
        if type(owner) not in GradSampleModule.GRAD_SAMPLERS:
            raise ValueError(
                f"the hooks backend has no per-example gradient rule for layer type {kind} "
                f"(parameter {name!r}); use backend='vmap'"
            )
        if any(True for _ in owner.buffers()):
            raise ValueError(
                f"layer type {kind} (parameter {name!r}) has buffers (e.g. BatchNorm running "
                "statistics); per-example gradients are undefined for it"
            )
