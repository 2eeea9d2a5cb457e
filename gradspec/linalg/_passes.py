"""What one pass over H computes: the consumers that ``GradientOperator.fused`` feeds.

Each consumer gets every panel P (r×w, in the compute dtype, on the device)
with its column offset, through ``update(offset, panel, raw)`` (``raw``: the
panel as read, before any cast or centering, or None), and returns its product
from ``result()``; one read of H serves every consumer of a fused pass.
``name`` and ``flops(r, p)`` (symmetric-counted: r²p for the Gram, 2rpb for a
product with b columns) say what the pass did, for the rates it records.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gradspec.linalg._kernels import block_edges, sym_finish, sym_update
from gradspec.linalg._operator_base import Sink
from gradspec.linalg._precision import to_device, to_numpy


class _Gram:
    """G = Σ P·Pᵀ over panels, accumulated in float64 by the operator's Gram kernel."""

    name = "gram"

    def __init__(self, op: Any) -> None:
        self.kernel = op.gram_kernel()(op.shape[0], op.device)

    def flops(self, r: int, p: int) -> float:
        return float(r) * r * p

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        self.kernel.update(p)

    def diagonal(self) -> np.ndarray:
        return self.kernel.diagonal()

    def result(self) -> np.ndarray:
        return self.kernel.result()


class _HHt:
    """Z = H·Hᵀ·Q in one pass."""

    name = "hht"

    def __init__(self, op: Any, q: np.ndarray) -> None:
        self.q = torch.as_tensor(q, device=op.device).to(op.dtype)
        self.z = torch.zeros(q.shape, dtype=torch.float64, device=op.device)

    def flops(self, r: int, p: int) -> float:
        return 4.0 * r * p * self.q.shape[1]

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        self.z += (p @ (p.T @ self.q)).double()

    def result(self) -> np.ndarray:
        return to_numpy(self.z)


class _Matmat:
    name = "matmat"

    def __init__(self, op: Any, x: np.ndarray) -> None:
        self.x, self.op = x, op
        self.z = torch.zeros((op.shape[0], x.shape[1]), dtype=torch.float64, device=op.device)

    def flops(self, r: int, p: int) -> float:
        return 2.0 * r * p * self.x.shape[1]

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        xs = to_device(self.x[off : off + p.shape[1]], self.op.device, self.op.dtype)
        self.z += (p @ xs).double()

    def result(self) -> np.ndarray:
        return to_numpy(self.z)


class _Rmatmat:
    name = "rmatmat"

    def __init__(self, op: Any, y: np.ndarray, sink: Sink) -> None:
        self.yt = torch.as_tensor(y.T.copy(), device=op.device).to(op.dtype)
        self.sink = sink

    def flops(self, r: int, p: int) -> float:
        return 2.0 * r * p * self.yt.shape[0]

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

    name = "project"

    def __init__(
        self,
        op: Any,
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

    def flops(self, r: int, p: int) -> float:
        return 2.0 * r * p * int(self.yt.shape[0])

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
