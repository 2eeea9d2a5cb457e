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

from gradspec._norms import sq_norms64
from gradspec._seeds import MASK64, mix64
from gradspec.linalg._kernels import block_edges, sym_finish, sym_update
from gradspec.linalg._operator_base import Sink
from gradspec.linalg._precision import cast_into, to_device, to_numpy


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


def form_v(
    y: torch.Tensor, p: torch.Tensor, v_dtype: torch.dtype, k: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (Pᵀ·Y (w×n) in the compute dtype; its first k columns — V's rows — as stored, rounded
    to ``v_dtype``). Both are fresh a sink may keep. Columns of Y past the k of V ride along in
    the same read of P. torch it is: on a quiet 2-core EPYC (2026-11-27) the product alone ran
    faster in numpy (OpenBLAS Yᵀ·P 124 GFLOP/s against torch's 77; r = 1,500, a 4,096-column
    panel, 316 columns of Y), yet inside the V pass (pca of an in-memory 1,500 × 4e5 float32 H,
    k = 300, two runs each) numpy made the pass slower: 9.2-9.4 s against 7.9-8.3 s."""
    out = p.T @ y
    v = out[:, :k]
    return out, (v if v.dtype == v_dtype else v.to(v_dtype))


class Widen:
    """Float32 panels widened to float64 in reused buffers, one per name (exact: float32
    numbers are float64 numbers; no temporary the size of the panel per call)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bufs: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64:
            return x
        buf = self.bufs.get(name)
        if buf is None or buf.numel() < x.numel():
            buf = self.bufs[name] = torch.empty(x.numel(), dtype=torch.float64, device=self.device)
        return cast_into(buf, x)


#: Columns of H whose p-side probes one generator draws (aligned at multiples of it; the
#: widest panel, so a panel takes one or two tiles).
PROBE_TILE = 8192


def panel_gaussians(seed: int, col: int, w: int, s: int, cache: dict | None = None) -> torch.Tensor:
    """The w×s Gaussian probes of columns [col, col + w) of H (CPU, float32 draws).

    Every tile of ``PROBE_TILE`` columns draws from its own generator, seeded by a hash of
    (``seed``, tile): a column's probes depend on its index in H only, not on how the pass cuts
    H into blocks and panels, so a Dask worker, which sees only its block, draws what the local
    pass draws. ``cache`` keeps the last tile drawn, for the next panel (panels come in column
    order). float32 draws are N(0, 1) rounded to 24 bits, which moves the χ² quantiles the
    bounds use by ~1e-7 of themselves."""
    first, last = col // PROBE_TILE, (col + w - 1) // PROBE_TILE
    parts = []
    for t in range(first, last + 1):
        tile = None if cache is None else cache.get(t)
        if tile is None:
            gen = torch.Generator().manual_seed(mix64(mix64(int(seed) & MASK64) ^ t) >> 1)
            tile = torch.randn(PROBE_TILE, s, generator=gen)
            if cache is not None:
                cache.clear()
                cache[t] = tile
        lo, hi = max(col, t * PROBE_TILE), min(col + w, (t + 1) * PROBE_TILE)
        parts.append(tile[lo - t * PROBE_TILE : hi - t * PROBE_TILE])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class HtProbes:
    """Gaussian probes of E = Hᵀ·U − V_s·Σ from the p side, in float64 (the ``cheap`` check
    of float32 products).

    V formed by float32 products differs from Hᵀ·U·Σ⁻¹ by the float32 arithmetic that
    formed it (~√r·u relative, u = 2⁻²⁴); nothing in the pass knows Hᵀ·U more accurately.
    For s Gaussian probes G (p×s), Gᵀ·E = (H·G)ᵀ·U − (Gᵀ·V_s)·Σ, and ‖Gᵀe_i‖² = ‖e_i‖²·χ²_s
    exactly, whatever e_i is: the per-vector estimate and joint bound of ``_verify``, as
    for the probes of H·V. Per panel P (r×w): draw G's w rows, widen P and V_s's rows to
    float64 (exact) and add Gᵀ·Pᵀ (s×r) and Gᵀ·V_s (s×k): 2ws(r + k) float64 flops against
    V's 2wrk float32. Σ is applied in ``_result.finalize``, after the Rayleigh-quotient
    refinement has set it.
    """

    def __init__(self, op: Any, k: int, s: int, seed: int, col0: int) -> None:
        dev = op.device
        self.seed, self.col0, self.s, self.dev = int(seed), int(col0), int(s), dev
        self.a = torch.zeros((s, op.shape[0]), dtype=torch.float64, device=dev)  # Gᵀ·Hᵀ
        self.b = torch.zeros((s, k), dtype=torch.float64, device=dev)  # Gᵀ·V_s
        self.wide = Widen(dev)
        self.tiles: dict[int, torch.Tensor] = {}

    def update(self, off: int, p: torch.Tensor, vs: torch.Tensor) -> None:
        g = panel_gaussians(self.seed, self.col0 + off, p.shape[1], self.s, self.tiles)
        gt = g.to(self.dev, torch.float64).T
        self.a.addmm_(gt, self.wide("p", p).T)
        self.b.addmm_(gt, self.wide("v", vs))

    def result(self) -> dict[str, np.ndarray]:
        return {"probe_ht": to_numpy(self.a), "probe_ht_v": to_numpy(self.b)}


class _Project:
    """The final pass: V = Hᵀ·U·Σ⁻¹ streamed to ``sink``, and the products its check needs.

    V is formed in the compute precision and rounded to its stored dtype; every
    check uses the V actually stored, V_s = V + Δ (Δ: the rounding). ‖v_i‖² is
    always accumulated in float64 (squares of float32 numbers are exact in
    float64): it is the Rayleigh quotient that refines σ for float32 products
    (``_result.finalize``) and says whether each stored column is a unit vector.
    ``verify`` says what else is measured:

    - ``"cheap"`` (pca's default): Ωᵀ·H·V_s for s Gaussian probes Ω (r×s): PᵀΩ comes
      from the GEMM that forms V (Y and Ω side by side, one read of P), then one s×k
      product per panel (2ps(r + k) flops against the 2prk of V itself); compared in
      ``_verify`` with Ωᵀ·U·Σ. For ‖Hᵀu − σv‖: with float64 products, ‖Δ‖² per column
      (V formed in float64 differs from Hᵀ·U·Σ⁻¹ by ~1e-16 relative, Δ is all there is);
      with float32 products, s Gaussian probes from the p side in float64 (``HtProbes``).
    - ``"full"``: H·V_s (r×k), V_sᵀV_s and ‖Hᵀu − σv‖², a second product the size of V's.
      With float64 products and the Gram G of the same H (the exact method has it),
      H·V_s = G·Y + H·Δ with Y = U·Σ⁻¹: G·Y is an r×r×k product, and H·Δ (Δ is ~1e-7·V)
      is accurate enough in float32. With float32 products, VᵀV's off-diagonal is float32
      products summed across panels in float64, and H·V_s and Hᵀ·U are float64 products
      of the widened panel (two products the size of V's, in float64): float32 ones would
      err by as much as the residuals they measure.
    - ``"none"``: nothing more (``residual_ht`` is then not measured: NaN).

    ``seed`` seeds the p-side probes; ``col0`` is the column of H where this operator's
    column 0 lies (a Dask worker's block), so that every column gets its own draws.
    """

    name = "project"

    def __init__(
        self,
        op: Any,
        u: np.ndarray,
        sigma: np.ndarray,
        sink: Sink,
        out_dtype: Any,
        verify: str,
        gram: np.ndarray | None = None,
        omega: np.ndarray | None = None,
        seed: int = 0,
        col0: int = 0,
    ) -> None:
        safe = np.where(sigma > 0, sigma, np.inf)
        y = u / safe
        dev = op.device
        self.y = torch.as_tensor(y, device=dev).to(op.dtype)  # Y = U·Σ⁻¹ (r×k)
        self.v_dtype = torch.float64 if np.dtype(out_dtype) == np.float64 else torch.float32
        self.sigma = torch.as_tensor(sigma, device=dev, dtype=torch.float64)
        self.sink, self.verify = sink, verify
        k = u.shape[1]
        self.k = k
        self.f32 = op.dtype == torch.float32
        self.n2 = torch.zeros(k, dtype=torch.float64, device=dev)
        self.rt2 = torch.zeros(k, dtype=torch.float64, device=dev)
        self.ht: HtProbes | None = None
        if verify == "cheap":
            if omega is None:
                raise ValueError("the cheap check needs its Gaussian probes (omega)")
            # [Y, Ω]: one GEMM per panel gives V's rows and PᵀΩ, so P is read once.
            om = torch.as_tensor(omega, device=dev).to(op.dtype)
            self.y = torch.cat([self.y, om], dim=1)
            self.probe = torch.zeros((omega.shape[1], k), dtype=torch.float64, device=dev)
            if self.f32:
                self.ht = HtProbes(op, k, omega.shape[1], seed, col0)
            return
        if verify != "full":
            return
        if self.f32:
            # Hᵀu_i − σ_i·v_i measured with Hᵀ·U in float64; its dot with v_i too, so that
            # the residual against the refined σ follows (``_result.finalize``).
            self.u64 = torch.as_tensor(u, device=dev, dtype=torch.float64)
            self.rt_cross = torch.zeros(k, dtype=torch.float64, device=dev)
            self.wide = Widen(dev)
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

    def flops(self, r: int, p: int) -> float:
        return 2.0 * r * p * self.k

    def update(self, off: int, p: torch.Tensor, raw: torch.Tensor | None) -> None:
        out, vs = form_v(self.y, p, self.v_dtype, self.k)
        v = out[:, : self.k]
        self.sink(off, to_numpy(vs))
        rounded = vs.dtype != v.dtype and vs.dtype == torch.float32  # V stored narrower
        self.n2 += sq_norms64(vs, 0)  # of V as stored (float64 sums of exact squares)
        if self.verify == "none":
            return
        if self.verify == "cheap":
            if rounded:
                self.rt2 += sq_norms64(vs.to(v.dtype) - v, 0) * self.sigma**2
            vprobe = vs if vs.dtype == p.dtype else vs.to(p.dtype)  # exact: the stored values
            self.probe += (out[:, self.k :].T @ vprobe).double()  # (PᵀΩ)ᵀ·V_s = Ωᵀ·P·V_s
            if self.ht is not None:
                self.ht.update(off, p, vs)
            return
        self._full(p, raw, v.T, vs)

    def _full(self, p: torch.Tensor, raw: torch.Tensor | None, vpt: torch.Tensor, vs: torch.Tensor) -> None:
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
            # Stored V equals the computed one (float32, or float32 widened exactly to float64).
            if vs.dtype != torch.float32:
                vs = vpt.T
            sym_update(self.vtv, vpt, self.k_edges)
            # H·V_s and Hᵀ·U in float64 (the widened panel and V_s are exact): float32 products
            # would err by as much as the residuals they measure.
            # raw in float64 (a centred panel, or a float64 H taken in float32 products) is the
            # matrix itself; the compute panel is its rounding
            p64 = raw if raw is not None and raw.dtype == torch.float64 else self.wide("p", p)
            v64 = self.wide("v", vs)
            self.hv.addmm_(p64, v64)
            e = torch.addmm(v64 * self.sigma, p64.T, self.u64, beta=-1.0)  # Pᵀ·U − V_s·Σ
            self.rt2 += (e * e).sum(dim=0)
            self.rt_cross += (e * v64).sum(dim=0)
            return
        vs64 = vs.to(torch.float64)
        self.rt2 += torch.linalg.vector_norm(vs64.T - vpt, dim=1) ** 2 * self.sigma**2
        if p.dtype == torch.float64:
            self.hv.addmm_(p, vs64)
        else:
            self.hv += (p @ vs.to(p.dtype)).double()
        sym_update(self.vtv, vs64.T, self.k_edges)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n2": to_numpy(self.n2)}
        if self.verify == "none":
            return out
        out["rt2"] = to_numpy(self.rt2)
        if self.verify == "cheap":
            out["probe"] = to_numpy(self.probe)
            if self.ht is not None:
                del out["rt2"]  # the p-side probes measure all of Hᵀu − σv
                out.update(self.ht.result())
            return out
        if self.f32:
            out["rt_cross"] = to_numpy(self.rt_cross)
        if self.use_gram:
            c = to_numpy(self.vtv)
            vtv = self.ytgy + c + c.T
        else:
            vtv = sym_finish(self.vtv, self.k_edges)
            if self.f32:
                np.fill_diagonal(vtv, out["n2"])  # the exact squared norms
        return {**out, "hv": to_numpy(self.hv), "vtv": vtv}
