"""The Dask backend: the operator's passes as dask graphs, run on a dask.distributed cluster.

H is a dask array over the gradient store (``GradientStore.to_dask``: the
workers open the store by its path and read their chunks themselves),
rechunked so that each block spans all selected rows (then centering and every
product are block-local). Each pass is one task per column block running the
local engine on that block (``_dask_blocks``: same precisions, same measured
Gram kernels) and a tree of float64 sums; the rows of V = Hᵀ·U·Σ⁻¹ stay on the
workers until the driver fetches them block by block into the sink. The
methods in ``gram``/``orthogonal``/``krylov`` run unchanged on this operator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gradspec.linalg._dask_blocks import add_parts, pick, run_block
from gradspec.linalg._kernels import KERNEL_CHOICES, gram_kernel
from gradspec.linalg._operator import pass_record
from gradspec.linalg._operator_base import ArraySink, OperatorBase, Sink
from gradspec.linalg._precision import effective_precision, resolve_precision
from gradspec.linalg._sources import ArraySource, ColRanges, RowSelection, make_source

logger = logging.getLogger(__name__)


def connect(scheduler: Any, timeout: str = "10s"):
    """A ``distributed.Client`` for an address (``"tcp://host:8786"``) or a Client/LocalCluster."""
    from distributed import Client

    if isinstance(scheduler, Client):
        return scheduler
    if hasattr(scheduler, "scheduler_address"):  # a (Local)Cluster
        return Client(scheduler)
    if isinstance(scheduler, str):
        try:
            return Client(scheduler, timeout=timeout)
        except OSError as exc:
            raise ValueError(
                f"cannot reach the dask scheduler at {scheduler!r}: {exc}; check --scheduler"
            ) from None
    raise TypeError(
        f"scheduler must be an address string or a dask Client, not {type(scheduler).__name__}"
    )


class DaskGradientOperator(OperatorBase):
    """``GradientOperator``'s interface with every pass a dask graph on a cluster.

    Each column block (all selected rows) is one task that runs the local engine on it
    (``_dask_blocks.run_block``): the precision policy and the measured Gram kernel are the
    local path's, decided on each worker's machine. Partial sums are float64 and reduced on
    the cluster in a tree; the driver holds O(r² + r·k) plus one block of a p×k result.

    Args:
        source, rows, params, col_ranges, center: as in ``GradientOperator``.
        scheduler: a scheduler address or a ``distributed.Client``.
        precision: as in ``GradientOperator`` (``"auto"``: float32 products for float32 data).
        kernel: the Gram kernel, or ``"auto"``: each worker's measured choice.
        block_cols: columns per dask block (default: the store's chunks).
    """

    device = None

    def __init__(
        self,
        source: Any,
        *,
        scheduler: Any,
        rows: RowSelection = None,
        params: str | Sequence[str] | None = None,
        col_ranges: ColRanges = None,
        center: bool = False,
        precision: str = "auto",
        kernel: str = "auto",
        block_cols: int | None = None,
        progress: bool = False,
    ) -> None:
        import dask.array as da

        if kernel not in KERNEL_CHOICES:
            raise ValueError(f"unknown Gram kernel {kernel!r}; choose one of: {', '.join(KERNEL_CHOICES)}")
        if kernel != "auto":
            gram_kernel(kernel, torch.device("cpu"))  # the workers compute on their CPUs
        self.source = make_source(source, rows=rows, params=params, col_ranges=col_ranges)
        if isinstance(self.source, ArraySource):
            a = self.source._a
            a = a.float().numpy() if hasattr(a, "detach") else a  # a bfloat16/float16 tensor
            arr = da.from_array(a, chunks=(-1, block_cols or 8192))
            if self.source._ranges != [(0, a.shape[1])]:
                arr = da.concatenate([arr[:, a:b] for a, b in self.source._ranges], axis=1)
        else:
            arr = self.source.to_dask()
        arr = arr.rechunk({0: -1, 1: block_cols or "auto"} if block_cols else {0: -1})
        if arr.dtype not in (np.float32, np.float64):
            arr = arr.astype(np.float32)
        self.h = arr
        self.precision = effective_precision(precision, arr.dtype)
        resolve_precision(self.precision, torch.device("cpu"))  # tf32: refused here, as locally
        self.kernel = kernel
        self.kernel_choice: tuple[str, str] | None = None
        self.shape: tuple[int, int] = tuple(int(s) for s in arr.shape)  # type: ignore[assignment]
        self.center = center
        self.client = connect(scheduler)
        self.passes = 0
        self.pass_log: list[dict[str, Any]] = []
        self.row_sq_norms: np.ndarray | None = None

    def _run(self, kind: str, args: dict[str, Any], sink: Sink | None = None) -> Any:
        """One pass of ``kind`` on the cluster -> the summed result; a p×b result goes to ``sink``."""
        from dask import delayed

        r, p = self.shape
        t0 = time.perf_counter()
        need_norms = self.row_sq_norms is None
        shared = {key: delayed(val, pure=True) for key, val in args.items() if key != "x"}
        offsets = np.cumsum((0,) + self.h.chunks[1])
        parts = []
        for i, blk in enumerate(self.h.to_delayed().ravel()):
            a = dict(shared)
            if "x" in args:
                a["x"] = args["x"][offsets[i] : offsets[i + 1]]
            if kind == "project":
                a["col0"] = int(offsets[i])  # the p-side probes draw by global column
            parts.append(delayed(run_block, pure=False)(
                blk, kind, a, precision=self.precision, kernel=self.kernel, center=self.center,
                flops=float(r) * r * p, need_norms=need_norms,
            ))
        if sink is not None:
            parts = self.client.persist(parts)  # the rows stay on the workers until fetched
        total = _tree([delayed(pick)(part, "sum") for part in parts])
        norms = _tree([delayed(pick)(part, "norms") for part in parts])
        kernels = [delayed(pick)(part, "kernel") for part in parts]
        flops = _tree([delayed(pick)(part, "flops") for part in parts])
        total, norms, kernels, flops = self.client.compute([total, norms, kernels, flops], sync=True)
        if sink is not None:
            for i, part in enumerate(parts):
                sink(int(offsets[i]), np.asarray(self.client.compute(delayed(pick)(part, "rows"), sync=True)))
            del parts
        if kind == "gram":
            self.kernel_choice = _kernels_used(kernels)
        self.passes += 1
        self.pass_log.append(pass_record(kind, time.perf_counter() - t0, None, r * p * self.h.dtype.itemsize,
                                         float(flops or 0)))
        if need_norms:
            bad = np.flatnonzero(~np.isfinite(norms))
            if bad.size:
                raise ValueError(
                    f"H has NaN or inf in {bad.size} selected row(s), e.g. row {int(bad[0])} of the selection; "
                    "exclude them with --rows or recollect"
                )
            self.row_sq_norms = np.asarray(norms)
        return total

    def _norms_pass(self) -> None:
        self._run("norms", {})

    def gram(self) -> np.ndarray:
        return self._run("gram", {})

    def _hht(self, q: np.ndarray) -> np.ndarray:
        return self._run("hht", {"q": q})

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return self._run("matmat", {"x": x})

    def _rmatmat(self, y: np.ndarray, sink: Sink | None) -> np.ndarray | None:
        out = ArraySink(self.p, y.shape[1], np.float64) if sink is None else None
        self._run("rmatmat", {"y": y}, sink if out is None else out)
        return None if out is None else out.array

    def _project(
        self, u: np.ndarray, sigma: np.ndarray, sink: Sink, *, out_dtype: Any, verify: str,
        gram: np.ndarray | None, omega: np.ndarray | None, seed: int = 0,
    ) -> dict[str, np.ndarray] | None:
        """V formed block by block on the workers and fetched into ``sink``; the checks' sums
        come back with it (``gram`` is not needed)."""
        args = {"u": u, "sigma": sigma, "out_dtype": np.dtype(out_dtype), "verify": verify, "seed": seed}
        if omega is not None:
            args["omega"] = omega
        return self._run("project", args, sink)

    def describe(self) -> dict[str, Any]:
        return {
            **self.source.describe(),
            "shape": list(self.shape),
            "center": self.center,
            "backend": "dask",
        }


def _tree(parts: list[Any]) -> Any:
    """The sum of delayed partial results, reduced pairwise on the cluster (depth log₂ n)."""
    from dask import delayed

    while len(parts) > 1:
        pairs = [parts[i : i + 2] for i in range(0, len(parts), 2)]
        parts = [delayed(add_parts)(*pair) if len(pair) == 2 else pair[0] for pair in pairs]
    return parts[0] if parts else None


def _kernels_used(kernels: list[Any]) -> tuple[str, str] | None:
    """(kernel, why) the workers used: one name when they agree, else every name."""
    names = sorted({k[0] for k in kernels if k})
    if not names:
        return None
    if len(names) == 1:
        return names[0], next(k[1] for k in kernels if k and k[0] == names[0])
    return "+".join(names), "measured per worker machine: the workers chose differently"


__all__ = ["DaskGradientOperator", "connect"]
