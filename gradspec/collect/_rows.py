"""Gradient rows as a `GradientRecorder` stores them: what a row means, and conversion to rows.

One convention for every source of rows (gradspec's trainer ``collect``, a plain
loop, Opacus, a Hugging Face ``Trainer``), so that stores of different sources can
be compared row for row: a per-step row is the *mean* clipped gradient over the
examples the step actually had (the clipped sum before noise divided by the
number of examples in the logical batch, virtual steps included), not the clipped
sum divided by the *expected* batch size that DP-SGD divides the noisy sum by;
under Poisson sampling the two differ by the factor b / (q n). A step with no
example (an empty Poisson batch) has no row, as in ``collect``. A per-example row
is one clipped per-example gradient. The run config of a store names its rows
(``row``) and the divisor of a per-step row (``row_divisor``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from gradspec._norms import row_norms64
from gradspec.privacy import bound_rows_
from gradspec.store import STATS_ARRAY, ParamLayout, disk_rows

#: ``row`` of a store of per-step rows.
ROW_MEAN = "mean clipped gradient over the batch's examples (before noise)"
#: ``row`` of a store of per-example rows.
ROW_EXAMPLE = "clipped per-example gradient (before noise)"
#: ``row`` of a store of per-step rows that were not clipped (a non-private loop).
ROW_MEAN_UNCLIPPED = "mean gradient over the batch's examples (unclipped)"
#: ``row`` of a store of per-example rows that were not clipped.
ROW_EXAMPLE_UNCLIPPED = "per-example gradient (unclipped)"
#: ``row_divisor`` of per-step rows: the examples the step actually had (summed over
#: its virtual steps / accumulated micro-batches), not the expected batch size.
DIVISOR_ACTUAL = "actual batch size"

#: What a gradient argument may be: a flat row (block), parameter name -> tensor, or
#: tensors in layout order.
Grad = Tensor | np.ndarray | Mapping[str, Tensor] | Sequence[Tensor]


def run_config(*, per_example: bool, max_grad_norm: float | None, names: Sequence[str], p: int,
               user: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run config of a store a :class:`~gradspec.collect.GradientRecorder` creates: what its
    rows are (``row``, ``row_divisor``), the recorded parameters, C and the user's config."""
    from gradspec.train import package_versions

    clipped = max_grad_norm is not None
    if per_example:
        row, divisor = (ROW_EXAMPLE if clipped else ROW_EXAMPLE_UNCLIPPED), None
    else:
        row, divisor = (ROW_MEAN if clipped else ROW_MEAN_UNCLIPPED), DIVISOR_ACTUAL
    return {
        "source": "recorder",
        "recorder": {"per_example": per_example},
        "row": row,
        "row_divisor": divisor,
        "parameters": list(names),
        "p": p,
        "max_grad_norm": max_grad_norm,
        "user": dict(user or {}),
        "versions": package_versions(),
    }


#: Bytes of float32 rows a per-example store's row chunk holds at most (the writer's buffer).
EXAMPLE_BLOCK_BYTES = 32 * 2**20


def example_rows_per_chunk(p: int) -> int:
    """Rows per chunk of a per-example store of p columns: 32 (a per-step store's) up to the
    power of two whose float32 rows fill :data:`EXAMPLE_BLOCK_BYTES` (at most 2,048).

    The writer writes one row chunk at a time, each with one write of every per-row metadata
    array; a step of small-p per-example rows fills 32 rows many times over, and those
    metadata writes, not the bytes, bounded recording (issue 22).
    """
    fit = EXAMPLE_BLOCK_BYTES // (4 * max(int(p), 1))
    return max(32, min(2048, 1 << max(fit, 1).bit_length() - 1))


class OwnedRows(NamedTuple):
    """Rows an adapter formed and hands to ``record_examples`` (Opacus's clipped rows): float32,
    CPU, contiguous, (b, p), not used by anyone else. They are recorded without a copy and, for a
    float32 store, bounded in place. ``release``, if given, is called once nothing reads the rows
    any more (the writer has copied them, or they were not recorded): a `RowPool` reuses them."""

    rows: Tensor
    release: Callable[[], None] | None = None


