"""`GradientRecorderCallback`: record gradients from a Hugging Face ``Trainer``.

Where a step's gradient is visible to a callback (transformers 5,
``Trainer._inner_training_loop``)::

    on_step_begin
    training_step(model, inputs) x gradient_accumulation_steps   forward + backward
    _clip_grad_norm (when args.max_grad_norm > 0)
    on_pre_optimizer_step    <- p.grad is the step's averaged gradient: recorded here
    optimizer.step(); on_optimizer_step; zero_grad; global_step += 1; on_step_end

A callback is never handed the batch. It sees it anyway through a forward hook
(``register_forward_hook(..., with_kwargs=True)``) on the model, which keeps the
keyword inputs (and the loss) of each forward pass made in train mode with
gradients on — the passes of ``training_step`` — between ``on_step_begin`` and
``on_pre_optimizer_step``. Per-example rows are then computed on those batches
by gradspec's engine (:class:`~gradspec.train.PerExampleGradients`) at the
step's weights, before the optimizer moves them. Supported: models called with
keyword inputs (the Trainer's ``model(**inputs)``); the default per-example loss
needs ``labels`` among those inputs (not popped by label smoothing or
``compute_loss_func``), else pass ``loss=``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import TrainerCallback

from gradspec._norms import row_norms64
from gradspec.collect._recorder import GradientRecorder
from gradspec.collect._rows import ROW_EXAMPLE, ROW_EXAMPLE_UNCLIPPED

#: ``row`` of the callback's per-step rows: not gradspec's mean clipped gradient (no
#: per-example clipping), and divided as the Trainer's loss is normalised.
ROW_HF_STEP = (
    "gradient the optimizer receives (the Trainer's loss normalisation; after its "
    "global-norm clipping when max_grad_norm > 0; no per-example clipping)"
)
#: ``row_divisor`` of the callback's per-step rows.
DIVISOR_HF = (
    "the Trainer's loss normalisation, not necessarily the batch's example count: under gradient "
    "accumulation a model that ignores num_items_in_batch (e.g. BERT's classifier) gives the sum of "
    "the micro-batches' mean gradients; under torchrun (average_tokens_across_devices, the default) the "
    "Trainer also multiplies such a model's loss by the number of processes before DDP averages the gradients"
)

logger = logging.getLogger(__name__)

_LABEL_KEYS = ("labels", "label", "label_ids")


class _HFForward:
    """``forward(call, batch)`` of a Hugging Face model on the captured inputs: the logits.

    The 2D padding mask is made the 4D additive mask ``vmap`` needs, keeping the
    model's own (causal or bidirectional) attention pattern.
    """

    def __init__(self, model: nn.Module) -> None:
        from gradspec._attention import attention_is_causal

        self.model = model
        self.causal = attention_is_causal(model)

    def __call__(self, call: Callable[..., Any], batch: dict[str, Tensor]) -> Tensor:
        from gradspec._attention import attention_mask_4d

        inputs = {k: v for k, v in batch.items() if k not in _LABEL_KEYS}
        mask = inputs.get("attention_mask")
        if mask is not None and mask.dim() == 2:
            inputs["attention_mask"] = attention_mask_4d(mask, self.model.dtype, causal=self.causal)
        out = call(**inputs)
        return out.logits if hasattr(out, "logits") else out[0]


def sequence_classification_loss(logits: Tensor, batch: dict[str, Tensor]) -> Tensor:
    """Per-example loss of a sequence classifier, as its Hugging Face model computes it.

    Cross-entropy for integer labels; squared error for one float output (regression).
    """
    labels = next((batch[k] for k in _LABEL_KEYS if k in batch), None)
    if labels is None:
        raise ValueError(
            "per-example losses need the labels among the model's inputs (label smoothing and "
            "compute_loss_func take them out); pass loss= to GradientRecorderCallback"
        )
    if logits.dim() == 2 and labels.dim() == 1 and not labels.is_floating_point():
        return nn.functional.cross_entropy(logits, labels, reduction="none")
    if logits.dim() == 2 and logits.shape[1] == 1 and labels.is_floating_point():
        return (logits[:, 0] - labels.to(logits.dtype)) ** 2
    raise ValueError(
        f"the default per-example loss covers sequence classification (logits (B, C)); got logits "
        f"{tuple(logits.shape)} and labels {tuple(labels.shape)}: pass loss=(outputs, batch) -> (B,)"
    )


class GradientRecorderCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that records each step's gradients.

    Per-step rows (default): the gradient of the selected parameters after
    backward and before the optimizer step — the batch's average gradient (over
    all gradient-accumulation micro-batches), as the optimizer receives it: when
    ``TrainingArguments.max_grad_norm > 0`` (the default, 1.0) that is after the
    Trainer's global-norm clipping; set ``max_grad_norm=0`` to record it unclipped.
    Per-example rows (``per_example=True``): each example's gradient at the step's
    weights, by gradspec's per-example engine (dropout off), optionally clipped to
    ``max_grad_norm``. Rows are committed whenever the Trainer saves a checkpoint.

    Under ``torchrun`` every rank's callback builds a recorder (``out=``) and rank 0's alone
    writes (see ``GradientRecorder(distributed=...)``): the row is the gradient DDP has
    averaged, its ``batch_size`` the examples of every rank. Per-step rows only.

    Args:
        out: run directory of a recorder built at ``on_train_begin`` from the
            Trainer's model (closed at ``on_train_end``).
        recorder: a ready :class:`GradientRecorder` instead (left open at the end:
            close it yourself).
        params: name patterns of the recorded parameters (default: all trainable).
        per_example: record per-example rows.
        every: record every ``every``-th optimizer step.
        resume: continue the store in ``out`` (with ``trainer.train(resume_from_checkpoint=...)``;
            rows of steps the Trainer redoes are dropped first).
        overwrite: replace the store in ``out``.
        forward: per-example mode: ``forward(call, batch) -> outputs`` (default: the
            model's logits on the captured inputs, with a 4D attention mask).
        loss: per-example mode: ``loss(outputs, batch) -> (B,)`` (default:
            :func:`sequence_classification_loss`).
        backend: per-example backend, ``vmap`` | ``hooks``.
        microbatch: most examples per per-example call (bounds memory).
        max_grad_norm: per-example mode: clip each row to this norm (None: unclipped).
        config: your run config, saved in the store.
        sketch: store each per-step row as its M-column sketch (``GradientRecorder(sketch=)``),
            with ``sketch_seed``, ``sketch_blocks`` and ``sketch_weights``.

    Example:
        >>> callback = GradientRecorderCallback(out="runs/hf", params="*attention*")  # doctest: +SKIP
        >>> Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        out: str | Path | None = None,
        recorder: GradientRecorder | None = None,
        params: str | Sequence[str] | None = None,
        per_example: bool = False,
        every: int = 1,
        resume: bool = False,
        overwrite: bool = False,
        forward: Callable[[Callable[..., Any], dict[str, Tensor]], Any] | None = None,
        loss: Callable[[Any, dict[str, Tensor]], Tensor] | None = None,
        backend: str = "vmap",
        microbatch: int | None = None,
        max_grad_norm: float | None = None,
        config: dict[str, Any] | None = None,
        sketch: int | None = None,
        sketch_seed: int = 0,
        sketch_blocks: int = 8,
        sketch_weights: str = "energy",
    ) -> None:
        if (out is None) == (recorder is None):
            raise ValueError("pass out= (a recorder is built from the Trainer's model) or recorder=, not both")
        if recorder is not None and sketch is not None:
            raise ValueError("sketch= sets up the recorder built from out=: give it to your GradientRecorder instead")
        if every < 1:
            raise ValueError(f"every must be a positive number of steps, got {every}")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive or None, got {max_grad_norm}")
        self.recorder = recorder
        self._owned = recorder is None
        self._recorder_args = {
            "out": out, "params": params, "per_example": per_example, "resume": resume,
            "overwrite": overwrite, "config": config, "max_grad_norm": max_grad_norm,
            "sketch": sketch, "sketch_seed": sketch_seed, "sketch_blocks": sketch_blocks,
            "sketch_weights": sketch_weights,
        }
        self.every, self.max_grad_norm = int(every), max_grad_norm
        self._forward, self._loss, self._backend, self._microbatch = forward, loss, backend, microbatch
        self._engine: Any = None
        self._handle: Any = None
        self._batches: list[dict[str, Tensor]] = []
        self._losses: list[Tensor] = []
        self._busy = False

    # ------------------------------------------------------------------ capture
    def _capture(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        if self._busy or not module.training or not torch.is_grad_enabled():
            return
        tensors = {k: v.detach() for k, v in kwargs.items() if isinstance(v, Tensor) and v.dim() >= 1}
        if not tensors:
            return
        lead = tensors["input_ids"].shape[0] if "input_ids" in tensors else next(iter(tensors.values())).shape[0]
        self._batches.append({k: v for k, v in tensors.items() if v.shape[0] == lead})
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, Tensor):
            self._losses.append(loss.detach().float().mean().cpu())

    # ------------------------------------------------------------------ events
    def _failing(self, event: Callable[[], Any]) -> Any:
        """Run an event; on any error, mark the store failed and release its lock (a refusal
        must not leave a store marked "writing" and locked until the process exits)."""
        try:
            return event()
        except BaseException as exc:
            if self.recorder is not None and self._owned:
                self.recorder.fail(exc)
            if self._handle is not None:
                self._handle.remove()
                self._handle = None
            raise

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        return self._failing(lambda: self._train_begin(args, state, model))

    def _train_begin(self, args, state, model):
        if model is None:
            raise ValueError("GradientRecorderCallback needs the Trainer's model (on_train_begin got none)")
        if self.recorder is None:
            self.recorder = GradientRecorder(model=model, **self._recorder_args)
        rec = self.recorder
        mine = {id(p) for p in model.parameters()}
        if rec.params is None or any(id(p) not in mine for p in rec.params):
            raise ValueError("the recorder's parameters are not the Trainer model's: build it with model=trainer.model")
        if state.global_step and rec.next_step > state.global_step:
            kept = rec.rewind(state.global_step)
            logger.info("resumed at step %d: kept %d recorded rows", state.global_step, kept)
        if rec.per_example:
            row, divisor = (ROW_EXAMPLE if self.max_grad_norm is not None else ROW_EXAMPLE_UNCLIPPED), None
        else:
            row, divisor = ROW_HF_STEP, DIVISOR_HF
        rec.update_config(
            source="hf-trainer", row=row, row_divisor=divisor,
            hf={
                "model": type(model).__name__, "per_device_train_batch_size": args.per_device_train_batch_size,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "trainer_max_grad_norm": args.max_grad_norm, "learning_rate": args.learning_rate,
                "optim": str(args.optim), "seed": args.seed, "every": self.every,
                "row": "per-example gradient (eval mode)" if rec.per_example else
                "averaged gradient at on_pre_optimizer_step (after the Trainer's clipping, if any)",
            },
        )
        if rec.per_example and self._engine is None:  # refuse what can be refused before training
            self._engine = self._make_engine(model)
        if self._handle is None:
            self._handle = model.register_forward_hook(self._capture, with_kwargs=True)

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.epoch = math.floor((state.epoch or 0.0) + 1e-9)

    def on_step_begin(self, args, state, control, **kwargs):
        self._batches.clear()
        self._losses.clear()

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        return self._failing(lambda: self._pre_optimizer_step(state, model))

    def _pre_optimizer_step(self, state, model):
        step = state.global_step
        batches, losses = list(self._batches), list(self._losses)
        self._batches.clear()
        self._losses.clear()
        if step % self.every:
            return
        rec = self.recorder
        n = sum(next(iter(b.values())).shape[0] for b in batches)
        loss = float(torch.stack(losses).mean()) if losses else None
        if not rec.per_example:
            rec.record_step(step=step, loss=loss, batch_size=n)
            return
        if not batches:
            raise ValueError(
                f"no batch of step {step} was seen: per-example rows need the model called with "
                "keyword inputs (the Trainer's model(**inputs)) in train mode"
            )
        rows, example_losses, norms, factors, per_param = self._per_example(model, batches)
        rec.record_examples(grads=rows, step=step, loss=example_losses, norms=norms, batch_size=n,
                            clip_factors=factors, param_norms=per_param)

    def _per_example(self, model: nn.Module, batches: list[dict[str, Tensor]]) -> tuple[Tensor, ...]:
        """Rows, losses, pre-clip norms, clip factors and pre-clip norms per parameter."""
        from gradspec.privacy import clip_rows, per_parameter_norms

        if self._engine is None:
            self._engine = self._make_engine(model)
        spans = [(s.offset, s.stop) for s in self.recorder.layout.params]
        rows, losses, norms, factors, per_param = [], [], [], [], []
        self._busy = True
        try:
            for batch in batches:
                g, loss = self._engine(batch)
                per_param.append(per_parameter_norms(g.detach(), spans).cpu())
                if self.max_grad_norm is not None:  # float64 norms, rows <= C exactly
                    g, norm, factor = clip_rows(g, self.max_grad_norm)
                else:
                    norm = row_norms64(g)
                    factor = torch.ones_like(norm)
                rows.append(g.detach())
                losses.append(loss)
                norms.append(norm)
                factors.append(factor)
        finally:
            self._busy = False
        return tuple(torch.cat(x) for x in (rows, losses, norms, factors, per_param))

    def _make_engine(self, model: nn.Module) -> Any:
        from gradspec.train import PerExampleGradients

        return PerExampleGradients(
            model, self._forward or _HFForward(model), self._loss or sequence_classification_loss,
            self.recorder.names, backend=self._backend, microbatch=self._microbatch,
        )

    def on_save(self, args, state, control, **kwargs):
        if self.recorder is not None and not self.recorder.closed:
            self.recorder.commit(wait=True)  # the checkpoint never gets ahead of the rows

    def on_train_end(self, args, state, control, **kwargs):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self.recorder is None or self.recorder.closed:
            return
        if self._owned:
            self.recorder.close()
        else:
            self.recorder.commit(wait=True)
