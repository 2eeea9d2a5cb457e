"""One replay of a per-step sketched run (`gradspec.train.replay`, see ``_replay``): the trainer's
own loop (``_loop._train``) run again, each row it would store checked against the stored one,
and its exact row added to the accumulators Aᵀ = U_Kᵀ·H[:, a:b] (its squared norm kept: the sketched
store holds only the sketched rows); or, in a checking replay, multiplied by the written V."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradspec._norms import sq_norms64
from gradspec.train._distributed import Ranks

#: Exact rows gathered before they are added to the accumulators (one K × B × chunk product).
BUFFER_ROWS = 16


class ReplayMismatch(ValueError):
    """The run did not replay bit for bit: a recomputed row's sketch is not the stored row."""


class _Tap:
    """The run's `DenseSketch`, keeping the exact row it is given (the step's mean clipped gradient)."""

    def __init__(self, sketch: Any) -> None:
        self.sketch, self.row = sketch, None

    def __call__(self, row: torch.Tensor) -> torch.Tensor:
        self.row = row
        return self.sketch(row)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sketch, name)


@dataclass
class _Check:
    rows: int = 0
    exact: int = 0
    worst: float = 0.0
    worst_step: int | None = None
    frob2: float = 0.0
    sq_norms: np.ndarray | None = None  # (n_rows,) ‖h_i‖² of the exact rows used (0 elsewhere)


