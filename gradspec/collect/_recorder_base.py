"""The recorder's core: gradient rows from any training loop into a gradient store.

gradspec's own trainer (``collect``) is one source of rows; a recorder takes them from anything
else — a plain PyTorch loop, an Opacus ``DPOptimizer`` (``attach_opacus``), a Hugging Face
``Trainer`` (``GradientRecorderCallback``). It owns what a store needs: the layout of a row (names
and shapes of the recorded parameters), the run config, the per-row metadata of ``collect``
(``step, epoch, loss, batch_size, norm_mean, norm_max, frac_clipped``, and ``example_index`` for
per-example rows), the background writer, crash-safe commits (a row counts once its bytes are on
disk), resumption and the ``complete`` status.

Rows mean what they mean in ``collect`` (the convention is :mod:`gradspec.collect._rows`'s):
the norm statistics of a row are those of the step's per-example gradients before clipping (NaN
when the source does not know them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from gradspec._finite import all_finite
from gradspec._norms import row_norms64
from gradspec.collect._cadence import CommitCadence
from gradspec.collect._recorder_ranks import NoWriter, recorder_ranks, step_over_ranks
from gradspec.collect._recorder_setup import (
    STORE_NAME,
    _acquire_run_lock,
    _release_run_lock,
    open_store,
    resolve_layout,
    unwrap_model,
)
from gradspec.collect._recorder_sketch import open_sketched_store, recorder_sketch, settle_plan
from gradspec.collect._rows import (
    Grad,
    OwnedRows,
    example_columns,
    example_norms,
    example_rows_per_chunk,
    flat_rows,
    floats,
    run_config,
    step_meta,
    stored_rows,
)
from gradspec.store import BackgroundWriter, GradientStore, ParamLayout

logger = logging.getLogger(__name__)

class RecorderBase:
    """Everything a recorder does but attach to a particular library: the store, rows,
    commits and lifecycle. :class:`gradspec.collect.GradientRecorder` (the public class)
    adds the Opacus convenience; adapters (``record_opacus``, the Hugging Face callback)
    build on this class, so the arrows between them point one way.
    """

    def __init__(
        self,
        *,
        out: str | Path,
        model: nn.Module | None = None,
        params: str | Sequence[str] | Mapping[str, Tensor] | None = None,
        layout: ParamLayout | None = None,
        per_example: bool = False,
        max_grad_norm: float | None = None,
        config: Mapping[str, Any] | None = None,
        dtype: str | None = None,
        compressor: str | None = None,
        resume: bool = False,
        overwrite: bool = False,
        commit_every: int = 32,
        commit_seconds: float = 1.0,
        skip_nonfinite: bool = False,
        background: bool = True,
        max_queue: int = 64,
        store: GradientStore | None = None,
        distributed: bool | None = None,
        sketch: int | None = None, sketch_seed: int = 0, sketch_blocks: int = 8, sketch_weights: str = "energy",
    ) -> None:
        cadence = CommitCadence(commit_every, commit_seconds)  # its arguments checked first
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive (or None for unclipped rows), got {max_grad_norm}")
        if resume and overwrite:
            raise ValueError("pass resume=True or overwrite=True, not both")
        self.names, self.params, self.layout = resolve_layout(model, params, layout)
        #: The recorded module (Opacus wrappers seen through); None when built from params or layout.
        self.model = None if model is None else unwrap_model(model)
        self.per_example = bool(per_example)
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.skip_nonfinite = bool(skip_nonfinite)
        #: When rows are committed without a call to :meth:`commit`.
        self.cadence = cadence
        self.out = Path(out)
        self.path = self.out / STORE_NAME
        self._background, self._max_queue = bool(background), int(max_queue)
        #: This process's place under torch.distributed (one process without a process group).
        self.ranks = recorder_ranks(distributed, per_example=self.per_example)
        #: The sketch plan of a ``sketch=M`` recorder (None: rows stored whole), made from the first
        #: row with ``sketch_weights="energy"``, the store's on a resume (`_recorder_sketch`).
        self.plan = recorder_sketch(self, sketch, seed=sketch_seed, blocks=sketch_blocks, weights=sketch_weights,
                                    store=store)
        self._sketch: Any = None  # the writer's DenseSketch of the plan
        self._pending: dict[str, Any] | None = None  # open_store's arguments, until the first row
        self._plan_from_row = self.plan is not None and sketch_weights == "energy" and not resume
        self._lock = None
        if store is not None:  # the caller's store, under the caller's lock
            self.store: GradientStore | None = store
        elif not self.ranks.is_writer:  # another rank of a distributed loop: rank 0 writes
            self.store = None
        else:
            self._lock = _acquire_run_lock(self.out)
            try:
                args = {"per_example": self.per_example, "run_config": self._run_config(config), "user_config": config,
                        "dtype": dtype, "compressor": compressor, "resume": resume, "overwrite": overwrite,
                        "rows_per_chunk": example_rows_per_chunk(self.layout.p) if per_example else None}
                self.store = (open_store(self.out, layout=self.layout, **args) if self.plan is None
                              else open_sketched_store(self, args))
            except BaseException:
                _release_run_lock(self._lock)
                raise
        meta = self.store.row_meta(slice(self.store.n_rows - 1, None)) if self.store and self.store.n_rows else None
        # a resumed store: one after its last row's step, or after the last step its recorder saw
        # (an empty step has no row; found by review: a resumed recorder reused its number)
        seen = int((self.store.config if self.store else {}).get("next_step") or 0) - 1
        self._last_step = max(int(meta["step"][-1]) if meta else -1, seen)
        #: The epoch written with rows that do not name one (set it from your loop).
        self.epoch = int(meta["epoch"][-1]) if meta else 0
        self._writer = self._new_writer()
        #: Calls whose rows were dropped as non-finite (``skip_nonfinite``).
        self.steps_skipped = 0
        self._losses: list[Tensor] = []
        self._on_close: list[Callable[[], Mapping[str, Any] | None]] = []
        self._closed = False

    @classmethod
    def for_trainer(cls, store: GradientStore, *, max_queue: int = 64, background: bool = True) -> RecorderBase:
        """The recorder of a gradspec trainer run (a :class:`gradspec.train.RowSink`).

        The trainer creates the run's store (or opens it on a resume and rolls it back to
        its checkpoint) under the run directory's lock, computes each row and its metadata
        (:meth:`put_rows`), and commits at its checkpoints (:meth:`commit` with a callback
        that saves the checkpoint once the rows it names are durable). The recorder writes
        them, commits, and marks the store complete at :meth:`close`.
        """
        run = store.config.get("collect") or {}
        clip = run.get("max_grad_norm") if run.get("clip", True) else None
        return cls(out=Path(store.path).parent, layout=store.layout, max_grad_norm=clip,
                   per_example=store.per_example, background=background, max_queue=max_queue, store=store,
                   distributed=False)  # the trainer has combined the ranks' steps itself

    def _new_writer(self) -> BackgroundWriter | NoWriter:
        if self.store is None:
            return NoWriter()
        return BackgroundWriter(self.store, max_queue=self._max_queue, background=self._background)

    # ------------------------------------------------------------------ setup
    def _run_config(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        return run_config(per_example=self.per_example, max_grad_norm=self.max_grad_norm, names=self.names,
                          p=self.layout.p, user=config)

    # ------------------------------------------------------------------ state
    @property
    def next_step(self) -> int:
        """The step number a row gets when none is given: one after the last recorded."""
        return self._last_step + 1

    @property
    def rows_recorded(self) -> int:
        """Rows in the store once everything handed over is committed (resumed rows included)."""
        return self._writer.rows_written

    @property
    def closed(self) -> bool:
        """Whether the recorder was closed (the ``with`` block ended); it then records nothing."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the recorder of {str(self.path)!r} is closed; open a new one with resume=True")

    def _take_step(self, step: int | None, same_ok: bool) -> int:
        step = self.next_step if step is None else int(step)
        if step < self._last_step or (step == self._last_step and not same_ok):
            raise ValueError(
                f"step {step} comes after step {self._last_step}: steps must increase"
                + (" (several record_examples calls may share one)" if self.per_example else "")
            )
        return step

    def observe_loss(self, loss: float | Tensor | np.ndarray) -> None:
        """Note a loss for the rows an adapter (Opacus) records next.

        Note either the batch's mean loss or its per-example losses (B,) (an Opacus
        ghost-clipping loss gives its per-example losses). Losses noted since the last
        row are averaged into its ``loss``; per-example losses (one per recorded
        example, in order) are stored per example, and the Opacus adapter checks the
        batch size of the per-example gradients against their number.
        """
        self._losses.append(torch.from_numpy(floats(loss)))

    def _take_losses(self, n: int) -> float | np.ndarray:
        if not self._losses:
            return math.nan
        values = torch.cat(self._losses)
        self._losses.clear()
        if self.per_example and n and values.numel() == n:
            return values.numpy()
        return float(values.mean()) if values.numel() else math.nan

    # ------------------------------------------------------------------ rows
    def _finite(self, rows: Tensor, step: int, norms: Tensor | None = None) -> bool:
        if all_finite(rows if norms is None else norms):
            return True
        if not self.skip_nonfinite:
            raise ValueError(
                f"the gradient of step {step} has NaN or infinite values; nothing of this step was "
                "recorded (pass skip_nonfinite=True to drop such rows)"
            )
        logger.warning("step %d: non-finite gradient, row(s) not recorded", step)
        self.steps_skipped += 1
        return False

    def _stored(self, rows: np.ndarray | Tensor, meta: dict, *, owned: bool, norms: Tensor | None = None) -> np.ndarray:
        """The rows as the store will hold them (``stored_rows``: clipped per-example rows'
        stored norms <= C; a 16-bit store's rows in its on-disk form, what rounding lost added
        to ``meta``). A sketched row is a projection of a clipped row: not bounded by C."""
        if not (self.per_example and self.store is not None and self.store.sketch is None):
            return rows.numpy() if isinstance(rows, Tensor) else rows
        out, extra = stored_rows(rows, self.store.dtype, self.max_grad_norm, owned=owned, norms=norms)
        meta.update(extra)
        return out

    def _put(self, rows: Tensor, meta: dict[str, np.ndarray], step: int, norms: Tensor | None = None,
             release: Callable[[], None] | None = None) -> None:
        # release: the rows' owner reuses their memory once the writer has copied them
        self._writer.put(self._stored(rows, meta, owned=norms is not None, norms=norms), meta, release=release)
        due = step != self._last_step and self.cadence.stepped()
        self._last_step = step
        if due:
            self.commit()

    def record_step(
        self,
        *,
        grad: Grad | None = None,
        step: int | None = None,
        epoch: int | None = None,
        loss: float | Tensor | None = None,
        batch_size: int | None = None,
        norms: Tensor | np.ndarray | None = None,
        max_grad_norm: float | None = None,
    ) -> None:
        """Record one step's row: its mean (clipped) gradient over the batch's examples.

        Args:
            grad: the row: a flat tensor/array of p values, a mapping name ->
                gradient (extra names are ignored), or tensors in layout order;
                None reads ``.grad`` of the recorded parameters.
            step: the step number (default: one after the last); steps must increase.
            epoch: the epoch (default: ``recorder.epoch``).
            loss: the step's (mean) loss; None stores NaN (or the losses noted by
                :meth:`observe_loss`).
            batch_size: examples in the step's batch, the divisor of the row's mean
                (stored as 0 when not given). 0 given explicitly is an empty (Poisson)
                batch: no row is recorded, as in ``collect``, and the step number is used.
            norms: the per-example gradient norms before clipping, for
                ``norm_mean``/``norm_max``/``frac_clipped`` (NaN when not given).
            max_grad_norm: the clipping norm for ``frac_clipped`` (default: the recorder's).

        Raises:
            ValueError: a per-example recorder, a row of the wrong size, a step
                that does not increase, NaN/inf values (unless ``skip_nonfinite``).
        """
        self._check_open()
        if self.per_example:
            raise ValueError("this recorder stores per-example rows (per_example=True): use record_examples")
        step = self._take_step(step, same_ok=False)
        if batch_size is not None and int(batch_size) < 0:
            raise ValueError(f"batch_size is a number of examples, got {batch_size}")
        if self.ranks.active:  # every rank calls this: the global batch's size, loss and norms
            local = self._take_losses(0) if loss is None else float(np.mean(floats(loss)))
            batch_size, loss, norms = step_over_ranks(self.ranks, batch_size=batch_size, loss=local, norms=norms,
                                                      what=f"recording step {step}")
        if batch_size is not None and int(batch_size) == 0:  # an empty batch: no row, as in collect
            self._take_losses(0)
            self._last_step = step
            return
        row = flat_rows(grad, layout=self.layout, names=self.names, params=self.params, batch=None, step=step)
        noted = self._take_losses(0)  # taken either way, so that none is left for a later row
        loss_value = noted if loss is None else float(np.mean(floats(loss)))
        if not self._finite(row, step):
            return
        if self._plan_from_row:
            settle_plan(self, row)
        if self._sketch is not None:  # Phi of the row (rank 0: the others write nothing)
            row = self._sketch(row).to("cpu", torch.float32)
        meta = step_meta(1, step=step, epoch=self.epoch if epoch is None else int(epoch), loss=loss_value,
                         batch_size=0 if batch_size is None else int(batch_size), norms=norms,
                         max_grad_norm=self.max_grad_norm if max_grad_norm is None else max_grad_norm)
        self._put(row[None], meta, step)

    def record_examples(
        self,
        *,
        grads: Grad,
        step: int | None = None,
        epoch: int | None = None,
        loss: float | Tensor | np.ndarray | None = None,
        example_index: Sequence[int] | Tensor | np.ndarray | None = None,
        batch_size: int | None = None,
        norms: Tensor | np.ndarray | None = None,
        max_grad_norm: float | None = None,
        clip_factors: Tensor | np.ndarray | None = None,
        param_norms: Tensor | np.ndarray | None = None,
    ) -> None:
        """Record per-example rows: each (clipped) per-example gradient of a step.

        Several calls may share one step (microbatches of one batch). Each row's pre-clip norm,
        clip factor and norm per parameter are kept beside it (``GradientStore.row_norms``).

        Args:
            grads: the rows: a (b, p) tensor/array, a mapping name -> (b, *shape)
                (e.g. Opacus ``grad_sample``), or such tensors in layout order (an adapter's
                own float32 rows as `OwnedRows`: recorded without a copy).
            step: the step number (default: one after the last); steps must not decrease.
            epoch: the epoch (default: ``recorder.epoch``).
            loss: per-example losses (b,) or one value for all rows.
            example_index: the examples' indices in the dataset (-1 when not given).
            batch_size: examples in the step's batch (default: b).
            norms: the per-example norms before clipping (default: the rows' norms, i.e. the
                rows are the unclipped gradients; a clipping recorder then scales those above C
                down to C). Pass them when the rows are already clipped.
            max_grad_norm: the clipping norm for ``frac_clipped`` and the default clip
                factors (default: the recorder's).
            clip_factors: the factor each row was scaled by (default: ``min(1, C / norm)``;
                1 for an unclipped recorder); Opacus's rows pass Opacus's own.
            param_norms: (b, parameters) each example's pre-clip norm per recorded parameter,
                in layout order (default: from the rows; divided by the clip factor when
                ``norms`` were given, i.e. the rows are clipped).

        Raises:
            ValueError: a per-step recorder, rows of the wrong shape, mismatched
                lengths, a decreasing step, NaN/inf values (unless ``skip_nonfinite``).
        """
        self._check_open()
        if not self.per_example:
            raise ValueError("this recorder stores one row per step (per_example=False): use record_step")
        step = self._take_step(step, same_ok=True)
        owned = isinstance(grads, OwnedRows)
        rows = grads.rows if owned else flat_rows(grads, layout=self.layout, names=self.names, params=self.params,
                                                  batch=-1, step=step)
        b = rows.shape[0]
        noted = self._take_losses(b)  # taken either way, so that none is left for later rows
        losses, index, norms_arr, factors = example_columns(
            b, step, loss=noted if loss is None else floats(loss), example_index=example_index, norms=norms,
            clip_factors=clip_factors, rows=rows)
        clip = self.max_grad_norm if max_grad_norm is None else max_grad_norm
        own_norms = row_norms64(rows) if owned and b else None  # the finiteness check and the bound's norms
        release = grads.release if owned else None
        if b == 0 or not self._finite(rows, step, own_norms):
            if release is not None:
                release()  # not recorded: nothing reads them
            return
        factors, per_param = example_norms(rows, norms_arr, factors, param_norms, clip=clip,
                                           clipped_rows=norms is not None, layout=self.layout, step=step)
        meta = step_meta(b, step=step, epoch=self.epoch if epoch is None else int(epoch), loss=losses,
                         batch_size=b if batch_size is None else int(batch_size), norms=norms_arr, max_grad_norm=clip,
                         example_index=index, pre_clip_norm=norms_arr, clip_factor=factors, param_norms=per_param)
        self._put(rows, meta, step, own_norms, release)

    def put_rows(self, rows: np.ndarray, meta: Mapping[str, np.ndarray]) -> None:
        """Hand over rows (b, p) that a source computed with their metadata (gradspec's
        trainer: its rows, steps and norm statistics are its own), written in order."""
        self._check_open()
        meta = dict(meta)
        self._writer.put(self._stored(rows, meta, owned=True), meta)
        self._last_step = int(np.asarray(meta["step"])[-1])

    # ------------------------------------------------------------------ commits, config, end
    def commit(self, *, wait: bool = False, callback: Callable[[int], None] | None = None) -> None:
        """Make every row handed over so far durable (``wait``: return when it is); then
        ``callback(committed rows)`` runs (on the writer's thread)."""
        self._check_open()
        self._writer.commit(callback, wait=wait)
        self.cadence.committed()

    def update_config(self, **items: Any) -> None:
        """Merge items into the store's run config (waits for the writer first; nothing on a rank
        that does not write)."""
        self._check_open()
        self._writer.wait()
        if self.store is not None:
            self.store.update_config(**items)
        elif self._pending is not None:  # the store waits for the first row: its config takes them
            self._pending["run_config"].update(items)

    def rewind(self, step: int) -> int:
        """Forget the rows of steps >= ``step`` (continue a resumed loop from its own checkpoint).

        Returns:
            The rows kept.
        """
        self._check_open()
        if self.store is None:  # a rank that does not write keeps no rows
            return 0
        self._writer.close()
        steps = self.store.row_meta()["step"]
        keep = int(np.searchsorted(steps, int(step), side="left"))
        self.store.truncate(keep)
        self._writer = self._new_writer()
        self._last_step = int(steps[keep - 1]) if keep else -1
        self.cadence.committed()
        return keep

    def add_close_hook(self, fn: Callable[[], Mapping[str, Any] | None]) -> None:
        """Run ``fn`` at close; the items it returns are merged into the run config."""
        self._on_close.append(fn)

    def close(self, *, complete: bool = True, **config: Any) -> None:
        """Commit every row, run the close hooks, merge ``config`` into the run config, mark
        the store complete (unless ``complete=False``: a run stopped early) and release the run."""
        self._shutdown(complete=complete, items=config)

    def fail(self, error: BaseException | str) -> None:
        """Stop recording after an error: keep the committed rows, mark the store ``failed``
        (with the error in its run config) and release the run directory's lock, so that a
        later ``resume=True`` continues it and nothing stays locked until the process exits."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                if self._plan_from_row:  # no row recorded: an empty store, split by sqrt(numel)
                    settle_plan(self, None)
                self._writer.close()  # the rows already handed over are written and committed
            except Exception:  # noqa: BLE001 - the original error matters more
                logger.debug("closing the writer after an error also failed", exc_info=True)
            try:
                if self.store is not None:
                    self.store.update_config(error=str(error) or type(error).__name__)
                    self.store.set_status("failed")
            except Exception:  # noqa: BLE001
                logger.debug("marking the store failed also failed", exc_info=True)
        finally:
            _release_run_lock(self._lock)

    def _shutdown(self, complete: bool, items: Mapping[str, Any] | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._plan_from_row:  # no row recorded: an empty store, split by sqrt(numel)
                settle_plan(self, None)
            self._writer.close()
            items = dict(items or {})
            for fn in self._on_close:
                try:
                    items.update(fn() or {})
                except Exception:
                    if complete:
                        raise
                    logger.debug("close hook failed after an error", exc_info=True)
            if self.store is not None:
                self.store.update_config(**items, next_step=self.next_step)
            if complete and self.store is not None:
                self.store.set_status("complete")
        finally:
            _release_run_lock(self._lock)

    def __enter__(self) -> RecorderBase:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        # Keep what is safely written; never mark an interrupted store complete.
        try:
            self._shutdown(complete=False)
        except Exception:  # noqa: BLE001 - the original error matters more
            logger.debug("closing the recorder after an error also failed", exc_info=True)