class RowPool:
    """Reused float32 CPU blocks for the rows an adapter forms every step.

    A fresh (b, p) block the size of a step's per-example rows is hundreds of MB, which the
    allocator maps anew each time: at p = 1.06M, 32 rows, forming them into a fresh block took
    78 ms on a 2-core EPYC with 4 KiB pages, 12 ms into a reused one (docs/bench_opacus_recording.txt).
    A block comes back through ``give`` once the writer has copied it into its chunk buffer
    (`OwnedRows.release`), so a block is never written while anything still reads it; at most
    ``keep`` blocks wait to be reused (the writer's thread gives them back, hence the lock).
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = int(keep)
        self._free: list[Tensor] = []
        self._lock = threading.Lock()

    def take(self, b: int, p: int) -> Tensor:
        """A (b, p) float32 CPU block: a returned one of that shape, or a new one. Its values are
        whatever it held: the caller writes every entry."""
        with self._lock:
            for i, block in enumerate(self._free):
                if block.shape == (b, p):
                    return self._free.pop(i)
        return torch.empty(b, p)

    def give(self, block: Tensor) -> None:
        """Return a block nothing reads any more."""
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(block)

    def releaser(self, block: Tensor) -> Callable[[], None]:
        """``give(block)``, callable once (a second call does nothing)."""
        given = [False]

        def release() -> None:
            if not given[0]:
                given[0] = True
                self.give(block)

        return release


def as_tensor(x: Tensor | np.ndarray | float | Sequence[float]) -> Tensor:
    """A detached tensor of ``x``; an Opacus ghost-clipping loss gives its per-example losses."""
    per_sample = getattr(x, "loss_per_sample", None)  # opacus DPTensorFastGradientClipping
    if isinstance(per_sample, Tensor):
        return per_sample.detach()
    return x.detach() if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))


def floats(x: Tensor | np.ndarray | float | Sequence[float]) -> np.ndarray:
    """Values as a flat float64 array (losses, norms)."""
    return as_tensor(x).to("cpu", torch.float64).reshape(-1).numpy()


def norm_stats(norms: Any, max_grad_norm: float | None) -> tuple[float, float, float]:
    """(norm_mean, norm_max, frac_clipped) as ``collect`` stores them; NaN when unknown."""
    if norms is None:
        return math.nan, math.nan, math.nan
    from gradspec.privacy import norm_stats as privacy_norm_stats

    norms = floats(norms)
    if norms.size == 0:
        return 0.0, 0.0, 0.0
    if not max_grad_norm:  # unclipped rows: nothing was clipped
        return float(norms.mean()), float(norms.max()), 0.0
    stats = privacy_norm_stats(torch.from_numpy(norms), max_grad_norm)
    return stats["mean"], stats["max"], stats["frac_clipped"]


def step_meta(b: int, *, step: int, epoch: int, loss: float | np.ndarray, batch_size: int, norms: Any,
              max_grad_norm: float | None, **columns: np.ndarray) -> dict[str, np.ndarray]:
    """The metadata of ``b`` rows of one step as ``collect`` stores it: the step's number, epoch,
    batch size and norm statistics (`norm_stats` of ``norms``) on every row; ``loss`` one value
    or one per row; per-example ``columns`` (example_index, pre_clip_norm, ...) as given."""
    mean, top, frac = norm_stats(norms, max_grad_norm)
    return {"step": np.full(b, step), "epoch": np.full(b, epoch), "loss": np.full(b, loss, dtype=np.float64),
            "batch_size": np.full(b, batch_size), "norm_mean": np.full(b, mean), "norm_max": np.full(b, top),
            "frac_clipped": np.full(b, frac), **columns}


def example_columns(b: int, step: int, *, loss: Any, example_index: Any, norms: Any, clip_factors: Any,
                    rows: Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(losses, example_index, pre-clip norms, clip factors or None) of ``b`` per-example rows:
    one loss for all or one each, -1 for unknown indices, the rows' own norms when none are
    given. Each holds ``b`` values, or a ValueError names the one that does not."""
    losses = np.asarray(loss, dtype=np.float64).reshape(-1)
    if losses.size == 1:
        losses = np.full(b, losses[0])
    index = np.full(b, -1) if example_index is None else as_tensor(example_index).reshape(-1).cpu().numpy()
    norms_arr = floats(row_norms64(torch.as_tensor(rows)) if norms is None else norms)
    factors = floats(clip_factors) if clip_factors is not None else None
    for name, arr in (("loss", losses), ("example_index", index), ("norms", norms_arr),
                      ("clip_factors", factors if factors is not None else norms_arr)):
        if len(arr) != b:
            raise ValueError(f"{name} has {len(arr)} values for the {b} rows of step {step}")
    return losses, index, norms_arr, factors


