"""Record the clipped gradients of an Opacus ``DPOptimizer`` into a `GradientRecorder`.

An Opacus DP-SGD step (Opacus 1.6, ``DPOptimizer.pre_step``)::

    clip_and_accumulate()    once per physical batch: p.summed_grad += sum_i clip(g_i)
    (skipped step?)          virtual steps (BatchMemoryManager, signal_skip_step) stop here
    add_noise(); scale_grad()    p.grad = (p.summed_grad + noise) / (expected_batch_size * k)
    step_hook(optimizer)     the accountant's hook: one accounting step per real step
    original_optimizer.step()

``record_opacus`` wraps two of these on the optimizer instance, and replaces
nothing: the per-physical-batch method (``clip_and_accumulate``; ``accumulate``
under ghost clipping) is wrapped to check that every parameter has one gradient
row per example, and to note the per-example norms and the batch's size (and, per
example, each clipped gradient g_i * min(1, C / (||g_i|| + 1e-6)) exactly as Opacus
forms it, kept with that factor, ||g_i|| and Opacus's norm of each parameter's part);
the step hook is wrapped so that Opacus's own hook (the accountant) runs first and
then one row is recorded per real step: ``p.summed_grad`` — the clipped sum over
every physical batch of the step, before noise — divided by the
number of examples the step actually had (summed over its physical batches), the
row gradspec's trainer stores (:mod:`gradspec.collect._rows`). That is not the
``expected_batch_size * accumulated_iterations`` Opacus divides the noisy sum by:
under Poisson sampling the two differ by b / (q n). Skipped (virtual) steps record
nothing; a step with no example (an empty Poisson batch) records no row, as in
``collect``, and still counts as a step.

Opacus forms a "per-example" gradient of a layer from the layer's own input; a
layer whose input is shared by the batch (GPT-2's ``wpe``, BERT's position
embeddings: position ids of batch size 1) gets one row summed over the batch, and
Opacus clips and noises that sum as if it were one example. Such a parameter is
refused with a ``ValueError`` naming it (the per-example gradients, and so the
DP guarantee of the Opacus run itself, are wrong for it). Where every trained
parameter is of that kind, only the batch size tells: note the per-example losses
(``recorder.observe_loss(losses)``, shape (B,)) and it is checked against them.

Under Opacus ``DPDDP`` (a ``DistributedDPOptimizer`` on every rank, each clipping its own
examples; rank 0 adds the noise), every rank's recording takes part and rank 0's recorder
writes: each rank's clipped sum is kept after each physical batch (rank > 0's noise step
scales ``summed_grad`` in place before the step hook runs), and at the step hook the sums
and example counts are all-reduced, so the row is the clipped mean over the global batch.

Ghost clipping (``grad_sample_mode="ghost"``, ``DPOptimizerFastGradientClipping``)
never forms per-example gradients: its double backward leaves the clipped sum in
``p.grad``, which ``accumulate`` adds into ``p.summed_grad``; per-step rows work the
same way, per-example rows are refused. Its per-example norms, and the batch's
size, come from the parameters' ``_norm_sample`` (or from the per-example losses of
the ``DPTensorFastGradientClipping`` loss noted with ``observe_loss``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import Tensor

from gradspec.collect._recorder_base import RecorderBase
from gradspec.collect._rows import DIVISOR_ACTUAL, ROW_EXAMPLE, ROW_MEAN, OwnedRows, RowPool

logger = logging.getLogger(__name__)

#: Opacus adds this to a norm before dividing by it (``clip_and_accumulate``).
_OPACUS_EPS = 1e-6


def _find_accountant(hook: Any) -> Any:
    """The Opacus accountant behind a step hook made by ``accountant.get_optimizer_hook_fn``."""
    from opacus.accountants import IAccountant

    owner = getattr(hook, "__self__", None)
    if isinstance(owner, IAccountant):
        return owner
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, IAccountant):
            return value
    return None


def _accounted_steps(accountant: Any) -> int:
    return int(sum(entry[-1] for entry in getattr(accountant, "history", [])))


def _summed_over_batch(name: str, shape: tuple[int, ...], want: tuple[int, ...], why: str = "") -> ValueError:
    return ValueError(
        f"Opacus's per-example gradient (grad_sample) of {name!r} has shape {shape}, not one row per "
        f"example {want}{why}: Opacus sums this parameter's gradient over the batch (its layer's input "
        "is shared by all examples, e.g. position ids of batch size 1), so the per-example gradients, "
        "and thus the DP guarantee of this Opacus run itself, are wrong for it; freeze it "
        "(requires_grad=False) or give its layer one input per example (e.g. position ids expanded "
        "to the batch)"
    )


class OpacusRecording:
    """The link between an Opacus ``DPOptimizer`` and a :class:`GradientRecorder`.

    Made by :func:`record_opacus`; :meth:`detach` (run at the recorder's close)
    restores the optimizer. Attributes: ``steps`` (real steps seen), ``ghost``.
    """

    def __init__(self, optimizer: Any, recorder: RecorderBase, accountant: Any, delta: float | None) -> None:
        from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

        if not isinstance(optimizer, DPOptimizer):
            raise ValueError(
                f"record_opacus needs the optimizer returned by PrivacyEngine.make_private (a DPOptimizer), "
                f"got {type(optimizer).__name__}"
            )
        self.ghost = isinstance(optimizer, DPOptimizerFastGradientClipping)
        base, method = (DPOptimizerFastGradientClipping, "accumulate") if self.ghost else (DPOptimizer, "clip_and_accumulate")
        if getattr(type(optimizer), method) is not getattr(base, method) or not isinstance(optimizer.max_grad_norm, float | int):
            raise ValueError(
                f"record_opacus supports flat clipping (DPOptimizer, DPOptimizerFastGradientClipping); "
                f"{type(optimizer).__name__} clips otherwise"
            )
        if self.ghost and recorder.per_example:
            raise ValueError(
                "ghost clipping never forms per-example gradients: record per-step rows "
                "(per_example=False) or make_private with grad_sample_mode='hooks'"
            )
        if recorder.params is None:
            raise ValueError("record_opacus needs a recorder built from model= or params= (it reads the parameters)")
        position = {id(p): i for i, p in enumerate(optimizer.params)}
        absent = [n for n, p in zip(recorder.names, recorder.params, strict=True) if id(p) not in position]
        if absent:
            raise ValueError(
                f"recorded parameter {absent[0]!r} is not trained by the DPOptimizer; record a subset of "
                "its parameters (params= patterns)"
            )
        if accountant is not None and hasattr(accountant, "accountant"):  # a PrivacyEngine
            accountant = accountant.accountant
        self.accountant = accountant if accountant is not None else _find_accountant(optimizer.step_hook)
        if delta is not None and self.accountant is None:
            raise ValueError("no Opacus accountant found on the optimizer: pass accountant=privacy_engine.accountant")
        if delta is not None and not 0 < delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {delta}")
        self.optimizer, self.recorder, self.delta = optimizer, recorder, delta
        self._positions = [position[id(p)] for p in recorder.params]
        named = {} if recorder.model is None else {id(p): n for n, p in recorder.model.named_parameters()}
        named.update((id(p), n) for n, p in zip(recorder.names, recorder.params, strict=True))
        self._names = [named.get(id(p), f"parameter {i} of the DPOptimizer") for i, p in enumerate(optimizer.params)]
        self._method = method
        self._norms: list[Tensor | None] = []
        self._sizes: list[int] = []  # examples of each physical batch of the current step
        self._loss_mark = 0  # losses noted before this index belong to earlier physical batches
        self._rows: list[Tensor] = []
        self._pool = RowPool()  # the per-example row blocks, reused once the writer has copied them
        self._factors: list[Tensor] = []  # per-example rows: Opacus's clip factors, per-parameter norms
        self._param_norms: list[Tensor] = []
        self._local_sum: Tensor | None = None  # under torch.distributed: this rank's clipped sum so far
        self._shares: dict[str, Any] | None = None  # the first physical batch's norm shares
        self.steps = 0
        # the optimizer's real step index: the accountant's count where it has one (steps taken
        # before the recorder was attached, or by an earlier session whose accountant the loop
        # restored), else one after the store's last step
        self._step = max(recorder.next_step, _accounted_steps(self.accountant) if self.accountant is not None else 0)
        self._chained: Any = None
        self._attached = True
        self._hook = self._on_step  # one bound method, so that it can be recognised on the optimizer
        setattr(optimizer, method, self._on_physical_batch)
        self._ensure_hook()
        recorder.update_config(
            source="opacus", max_grad_norm=float(optimizer.max_grad_norm),
            noise_multiplier=float(optimizer.noise_multiplier), opacus=self._describe(),
            row=ROW_EXAMPLE if recorder.per_example else ROW_MEAN,
            row_divisor=None if recorder.per_example else DIVISOR_ACTUAL,
        )
        recorder.add_close_hook(self._finalize)

    # ------------------------------------------------------------------ wrapped methods
    def _ensure_hook(self) -> None:
        """Chain the optimizer's step hook (again, if it was replaced since)."""
        if self.optimizer.step_hook is not self._hook:
            self._chained = self.optimizer.step_hook
            self.optimizer.attach_step_hook(self._hook)

    def _observed_examples(self) -> int | None:
        """Examples of the per-example losses noted since the last physical batch (None: no such losses)."""
        noted = self.recorder._losses[self._loss_mark :]
        self._loss_mark = len(self.recorder._losses)
        if noted and all(t.numel() > 1 for t in noted):  # one value: a mean loss (or a batch of one)
            return int(sum(t.numel() for t in noted))
        return None

    def _batch_size(self, sizes: list[int], observed: int | None) -> tuple[int, str]:
        """The physical batch's size B (every parameter's rows must number B) and why it is B."""
        b = max(sizes, default=0)
        if observed is None or observed == b:
            return b, ""
        if b == 1:  # one row for each parameter, for a batch of several: all summed over the batch
            return observed, f" ({observed} per-example losses were noted for this batch)"
        raise ValueError(
            f"the losses noted with observe_loss since the last physical batch have {observed} values, "
            f"the per-example gradients {b} rows: note the batch's per-example losses (B,) or its mean loss, "
            "before optimizer.step()"
        )

    def _on_physical_batch(self) -> None:
        opt = self.optimizer
        self._ensure_hook()
        observed = self._observed_examples()
        if self.ghost:
            samples = [getattr(p, "_norm_sample", None) for p in opt.params]
            if any(s is None for s in samples):
                norms = None
                if observed is None:
                    raise ValueError(
                        "the ghost-clipping norms (_norm_sample) of some parameter are missing, so the batch's "
                        "size is unknown: note the loss with recorder.observe_loss(loss) before optimizer.step()"
                    )
                b = observed
            else:
                b, why = self._batch_size([s.numel() for s in samples], observed)
                for name, s in zip(self._names, samples, strict=True):
                    if s.numel() != b:
                        raise _summed_over_batch(name, (s.numel(),), (b,), why or " (its ghost-clipping norms)")
                per_norm = torch.stack([s.reshape(-1) for s in samples], dim=1)
                norms = per_norm.norm(2, dim=1)
                self._first_shares(per_norm, b)
        else:
            grad_samples = opt.grad_samples
            b, why = self._batch_size([len(g) if g.dim() else 1 for g in grad_samples], observed)
            for name, p, g in zip(self._names, opt.params, grad_samples, strict=True):
                if tuple(g.shape) != (b, *p.shape):
                    raise _summed_over_batch(name, tuple(g.shape), (b, *p.shape), why)
            per_param: list[Tensor] = []
            if b == 0:
                norms = torch.zeros(0, device=grad_samples[0].device)
            else:  # the flat norm of each example over every parameter, as Opacus computes it
                per_param = [g.reshape(b, -1).norm(2, dim=-1) for g in grad_samples]
                stacked = torch.stack([x.to(per_param[0].device) for x in per_param], dim=1)
                norms = stacked.norm(2, dim=1)
                self._first_shares(stacked, b)
            if self.recorder.per_example and b:  # an empty Poisson batch has no rows
                factor = (opt.max_grad_norm / (norms + _OPACUS_EPS)).clamp(max=1.0)
                self._rows.append(self._clipped_rows(grad_samples, factor, b))
                # kept beside each row: the factor Opacus applied, the recorded parameters' own norms
                self._factors.append(factor.detach().to("cpu", torch.float64))
                mine = [per_param[i].to("cpu", torch.float64) for i in self._positions] if b else []
                self._param_norms.append(torch.stack(mine, dim=1) if b else torch.zeros(0, len(self._positions)))
        self._sizes.append(b)
        self._norms.append(None if norms is None else norms.detach().to("cpu", torch.float64))
        getattr(type(opt), self._method)(opt)
        if self.recorder.ranks.active and not self.recorder.per_example:
            # DPDDP: rank > 0's noise step makes p.grad a view of p.summed_grad and scales it in
            # place before the step hook runs, so the clipped sum so far is kept here
            self._local_sum = torch.cat([opt.params[i].summed_grad.detach().reshape(-1).to(torch.float64)
                                         for i in self._positions])

    def _first_shares(self, per_param: Tensor, b: int) -> None:
        """The norm shares (`gradspec.train.clipped_norm_shares`) of the first physical batch
        with examples, over every parameter the optimizer clips; logged on the writer."""
        if self._shares is not None or b == 0:
            return
        from gradspec._layout import ParamLayout
        from gradspec.train import clipped_norm_shares

        layout = ParamLayout.from_shapes(zip(self._names, (tuple(p.shape) for p in self.optimizer.params),
                                             strict=True))
        self._shares = clipped_norm_shares(layout, per_param, float(self.optimizer.max_grad_norm), eps=_OPACUS_EPS,
                                           log=self.recorder.ranks.is_writer)

    def _clipped_rows(self, grad_samples: list[Tensor], factor: Tensor, b: int) -> Tensor:
        """The physical batch's clipped rows (b, p), float32 on the CPU: each recorded parameter's
        ``factor * grad_sample`` (in the parameter's dtype, as Opacus forms it) written straight
        into its columns, one pass and no concatenation."""
        params, rows = self.optimizer.params, self._pool.take(b, self.recorder.layout.p)
        for i, spec in zip(self._positions, self.recorder.layout.params, strict=True):
            g = grad_samples[i].to(params[i].dtype).reshape(b, -1)
            f = factor.to(g.device, g.dtype)[:, None]
            if g.dtype == torch.float32 and g.device.type == "cpu":
                torch.mul(f, g, out=rows[:, spec.offset : spec.stop])
            else:
                rows[:, spec.offset : spec.stop].copy_(f * g)  # to the CPU and float32 in one copy
        return rows

    def _on_step(self, optimizer: Any) -> None:
        if self._chained is not None:
            self._chained(optimizer)  # Opacus's own hook (the accountant) first
        self._record()

    def _record(self) -> None:
        opt, rec = self.optimizer, self.recorder
        step, self._step = self._step, self._step + 1
        self.steps += 1
        known = bool(self._norms) and all(x is not None for x in self._norms)
        norms = torch.cat(self._norms) if known else None
        b = sum(self._sizes)  # the examples of the logical batch, over its virtual steps
        self._norms.clear()
        self._sizes.clear()
        self._loss_mark = 0  # the noted losses are taken below
        c = float(opt.max_grad_norm)
        if rec.per_example:
            release = None
            if len(self._rows) == 1:  # the pooled block itself, back in the pool once written
                rows = self._rows[0]
                release = self._pool.releaser(rows)
            elif self._rows:  # virtual steps: one block of all, and the pieces back in the pool now
                rows = torch.cat(self._rows)
                for piece in self._rows:
                    self._pool.give(piece)
            else:
                rows = torch.zeros(0, rec.layout.p)
            factors = torch.cat(self._factors) if self._factors else None
            per_param = torch.cat(self._param_norms) if self._param_norms else None
            self._rows.clear()
            self._factors.clear()
            self._param_norms.clear()
            rec.record_examples(grads=OwnedRows(rows, release), step=step, norms=norms, max_grad_norm=c, clip_factors=factors,
                                param_norms=per_param)
            return
        examples = self._global_examples(b, step) if rec.ranks.active else None
        if (b if examples is None else examples[1]) == 0:  # an empty Poisson batch: no row (as in
            rec._take_losses(0)  # gradspec's trainer), the step still counts
            return
        if examples is not None:  # DPDDP: every rank's clipped sum over the global batch; record_step
            total, count = examples  # makes batch_size the global one and gathers the norms
            rec.record_step(grad=total / count, step=step, norms=norms, max_grad_norm=c, batch_size=b)
            return
        params = opt.params
        total = torch.cat([params[i].summed_grad.reshape(-1).to(torch.float32) for i in self._positions])
        rec.record_step(grad=total / b, step=step, norms=norms, max_grad_norm=c, batch_size=b)

    def _global_examples(self, b: int, step: int) -> tuple[Tensor, int]:
        """Under torch.distributed (Opacus ``DPDDP``, whose step hook runs before it all-reduces
        the noisy gradients): the clipped sum (before noise) and the example count of every
        rank's share of the step, summed over the ranks (in float64)."""
        total, self._local_sum = self._local_sum, None
        if total is None:  # no physical batch on this rank
            total = torch.zeros(self.recorder.layout.p, dtype=torch.float64, device=self.recorder.params[0].device)
        local = torch.cat([total, torch.tensor([float(b)], dtype=torch.float64, device=total.device)])
        both = self.recorder.ranks.sum_(local, what=f"the clipped sums of step {step}")
        return both[:-1].to(torch.float32), int(round(float(both[-1])))

    # ------------------------------------------------------------------ end
    def _describe(self) -> dict[str, Any]:
        opt = self.optimizer
        return {
            "optimizer": type(opt).__name__,
            "inner_optimizer": type(opt.original_optimizer).__name__,
            "grad_sample_mode": "ghost" if self.ghost else "per-sample",
            "expected_batch_size": opt.expected_batch_size,
            "loss_reduction": opt.loss_reduction,
            "accountant": None if self.accountant is None else self.accountant.mechanism(),
            # what Opacus divides the noisy sum by (the rows are divided by the actual batch size)
            "update_divisor": "expected_batch_size * accumulated_iterations"
            if opt.loss_reduction == "mean" else None,
        }

    def detach(self) -> None:
        """Restore the optimizer's own methods and step hook (rows stop being recorded)."""
        if not self._attached:
            return
        self._attached = False
        self.optimizer.__dict__.pop(self._method, None)
        if self.optimizer.step_hook is self._hook:
            self.optimizer.step_hook = self._chained

    def _finalize(self) -> dict[str, Any]:
        self.detach()
        items: dict[str, Any] = {"opacus": {**self._describe(), "real_steps": self.steps}}
        if self._shares is not None:
            items["norm_shares"] = self._shares
        acc = self.accountant
        if acc is None:
            return items
        history = getattr(acc, "history", [])
        items.update(accountant=acc.mechanism(), steps=_accounted_steps(acc))
        if history:
            items["sample_rate"] = float(history[-1][1])
        if self.delta is not None and items["steps"] < self._step:
            # a resumed store whose loop started a fresh accountant: its epsilon leaves out the
            # earlier sessions' steps (found by review: 10 rows, epsilon of 5 steps, 4.569 for 5.984)
            logger.warning("the Opacus accountant counted %d steps, the store's rows run to step %d: no final epsilon "
                           "is recorded (restore the accountant's state when you resume: "
                           "privacy_engine.accountant.load_state_dict(...))", items["steps"], self._step)
            items.update(delta=float(self.delta), final_epsilon=None,
                         epsilon_note=f"the accountant counted {items['steps']} of {self._step} steps")
        elif self.delta is not None:
            eps = float(acc.get_epsilon(delta=self.delta)) if history else 0.0
            items.update(delta=float(self.delta), final_epsilon=eps if math.isfinite(eps) else str(eps))
        return items


def record_opacus(
    optimizer: Any,
    *,
    recorder: RecorderBase,
    accountant: Any = None,
    delta: float | None = None,
) -> OpacusRecording:
    """Record each real step of an Opacus ``DPOptimizer`` into ``recorder``.

    Per-step recorders get ``sum_i clip(g_i) / b`` (before noise; b the examples the
    step actually had), once per real step, however many physical batches (virtual
    steps) it took, and no row for a step with no example — the rows of gradspec's
    trainer; per-example recorders get each clipped ``g_i``. Opacus's own step hook
    (its accountant) is chained, not replaced. Works with Poisson sampling, with
    ``BatchMemoryManager`` and with ghost clipping (per-step rows only).

    Set ``recorder.epoch`` from your loop; give losses with ``recorder.observe_loss``
    (per-example losses of the recorded examples are stored per example, and the
    per-example gradients are checked to number as many). Dataset
    indices are unknown to the optimizer: per-example rows store ``example_index`` -1.

    Args:
        optimizer: the ``DPOptimizer`` from ``PrivacyEngine.make_private``.
        recorder: a recorder built with the same model (or its parameters).
        accountant: the Opacus accountant (or the ``PrivacyEngine``); default: the
            one whose hook ``make_private`` attached to the optimizer.
        delta: with it, the accountant's epsilon at this delta is written to the
            run config at close (``final_epsilon``), with its type and step count.

    Returns:
        An :class:`OpacusRecording` (``detach()`` stops recording).

    Raises:
        ValueError: not a flat-clipping ``DPOptimizer``, a recorded parameter the
            optimizer does not train, per-example rows under ghost clipping, a
            ``delta`` with no accountant; at ``optimizer.step()``, a trained
            parameter whose Opacus per-example gradient is summed over the batch.

    Example:
        >>> model, optimizer, loader = PrivacyEngine().make_private(...)  # doctest: +SKIP
        >>> with GradientRecorder(out="runs/dp", model=model) as recorder:  # doctest: +SKIP
        ...     recorder.attach_opacus(optimizer, delta=1e-5)
        ...     for x, y in loader:
        ...         loss = criterion(model(x), y)
        ...         loss.backward(); optimizer.step(); optimizer.zero_grad()
    """
    return OpacusRecording(optimizer, recorder, accountant, delta)
