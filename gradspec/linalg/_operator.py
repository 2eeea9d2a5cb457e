"""The streamed gradient matrix H (r×p) as a linear operator.

H is never materialised: every product is one pass over its column blocks.
A column block B_c (r×c, read once from disk with prefetch) is cut into panels
P (r×w, w ≤ 8192 columns) that are cast to the compute dtype and moved to the
device; each consumer of a *fused pass* updates from each panel, so one read of
H serves several products (e.g. V = HᵀUΣ⁻¹, H·V and VᵀV in the final pass).

    H·X   = Σ_c P_c X_c            (matmat, X p×b)
    Hᵀ·Y  = [P_cᵀ Y]_c             (rmatmat, written out panel by panel)
    H·Hᵀ  = Σ_c P_c P_cᵀ           (gram)
    HHᵀQ  = Σ_c P_c (P_cᵀ Q)       (hht, one pass: subspace and Krylov iterations)

Sums over panels are accumulated in float64 whatever the panel precision.
Centering (optional, explicit; the paper's H is uncentered) subtracts each
column's mean over the selected rows, which is local to a column block.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from gradspec._device import resolve_device
from gradspec.linalg._kernels import block_edges, sym_finish, sym_update
from gradspec.linalg._precision import (
    effective_precision,
    resolve_precision,
    to_device,
    to_numpy,
)
from gradspec.linalg._sources import ColRanges, RowSelection, make_source

logger = logging.getLogger(__name__)

Sink = Callable[[int, np.ndarray], None]


class ArraySink:
    """Collects streamed rows of a p×k result (V, or Hᵀ·Y) in memory."""

    def __init__(self, p: int, k: int, dtype: Any = np.float32) -> None:
        self.array = np.zeros((p, k), dtype=dtype)
        self.dtype = np.dtype(dtype)

    def __call__(self, offset: int, block: np.ndarray) -> None:
        self.array[offset : offset + block.shape[0]] = block


class _Gram:
    """G = Σ P·Pᵀ over panels in float64, upper block triangle only (see ``_kernels``)."""

    def __init__(self, op: GradientOperator) -> None:
        r = op.shape[0]
        self.g = torch.zeros((r, r), dtype=torch.float64, device=op.device)
        self.edges = block_edges(r, op.device, dtype=op.dtype)

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        sym_update(self.g, p, self.edges)

    def result(self) -> np.ndarray:
        return sym_finish(self.g, self.edges)


class _HHt:
    """Z = H·Hᵀ·Q in one pass."""

    def __init__(self, op: GradientOperator, q: np.ndarray) -> None:
        self.q = torch.as_tensor(q, device=op.device).to(op.dtype)
        self.z = torch.zeros(q.shape, dtype=torch.float64, device=op.device)

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        self.z += (p @ (p.T @ self.q)).double()

    def result(self) -> np.ndarray:
        return to_numpy(self.z)


class _Matmat:
    def __init__(self, op: GradientOperator, x: np.ndarray) -> None:
        self.x, self.op = x, op
        self.z = torch.zeros((op.shape[0], x.shape[1]), dtype=torch.float64, device=op.device)

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        xs = to_device(self.x[off : off + p.shape[1]], self.op.device, self.op.dtype)
        self.z += (p @ xs).double()

    def result(self) -> np.ndarray:
        return to_numpy(self.z)


class _Rmatmat:
    def __init__(self, op: GradientOperator, y: np.ndarray, sink: Sink) -> None:
        self.yt = torch.as_tensor(y.T.copy(), device=op.device).to(op.dtype)
        self.sink = sink

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        self.sink(off, to_numpy((self.yt @ p).T.double().contiguous()))

    def result(self) -> None:
        return None


class _Project:
    """The final pass: V = Hᵀ·U·Σ⁻¹ streamed to ``sink``; with ``verify``, H·V, VᵀV, ‖Hᵀu − σv‖².

    V is formed in the compute precision and rounded to its stored dtype; the
    checks use the V actually stored, V_s = V + Δ (Δ: the rounding).

    float64 products, given the Gram G of the same H (the exact method has it):
    H·V_s = G·Y + H·Δ with Y = U·Σ⁻¹: G·Y is an r×r×k product, and H·Δ (Δ is
    ~1e-7·V) is accurate enough in float32, so no float64 p-long product is needed.

    float32 products (``precision="float32"``, the default for float32 data): V is
    formed by one float32 GEMM per panel; in the same pass, with the panel still
    at hand, H·V_s is accumulated (float32 products, float64 sums across panels),
    VᵀV's off-diagonal likewise, and ‖v_i‖² in float64 from the float32 V (squares
    of float32 numbers are exact in float64). ‖v_i‖² is returned even without
    ``verify``: it is the Rayleigh quotient that refines σ (``_result.finalize``).
    """

    def __init__(
        self,
        op: GradientOperator,
        u: np.ndarray,
        sigma: np.ndarray,
        sink: Sink,
        out_dtype: Any,
        verify: bool,
        gram: np.ndarray | None = None,
    ) -> None:
        safe = np.where(sigma > 0, sigma, np.inf)
        y = u / safe
        dev = op.device
        # Yᵀ (k×r) contiguous: Yᵀ·P then a transposed view runs faster in MKL than Pᵀ·Y.
        self.yt = torch.as_tensor(y.T.copy(), device=dev).to(op.dtype)
        self.v_dtype = torch.float64 if np.dtype(out_dtype) == np.float64 else torch.float32
        self.sigma = torch.as_tensor(sigma, device=dev, dtype=torch.float64)
        self.sink, self.verify = sink, verify
        k = u.shape[1]
        # The shortcut needs V formed in float64: then Δ is all that differs from HᵀY.
        self.use_gram = gram is not None and op.dtype == torch.float64
        self.vtv = torch.zeros((k, k), dtype=torch.float64, device=dev)
        self.k_edges = block_edges(k, dev, dtype=op.dtype)
        if self.use_gram:
            gy = np.asarray(gram, dtype=np.float64) @ y
            self.hv = torch.as_tensor(gy, device=dev)  # H·V = G·Y; H·Δ is added per panel
            self.ytgy = y.T @ gy  # VᵀV = YᵀGY; the Δ terms are added per panel
        else:
            self.hv = torch.zeros((op.shape[0], k), dtype=torch.float64, device=dev)
        self.rt2 = torch.zeros(k, dtype=torch.float64, device=dev)
        # float32 products: ‖v_i‖² exactly (float64 sums of float32 squares), for the refinement.
        self.f32 = op.dtype == torch.float32
        self.n2 = torch.zeros(k, dtype=torch.float64, device=dev)

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        vpt = self.yt @ p  # Vᵀ of this panel (k×w), in the compute dtype
        # V's rows as stored (rounded to V's dtype): a fresh w×k tensor the sink may keep.
        vs = torch.empty(vpt.shape[::-1], dtype=self.v_dtype, device=vpt.device).copy_(vpt.T)
        self.sink(off, to_numpy(vs))
        if self.f32:
            self.n2 += torch.linalg.vector_norm(vpt, dim=1, dtype=torch.float64) ** 2
        if not self.verify:
            return
        if self.use_gram:
            if self.v_dtype == torch.float64:
                return  # V stored as computed: H·V = G·Y and VᵀV = YᵀGY exactly
            # Δ = stored − computed, ~1e-7·V: float32 products of Δ are exact to ~1e-14
            # of H·V and VᵀV (ΔᵀΔ is ~1e-14 of ΔᵀV_s and is left out).
            dt = (vs.T - vpt).float()  # Δᵀ (k×w)
            self.rt2 += torch.linalg.vector_norm(dt, dim=1).double() ** 2 * self.sigma**2
            p32 = raw if raw is not None and raw.dtype == torch.float32 else p.float()
            self.hv += (p32 @ dt.T).double()
            self.vtv += (dt @ vs.float()).double()
            return
        if self.f32:
            # Stored V equals the computed one (float32, or float32 widened exactly to float64):
            # the rounding term of rt2 is zero.
            if vs.dtype != torch.float32:
                vs = vpt.T
            self.hv += (p @ vs).double()
            sym_update(self.vtv, vpt, self.k_edges)
            return
        vs64 = vs.to(torch.float64)
        self.rt2 += torch.linalg.vector_norm(vs64.T - vpt, dim=1) ** 2 * self.sigma**2
        if p.dtype == torch.float64:
            self.hv.addmm_(p, vs64)
        else:
            self.hv += (p @ vs.to(p.dtype)).double()
        sym_update(self.vtv, vs64.T, self.k_edges)

    def result(self) -> dict[str, np.ndarray] | None:
        n2 = {"n2": to_numpy(self.n2)} if self.f32 else {}
        if not self.verify:
            return n2 or None
        if self.use_gram:
            c = to_numpy(self.vtv)
            vtv = self.ytgy + c + c.T
        else:
            vtv = sym_finish(self.vtv, self.k_edges)
            if self.f32:
                np.fill_diagonal(vtv, n2["n2"])  # the exact squared norms
        return {"hv": to_numpy(self.hv), "vtv": vtv, "rt2": to_numpy(self.rt2), **n2}


class GradientOperator:
    """The r×p gradient matrix H, streamed from a block source.

    Args:
        source: a gradient store (path or ``GradientStore``), a numpy array, a
            torch tensor or a dask array of shape (rows, parameters).
        rows: row selection (None = all committed rows, a slice, or indices).
        params: parameter patterns (globs or ``re:…``), resolved by the store's layout.
        col_ranges: explicit column ranges instead of ``params``.
        center: subtract the column means over the selected rows (off by default,
            as Li et al. 2022 analyse the uncentered H).
        device: ``"cpu"`` | ``"cuda"`` | ``"auto"``.
        precision: ``"auto"`` (float32 products for float32 data, else float64) | ``"float64"`` |
            ``"float32"`` | ``"tf32"`` (see ``_precision``).
        memory: host-memory budget in bytes for blocks in flight (None: 2 GiB).
        block_cols: columns per read block (default: the store's chunk width).
        prefetch: blocks read ahead on a background thread.
        progress: show a progress bar on stderr for each pass.

    Example:
        >>> H = np.random.default_rng(0).standard_normal((50, 300))
        >>> op = GradientOperator(H)
        >>> np.allclose(op.gram(), H @ H.T)
        True
    """

    def __init__(
        self,
        source: Any,
        *,
        rows: RowSelection = None,
        params: str | Sequence[str] | None = None,
        col_ranges: ColRanges = None,
        center: bool = False,
        device: str = "cpu",
        precision: str = "auto",
        memory: int | None = None,
        block_cols: int | None = None,
        prefetch: int = 2,
        progress: bool = False,
    ) -> None:
        self.source = make_source(source, rows=rows, params=params, col_ranges=col_ranges)
        self.shape: tuple[int, int] = tuple(self.source.shape)  # type: ignore[assignment]
        self.center = bool(center)
        self.device = resolve_device(device)
        self.precision = effective_precision(precision, getattr(self.source, "dtype", np.float64))
        self.dtype, tf32 = resolve_precision(self.precision, self.device)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
        self.progress = progress
        self.passes = 0
        self.row_sq_norms: np.ndarray | None = None
        r = self.shape[0]
        self.memory = int(memory) if memory is not None else 2 * 2**30
        self.panel_cols = int(np.clip((128 * 2**20) // (8 * r), 256, 8192))
        self.prefetch, self.block_cols = self._plan(block_cols, prefetch)

    def _plan(self, block_cols: int | None, prefetch: int) -> tuple[int, int]:
        r = self.shape[0]
        chunk = getattr(self.source, "chunk_cols", None)
        bc = int(block_cols or chunk or 8192)
        per_block = r * bc * 4  # float32 bytes of one read block
        panel = r * self.panel_cols * 8 * 3
        while prefetch > 0 and (prefetch + 1) * per_block + panel > self.memory:
            prefetch -= 1
        if per_block + panel > self.memory:
            if chunk is None and block_cols is None:
                bc = max(self.panel_cols, int((self.memory - panel) // (r * 4)))
            else:
                need = (per_block + panel) / 2**30
                raise ValueError(
                    f"a column block of {r} rows × {bc} columns needs {need:.2f} GiB, over the memory "
                    f"budget of {self.memory / 2**30:.2f} GiB; raise --memory or select fewer rows"
                )
        return prefetch, bc

    @property
    def r(self) -> int:
        return self.shape[0]

    @property
    def p(self) -> int:
        return self.shape[1]

    # ------------------------------------------------------------------ the pass
    def fused(self, consumers: Sequence[Any]) -> list[Any]:
        """One pass over H feeding every panel to each consumer; returns their results.

        The first pass also records the squared row norms of H (``row_sq_norms``;
        from the Gram's diagonal when a Gram is accumulated), which locate
        NaN/inf rows and give ‖H‖_F² for free.
        """
        r, p = self.shape
        first = self.row_sq_norms is None
        gram = next((c for c in consumers if isinstance(c, _Gram)), None)
        norms = None
        if first and gram is None:
            norms = torch.zeros(r, dtype=torch.float64, device=self.device)
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(
                total=p,
                unit="col",
                unit_scale=True,
                file=sys.stderr,
                leave=False,
                desc=f"pass {self.passes + 1}",
            )
        for off, block in self.source.iter_col_blocks(self.block_cols, self.prefetch):
            for j in range(0, block.shape[1], self.panel_cols):
                raw = to_device(block[:, j : j + self.panel_cols], self.device)
                panel = raw.to(self.dtype)
                if self.center:
                    panel = panel - panel.mean(dim=0, keepdim=True)
                    raw = None
                if norms is not None:
                    norms += torch.linalg.vector_norm(panel, dim=1).double() ** 2
                for c in consumers:
                    c.update(off + j, panel, raw)
            if bar is not None:
                bar.update(block.shape[1])
        if bar is not None:
            bar.close()
        self.passes += 1
        if first:
            self.row_sq_norms = to_numpy(gram.g.diagonal().clone() if gram is not None else norms)
            bad = np.flatnonzero(~np.isfinite(self.row_sq_norms))
            if bad.size:
                self.row_sq_norms = None
                raise ValueError(
                    f"H has NaN or inf in {bad.size} selected row(s), e.g. row {int(bad[0])} of the "
                    "selection; exclude them with --rows or recollect"
                )
        return [c.result() for c in consumers]

    @property
    def frob2(self) -> float:
        """‖H‖_F² (after a pass)."""
        if self.row_sq_norms is None:
            self.fused([])
        return float(self.row_sq_norms.sum())  # type: ignore[union-attr]

    # ------------------------------------------------------------------ products
    def gram(self) -> np.ndarray:
        """H·Hᵀ (r×r, float64) in one pass."""
        return self.fused([_Gram(self)])[0]

    def hht(self, q: np.ndarray) -> np.ndarray:
        """H·Hᵀ·Q (r×b, float64) in one pass."""
        return self.fused([_HHt(self, np.asarray(q, dtype=np.float64))])[0]

    def matmat(self, x: np.ndarray) -> np.ndarray:
        """H·X for X of shape (p, b) (or (p,)), float64."""
        x = np.asarray(x, dtype=np.float64)
        vec = x.ndim == 1
        x2 = x[:, None] if vec else x
        if x2.shape[0] != self.p:
            raise ValueError(f"matmat needs X with {self.p} rows, got shape {x.shape}")
        z = self.fused([_Matmat(self, x2)])[0]
        return z[:, 0] if vec else z

    def rmatmat(self, y: np.ndarray, sink: Sink | None = None) -> np.ndarray | None:
        """Hᵀ·Y for Y of shape (r, b); streamed to ``sink(offset, rows)`` if given, else returned."""
        y = np.asarray(y, dtype=np.float64)
        vec = y.ndim == 1
        y2 = y[:, None] if vec else y
        if y2.shape[0] != self.r:
            raise ValueError(f"rmatmat needs Y with {self.r} rows, got shape {y.shape}")
        out = None
        if sink is None:
            out = ArraySink(self.p, y2.shape[1], np.float64)
            sink = out
        self.fused([_Rmatmat(self, y2, sink)])
        if out is None:
            return None
        return out.array[:, 0] if vec else out.array

    def project(
        self,
        u: np.ndarray,
        sigma: np.ndarray,
        sink: Sink,
        *,
        out_dtype: Any = np.float32,
        verify: bool = True,
        gram: np.ndarray | None = None,
    ) -> dict[str, np.ndarray] | None:
        """Stream V = Hᵀ·U·Σ⁻¹ to ``sink``; with ``verify`` also return H·V, VᵀV and ‖Hᵀu−σv‖².

        ``gram``: H·Hᵀ from an earlier pass, which saves a float64 product (see ``_Project``).
        """
        sigma = np.asarray(sigma, dtype=np.float64)
        return self.fused([_Project(self, u, sigma, sink, out_dtype, verify, gram)])[0]

    def to_scipy(self):
        """A ``scipy.sparse.linalg.LinearOperator`` (float64); each product is one pass."""
        return scipy_operator(self)

    def describe(self) -> dict[str, Any]:
        return {**self.source.describe(), "shape": list(self.shape), "center": self.center}

    def __repr__(self) -> str:
        return f"GradientOperator(shape={self.shape}, device={self.device}, precision={self.precision})"


def scipy_operator(op: Any):
    """Wrap anything with ``shape``, ``matmat`` and ``rmatmat`` as a scipy LinearOperator."""
    from scipy.sparse.linalg import LinearOperator

    return LinearOperator(
        op.shape,
        dtype=np.float64,
        matvec=op.matmat,
        rmatvec=op.rmatmat,
        matmat=op.matmat,
        rmatmat=op.rmatmat,
    )