def flat_rows(
    grad: Grad | None,
    *,
    layout: ParamLayout,
    names: Sequence[str],
    params: Sequence[Tensor] | None,
    batch: int | None,
    step: int,
) -> Tensor:
    """One row (p,) (``batch`` None) or rows (b, p) as a float32 CPU tensor that owns its memory.

    Args:
        grad: the row(s): a flat tensor/array, a mapping name -> gradient, tensors in
            layout order, or None to read ``.grad`` of ``params``.
        layout: the layout of a row.
        names: the layout's parameter names.
        params: the recorded parameters (None: a layout-only recorder).
        batch: None for one row; otherwise rows of leading dimension b.
        step: the step, for messages.

    Raises:
        ValueError: a missing ``.grad`` or parameter, a wrong shape or size.
    """
    if grad is None:
        if params is None:
            raise ValueError("this recorder was built from a layout and knows no parameters: pass grad=")
        missing = [n for n, p in zip(names, params, strict=True) if p.grad is None]
        if missing:
            raise ValueError(f"parameter {missing[0]!r} has no .grad at step {step}: record after backward(), before zero_grad()")
        grad = [p.grad for p in params]
    if isinstance(grad, Mapping):
        absent = [n for n in names if n not in grad]
        if absent:
            raise ValueError(f"the gradients given lack parameter {absent[0]!r} (the layout has {len(names)})")
        grad = [grad[n] for n in names]
    if isinstance(grad, Tensor | np.ndarray):
        t = as_tensor(grad)
        want = (layout.p,) if batch is None else (-1, layout.p)
        if t.numel() == 0 and batch is not None:
            return torch.zeros(0, layout.p)
        if t.dim() != len(want) or t.shape[-1] != layout.p:
            if batch is None and t.dim() == 2 and t.shape[0] == 1 and t.shape[1] == layout.p:
                t = t[0]
            else:
                shape = f"({layout.p},)" if batch is None else f"(b, {layout.p})"
                raise ValueError(f"the gradient row(s) of step {step} have shape {tuple(t.shape)}; expected {shape}")
        return t.to("cpu", torch.float32, copy=True)
    parts = list(grad)
    if len(parts) != len(layout.params):
        raise ValueError(f"got {len(parts)} gradient tensors for the {len(layout.params)} recorded parameters")
    flat = []
    for spec, g in zip(layout.params, parts, strict=True):
        g = as_tensor(g)
        if batch is None and tuple(g.shape) != spec.shape:
            raise ValueError(f"the gradient of {spec.name!r} at step {step} has shape {tuple(g.shape)}, not {spec.shape}")
        if batch is not None and (g.dim() != len(spec.shape) + 1 or tuple(g.shape[1:]) != spec.shape):
            raise ValueError(f"the per-example gradients of {spec.name!r} at step {step} have shape "
                             f"{tuple(g.shape)}, not (b, {', '.join(map(str, spec.shape))})")
        if batch is not None and flat and g.shape[0] != flat[0].shape[0]:
            raise ValueError(f"the per-example gradients of {spec.name!r} at step {step} have "
                             f"{g.shape[0]} rows, those of {names[0]!r} {flat[0].shape[0]}")
        flat.append(g.reshape(-1) if batch is None else g.reshape(g.shape[0], -1))
    device = flat[0].device
    row = torch.cat([f.to(device, torch.float32) for f in flat], dim=-1)
    return row.to("cpu", torch.float32, copy=device.type != "cpu")


