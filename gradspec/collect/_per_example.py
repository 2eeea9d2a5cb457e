"""Per-example gradients of the selected parameters, as rows of a matrix.

For a batch of B examples with per-example losses l_i(theta), the row i is
grad_theta l_i, flattened in C order per parameter and concatenated in the
order of ``model.named_parameters()`` (the ``ParamLayout``). Two backends give
the same numbers:

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

References: Abadi et al. 2016 (DP-SGD); Yousefpour et al. 2021 (Opacus).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from gradspec._enums import PerExampleBackend, parse_choice
from gradspec.store._layout import ParamLayout, match_names

logger = logging.getLogger(__name__)

Batch = dict[str, Tensor]
ForwardFn = Callable[[Callable[..., Tensor], Batch], Tensor]
LossFn = Callable[[Tensor, Batch], Tensor]

#: Added to a norm before dividing by it in clipping (as Opacus does).
CLIP_EPS = 1e-6


def select_parameters(model: nn.Module, patterns: str | Sequence[str]) -> list[str]:
    """Names of the parameters matching ``patterns``, in ``named_parameters`` order.

    Args:
        model: the module.
        patterns: shell globs (``*.query.weight``) or ``re:<regex>``, see ``match_names``.

    Returns:
        The matching names (at least one).

    Raises:
        ValueError: when no parameter matches; the message lists some that exist.
    """
    names = [n for n, _ in model.named_parameters()]
    chosen = match_names(names, patterns)
    if not chosen:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        raise ValueError(
            f"no parameter of {type(model).__name__} matches {patterns!r}; "
            f"its parameters are: {shown or '(none)'}"
        )
    return chosen


def layout_for(model: nn.Module, names: Sequence[str]) -> ParamLayout:
    """The layout of ``names`` (ordered as in ``model.named_parameters()``)."""
    return ParamLayout.from_shapes((n, tuple(p.shape)) for n, p in _ordered(model, names))


def _ordered(model: nn.Module, names: Sequence[str]) -> list[tuple[str, nn.Parameter]]:
    wanted = list(names)
    if len(set(wanted)) != len(wanted):
        raise ValueError("parameter names must be unique")
    params = dict(model.named_parameters())
    missing = [n for n in wanted if n not in params]
    if missing:
        raise ValueError(
            f"{type(model).__name__} has no parameter {missing[0]!r}; "
            "pick names with select_parameters(model, patterns)"
        )
    keep = set(wanted)
    return [(n, p) for n, p in params.items() if n in keep]


def additive_attention_mask(attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A (B, T) 0/1 padding mask as the (B, 1, 1, T) additive mask attention layers add.

    Hugging Face models build their mask from a 2D one with data-dependent checks
    (``mask.all()``) that ``vmap`` cannot run; a 4D mask is used as given. Pass
    ``dtype`` = the model's dtype. Same numbers as the 2D mask: 0 where attended,
    ``finfo(dtype).min`` where padded.
    """
    keep = attention_mask[:, None, None, :].to(torch.bool)
    zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


def _batch_size(batch: Batch) -> int:
    if not batch:
        raise ValueError("a batch needs at least one tensor")
    sizes = {k: v.shape[0] for k, v in batch.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"all tensors of a batch need the same first dimension, got {sizes}")
    return next(iter(sizes.values()))


@contextlib.contextmanager
def _modes(model: nn.Module, train: bool, also_train: Sequence[nn.Module] = ()) -> Iterator[None]:
    """Set ``model`` to train/eval (``also_train`` to train) and restore every module's mode."""
    saved = [(m, m.training) for m in model.modules()]
    model.train(train)
    for m in also_train:
        m.training = True  # non-recursive: these own the parameters, not dropout
    try:
        yield
    finally:
        for m, mode in saved:
            m.training = mode


