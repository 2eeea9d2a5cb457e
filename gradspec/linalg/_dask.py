"""The Dask backend: the operator's products as dask graphs, run on a dask.distributed cluster.

H is a dask array over the gradient store (``GradientStore.to_dask``), rechunked
so that each block spans all selected rows (then centering and every product
are block-local). The Gram is ``H @ H.T`` reduced over column blocks in
float64, ``hht`` is ``H @ (H.T @ Q)``, and the final pass persists
V = Hᵀ·U·Σ⁻¹ on the cluster and fetches it block by block into the sink. The
methods in ``gram``/``orthogonal``/``krylov`` run unchanged on this operator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradspec.linalg._operator_base import OperatorBase, Sink
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

    Args:
        source, rows, params, col_ranges, center: as in ``GradientOperator``.
        scheduler: a scheduler address or a ``distributed.Client``.
        block_cols: columns per dask block (default: the store's chunks).
    """

    device = None
    precision = "float64"

    def __init__(
        self,
        source: Any,
        *,
        scheduler: Any,
        rows: RowSelection = None,
        params: str | Sequence[str] | None = None,
        col_ranges: ColRanges = None,
        center: bool = False,
        block_cols: int | None = None,
        progress: bool = False,
    ) -> None:
        import dask.array as da

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
        h = arr.astype(np.float64)
        if center:
            h = h - h.mean(axis=0, keepdims=True)
        self.h = h
        self.shape: tuple[int, int] = tuple(int(s) for s in h.shape)  # type: ignore[assignment]
        self.center = center
        self.client = connect(scheduler)
        self.passes = 0
        self.row_sq_norms: np.ndarray | None = None
        self._norms = (h**2).sum(axis=1)

    def _compute(self, *xs: Any) -> list[Any]:
        out = self.client.compute([*xs, self._norms], sync=True)
        self.passes += 1
        self.row_sq_norms = np.asarray(out[-1])
        bad = np.flatnonzero(~np.isfinite(self.row_sq_norms))
        if bad.size:
            raise ValueError(
                f"H has NaN or inf in {bad.size} selected row(s), e.g. row {int(bad[0])} of the selection; "
                "exclude them with --rows or recollect"
            )
        return [np.asarray(x) for x in out[:-1]]

    def _norms_pass(self) -> None:
        self._compute()

    def gram(self) -> np.ndarray:
        return self._compute(self.h @ self.h.T)[0]

    def _hht(self, q: np.ndarray) -> np.ndarray:
        return self._compute(self.h @ (self.h.T @ q))[0]

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        import dask.array as da

        xd = da.from_array(x, chunks=(self.h.chunks[1], x.shape[1]))
        return self._compute(self.h @ xd)[0]

    def _rmatmat(self, y: np.ndarray, sink: Sink | None) -> np.ndarray | None:
        w = self._compute(self.h.T @ y)[0]
        if sink is None:
            return w
        sink(0, w)
        return None

    def _project(
        self, u: np.ndarray, sigma: np.ndarray, sink: Sink, *, out_dtype: Any, verify: str,
        gram: np.ndarray | None, omega: np.ndarray | None,
    ) -> dict[str, np.ndarray] | None:
        """V persisted on the cluster, fetched block by block; the checks are one more graph
        (``gram`` is not needed)."""
        from distributed import wait

        safe = np.where(sigma > 0, sigma, np.inf)
        w = self.h.T @ (u / safe)
        v = w.astype(out_dtype)
        v = self.client.persist(v)
        wait(v)
        offsets = np.cumsum((0,) + v.chunks[0])
        for i, block in enumerate(v.blocks):
            sink(int(offsets[i]), np.asarray(self.client.compute(block, sync=True)))
        vs = v.astype(np.float64)
        sigma2 = np.asarray(sigma, dtype=np.float64) ** 2
        if verify == "none":
            (n2,) = self._compute((vs**2).sum(axis=0))
            return {"n2": n2}
        if verify == "cheap":
            probe, n2, rt = self._compute(
                (omega.T @ self.h) @ vs, (vs**2).sum(axis=0), ((w - vs) ** 2).sum(axis=0)
            )
            return {"probe": probe, "n2": n2, "rt2": rt * sigma2}
        hv, vtv, rt = self._compute(self.h @ vs, vs.T @ vs, ((w - vs) ** 2).sum(axis=0))
        return {"hv": hv, "vtv": vtv, "rt2": rt * sigma2, "n2": np.diag(vtv).copy()}

    def describe(self) -> dict[str, Any]:
        return {
            **self.source.describe(),
            "shape": list(self.shape),
            "center": self.center,
            "backend": "dask",
        }


__all__ = ["DaskGradientOperator", "connect"]