def example_norms(
    rows: Tensor,
    norms: np.ndarray,
    factors: np.ndarray | None,
    param_norms: Tensor | np.ndarray | None,
    *,
    clip: float | None,
    clipped_rows: bool,
    layout: ParamLayout,
    step: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The clip factors (b,) and per-parameter pre-clip norms (b, parameters) a per-example store
    keeps beside rows (b, p) whose pre-clip norms are ``norms`` (float64).

    Defaults: factors ``min(1, C / norm)`` (`gradspec.privacy.clip_factors`; 1 when ``clip``
    is None); per-parameter norms from the rows themselves, divided by the row's factor when
    the rows are already clipped (``clipped_rows``: float32-accurate, ``c_i g_i`` rounded).

    Raises:
        ValueError: a shape that does not fit, a NaN or negative norm, a factor outside (0, 1].
    """
    from gradspec.privacy import clip_factors, per_parameter_norms

    b = rows.shape[0]
    if factors is None:
        factors = (clip_factors(torch.from_numpy(norms), clip).numpy() if clip else np.ones(b))
    if param_norms is None:
        per_param = per_parameter_norms(rows, [(s.offset, s.stop) for s in layout.params]).numpy()
        if clipped_rows:
            per_param = per_param / factors[:, None]
    else:
        per_param = as_tensor(param_norms).to("cpu", torch.float64).numpy()
        if per_param.shape != (b, len(layout.params)):
            raise ValueError(f"param_norms of step {step} have shape {per_param.shape}, not "
                             f"({b}, {len(layout.params)}): one pre-clip norm per row and recorded parameter")
    for name, values, ok in (("norms", norms, norms >= 0), ("param_norms", per_param, per_param >= 0),
                             ("clip_factors", factors, (factors > 0) & (factors <= 1))):
        bad = ~(np.isfinite(values) & ok)
        if bad.any():
            raise ValueError(f"{name} of step {step} hold {values[bad].flat[0]!r}, not a finite "
                             f"{'factor in (0, 1]' if name == 'clip_factors' else 'norm >= 0'}; nothing "
                             "of the step was recorded")
    return factors, per_param


#: The torch dtype of each store dtype: the store casts float32 rows with torch's rounding.
STORE_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def stored_rows(rows: Tensor | np.ndarray, store_dtype: str, max_grad_norm: float | None, *, owned: bool = False,
                norms: Tensor | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Rows as the store will hold them, and what their rounding to the store's dtype lost.

    With ``max_grad_norm`` C (clipped per-example rows), every row's float64 norm as stored is
    at most C: a rounding of the clip, or of the cast to a 16-bit store, never passes it
    (``bound_rows_``; in place where the rows are the caller's to change, ``owned``; ``norms``:
    their float64 norms where known). A 16-bit store's rows come back in its on-disk form
    with ``{"dtype_stats": ...}``, what the rounding lost against the rows given: the writer
    then holds half the bytes, and the store's precision record is of the real rounding
    (rows rounded here and handed over as float32 made that record read "nothing lost").
    Without C: the rows as they are (the store converts them and keeps the same record).
    """
    if max_grad_norm is None:
        return (rows.numpy() if isinstance(rows, Tensor) else rows), {}
    dt = STORE_TORCH_DTYPES[store_dtype]
    t = torch.as_tensor(rows)
    if dt == torch.float32:
        if t.dtype != torch.float32:
            return bound_rows_(t, max_grad_norm, dtype=dt).numpy(), {}  # a converted copy
        return bound_rows_(t if owned else t.clone(), max_grad_norm, norms=norms).numpy(), {}
    before = t.to(torch.float32)
    stored = bound_rows_(before, max_grad_norm, dtype=dt)  # a new 16-bit tensor
    disk = stored.view(torch.int16).numpy().view(np.uint16) if dt == torch.bfloat16 else stored.numpy()
    disk, stats = disk_rows(before.numpy(), store_dtype, disk)
    return disk, {STATS_ARRAY: stats}