class _Sink:
    """Where the replayed run's rows go (a `gradspec.train.RowSink`): each is checked against the
    stored row, and its exact row, for the columns [a, b), added to the accumulators; or, given
    ``v`` (the written V's rows [a, b), b − a × k), multiplied by it: H[:, a:b]·V[a:b] (``hv``)."""

    def __init__(self, case: Any, tap: _Tap, a: int, b: int, device: torch.device, bar: Any,
                 v: torch.Tensor | None = None) -> None:
        self.case, self.tap, self.a, self.b, self.bar = case, tap, a, b, bar
        g = case.store
        self.steps = np.asarray(g.row_meta()["step"])
        self.block = max(1, int(g.chunks[0]))
        self.cached: tuple[int, np.ndarray] | None = None
        self.dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(str(g.dtype))
        K = case.K
        self.v = v
        self.acc = torch.zeros((K, b - a) if v is None else (0, 0), dtype=torch.float64, device=device)
        self.hv = None if v is None else torch.zeros((g.n_rows, v.shape[1]), dtype=torch.float64, device=device)
        self.rows: list[int] = []  # the store rows in the buffer (``hv``)
        self.buf = torch.zeros((BUFFER_ROWS, b - a), dtype=torch.float64, device=device)
        self.cbuf = torch.zeros((BUFFER_ROWS, K), dtype=torch.float64, device=device)
        self.filled = 0
        self.check = _Check(sq_norms=np.zeros(g.n_rows))
        self.i = 0

    @property
    def rows_recorded(self) -> int:
        return self.i

    def _stored(self, i: int) -> np.ndarray:
        start = (i // self.block) * self.block
        if self.cached is None or self.cached[0] != start:
            stop = min(self.case.store.n_rows, start + self.block)
            self.cached = (start, self.case.store.read(slice(start, stop)))
        return self.cached[1][i - start]

    def put_rows(self, rows: np.ndarray, meta: Any) -> None:
        i, g = self.i, self.case.store
        step = int(np.asarray(meta["step"])[0])
        if i >= g.n_rows:
            raise ReplayMismatch(f"the replay stores a row at step {step} but the store holds {g.n_rows} rows: "
                                 "the run cannot be replayed (changed settings or code); nothing written")
        if step != int(self.steps[i]):
            raise ReplayMismatch(f"row {i} of the store is of step {int(self.steps[i])} but the replay's row {i} "
                                 f"is of step {step}: the run cannot be replayed (changed settings or code); "
                                 "nothing written")
        got = np.asarray(rows, dtype=np.float32).reshape(-1)
        if self.dtype is not None:  # the stored dtype's rounding, as the writer does it (torch's)
            got = torch.from_numpy(got).to(self.dtype).float().numpy()
        want = self._stored(i)
        diff = float(np.max(np.abs(got - want), initial=0.0)) if got.shape == want.shape else math.inf
        scale = float(np.max(np.abs(want), initial=0.0))
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        if not rel <= self.case.tolerance:
            raise ReplayMismatch(
                f"step {step} (row {i}) does not replay: its recomputed sketch differs from the stored row by "
                f"{diff:.3g} (max |difference|; {rel:.3g} of the row's largest entry, tolerance "
                f"{self.case.tolerance:.3g}): the run cannot be replayed bit for bit (changed code, data, "
                "settings or non-deterministic kernels); nothing written")
        c = self.check
        c.rows += 1
        c.exact += diff == 0
        if rel > c.worst or c.worst_step is None:
            c.worst, c.worst_step = rel, step
        if self.case.used[i]:
            h = self.tap.row.reshape(-1)
            c.sq_norms[i] = float(sq_norms64(h[None], 1)[0])  # the project's float64 row norms (gradspec._norms)
            c.frob2 += c.sq_norms[i]
            self.buf[self.filled].copy_(h[self.a:self.b])
            self.cbuf[self.filled].copy_(torch.from_numpy(self.case.coef[i]))
            self.rows.append(i)
            self.filled += 1
            if self.filled == BUFFER_ROWS:
                self.flush()
        self.tap.row = None
        self.i += 1
        if self.bar is not None:
            self.bar.update(1)

    def flush(self) -> None:
        n = self.filled
        if n and self.hv is not None:
            self.hv[self.rows] += self.buf[:n] @ self.v
        elif n:
            self.acc.addmm_(self.cbuf[:n].T, self.buf[:n])
        self.filled = 0
        self.rows.clear()

    def commit(self, *, callback: Any = None, wait: bool = False) -> None:
        """Nothing to make durable: a replay keeps no checkpoint (the callback would save one)."""

    def close(self, *, complete: bool = True, **config: Any) -> None:
        self.flush()


def one_pass(case: Any, a: int, b: int, tmp: Path, *, progress: bool, what: str,
             v: np.ndarray | None = None) -> tuple[_Check, np.ndarray]:
    """Replay the run once: every stored row checked, Aᵀ = U_Kᵀ·H[:, a:b] accumulated; or, given
    ``v`` (V's rows [a, b) as written), H[:, a:b]·V[a:b] (n_rows × k, 0 on rows pca did not use)."""
    from gradspec.train._loop import _train

    work = tmp / f"run-{a}" if v is None else tmp / f"check-{a}"
    work.mkdir()
    run = case.build(work)
    case.layout = run.layout.to_list()
    tap = _Tap(run.dense_sketch)
    run.dense_sketch = tap
    bar = None
    if progress:
        import sys

        from tqdm.auto import tqdm

        bar = tqdm(total=case.store.n_rows, desc=f"replay {what}", unit="row", file=sys.stderr, dynamic_ncols=True)
    holder: dict[str, _Sink] = {}

    def factory(store: Any, **_: Any) -> _Sink:
        holder["sink"] = _Sink(case, tap, a, b, run.device, bar,
                               None if v is None else torch.as_tensor(v, dtype=torch.float64, device=run.device))
        return holder["sink"]

    try:
        _train(run, case.store, case.task, work, progress=False, writer=False, sink=factory, stop_after=None,
               ranks=Ranks(), stores_rows=True)
    finally:
        if bar is not None:
            bar.close()
    sink = holder["sink"]
    if sink.i != case.store.n_rows:
        raise ReplayMismatch(f"the replay stored {sink.i} rows but the store holds {case.store.n_rows}: the run "
                             "cannot be replayed (changed settings or code); nothing written")
    return sink.check, (sink.acc if sink.hv is None else sink.hv).cpu().numpy()