class PerExampleGradients:
    """Per-example gradients of a model's selected parameters.

    Built once per run; each call computes the rows of one batch.

    Args:
        model: the module (not modified: modes, ``requires_grad`` flags and ``.grad``
            are restored after each call).
        forward: ``forward(call, batch) -> outputs`` where ``call`` invokes the model.
        loss: ``loss(outputs, batch) -> (B,)`` per-example losses.
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

    Raises:
        ValueError: unknown backend, bad names, or (``hooks``) a selected parameter in
            a layer Opacus cannot handle.

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
    ) -> None:
        self.backend = parse_choice(PerExampleBackend, backend, "per-example backend")
        if microbatch is not None and microbatch < 1:
            raise ValueError(f"microbatch must be a positive number of examples, got {microbatch}")
        self.model, self.forward, self.loss = model, forward, loss
        self.microbatch, self.dtype, self.train_mode = microbatch, dtype, bool(train_mode)
        self.names = [n for n, _ in _ordered(model, names)]
        self.layout = layout_for(model, self.names)
        self._owners = [model.get_submodule(n.rpartition(".")[0]) for n in self.names]
        if self.backend == PerExampleBackend.HOOKS:
            _check_hooks_support(model, self.names, self._owners)
        else:
            self._grad_fn = torch.func.vmap(
                torch.func.grad_and_value(self._example_loss),
                in_dims=(None, None, 0),
                randomness="different",
            )

    @property
    def p(self) -> int:
        """Columns of a row."""
        return self.layout.p

    # ------------------------------------------------------------------ public
    def __call__(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """Per-example gradients and losses of ``batch``.

        Returns:
            ``(grads, losses)``: grads ``(B, p)`` in layout order, losses ``(B,)`` detached.
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
        step = self.microbatch or max(b, 1)
        for start in range(0, b, step):
            part = {k: v[start : start + step] for k, v in batch.items()}
            if self.backend == PerExampleBackend.HOOKS:
                yield self._hooks(part)
            else:
                yield self._vmap(part)

    def clipped_sum(self, batch: Batch, max_norm: float) -> tuple[Tensor, Tensor, Tensor]:
        """Sum of the clipped per-example gradients, without keeping all rows.

        Each row g_i is scaled by min(1, C / (||g_i|| + 1e-6)) (Abadi et al. 2016; the
        epsilon as in Opacus), then the rows are summed, one microbatch at a time.

        Returns:
            ``(sum (p,), norms (B,), losses (B,))``; norms are before clipping.
        """
        if max_norm <= 0:
            raise ValueError(f"max_norm must be positive, got {max_norm}")
        total, norms, losses = None, [], []
        for grads, loss in self.iter_microbatches(batch):
            norm = torch.linalg.vector_norm(grads, dim=1)
            factor = (max_norm / (norm + CLIP_EPS)).clamp(max=1.0)
            part = factor.to(grads.dtype) @ grads
            total = part if total is None else total.add_(part)
            norms.append(norm)
            losses.append(loss)
        if total is None:  # empty batch
            device = next(iter(batch.values())).device
            dtype = self.dtype or self.model.get_parameter(self.names[0]).dtype
            zeros = torch.zeros(0, device=device)
            return torch.zeros(self.p, dtype=dtype, device=device), zeros, zeros
        return total, torch.cat(norms), torch.cat(losses)

    # ------------------------------------------------------------------ vmap
    def _example_loss(self, params: dict[str, Tensor], consts: dict[str, Tensor], example: Batch):
        batch = {k: v.unsqueeze(0) for k, v in example.items()}

        def call(*args, **kwargs):
            return torch.func.functional_call(self.model, (params, consts), args, kwargs)

        return self.loss(self.forward(call, batch), batch).sum()

    def _vmap(self, batch: Batch) -> tuple[Tensor, Tensor]:
        selected = set(self.names)
        params, consts = {}, {}
        for n, p in self.model.named_parameters():
            (params if n in selected else consts)[n] = p.detach()
        try:
            with _modes(self.model, self.train_mode):
                grads, losses = self._grad_fn(params, consts, batch)
        except RuntimeError as err:
            if "data-dependent control flow" not in str(err):
                raise
            raise ValueError(
                "the model's forward branches on tensor values (e.g. `if mask.all()`), which "
                "vmap cannot run; for Hugging Face models pass a 4D attention mask "
                "(gradspec.collect._per_example.additive_attention_mask), or use backend='hooks'"
            ) from err
        return self._flatten([grads[n] for n in self.names]), losses.detach()

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
    def _hooks(self, batch: Batch) -> tuple[Tensor, Tensor]:
        from opacus import GradSampleModule

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
                _modes(self.model, self.train_mode, self._owners),
                torch.enable_grad(),
                warnings.catch_warnings(),
            ):
                # The first hooked layer's input needs no gradient; its hook still fires (fine).
                warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
                gsm = GradSampleModule(self.model, batch_first=True, loss_reduction="sum")
                losses = self.loss(self.forward(gsm, batch), batch)
                losses.sum().backward()
                grads = [p.grad_sample for p in params]
            if any(not isinstance(g, Tensor) for g in grads):
                raise ValueError(
                    "Opacus returned no single per-example gradient for some selected parameter "
                    "(is it unused, or used in several forward passes?); use backend='vmap'"
                )
            return self._flatten(grads), losses.detach()
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


def _check_hooks_support(model: nn.Module, names: Sequence[str], owners: Sequence[nn.Module]):
    """Raise a ValueError naming the layer when Opacus hooks cannot handle a selected parameter."""
    from opacus import GradSampleModule

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
