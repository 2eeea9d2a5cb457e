"""Dense kernels of the streamed passes: the Gram kernels G += P·Pᵀ and the symmetric block update.

The Gram G = Σ P·Pᵀ over panels P (r×w) is symmetric, so one triangle holds
all of it: r²w flops per panel (BLAS ``syrk``) instead of the 2r²w of one
full GEMM. Which routine runs fastest depends on the machine — measured on a
2-core AMD EPYC with OpenBLAS (issue 21), numpy's float32 ``P @ P.T`` (which
calls ``ssyrk``) was 1.76× faster than torch's full GEMM, while on a 2-core
Xeon with MKL the full torch GEMM beat OpenBLAS's ``syrk`` — so the kernel is
chosen by measurement (``_kernel_choice``), and each one is exact to rounding
against a float64 dense reference. Every kernel accumulates in float64 across
panels; inside a panel the products run in the panel's dtype (float32 or
float64; narrower panels are widened to float32 first, see ``_precision``).

The registry (``GRAM_KERNELS``) names the valid choices:

- ``numpy-syrk``: numpy ``P @ P.T`` (numpy recognises the transposed pair and calls
  its BLAS ``syrk``), added to a float64 G. CPU.
- ``scipy-syrk``: ``scipy.linalg.blas.dsyrk`` accumulating into G's lower triangle in
  place (float64 panels), or ``ssyrk`` into a reused float32 triangle added to G. CPU.
- ``torch-blocked``: torch GEMMs on the upper block triangle only (blocks of
  ``BLOCK_ROWS`` rows: b(b+1)/2 products instead of b²). CPU or CUDA.
- ``torch-gemm``: one full torch GEMM per panel. CPU or CUDA (the only one used on CUDA
  unless asked for: compute is not the bottleneck there).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

#: Rows per block of the triangular update (measured best for r = 300…2000 on MKL, AVX-512).
BLOCK_ROWS = 200


def block_edges(
    n: int, device: torch.device, block_rows: int = BLOCK_ROWS, dtype: torch.dtype = torch.float64
) -> list[int]:
    """Row-block edges for a symmetric update of an n×n matrix ([0, n]: one full GEMM).

    ``dtype``: the dtype of the panels multiplied; float32 panels use one full GEMM
    (each block product would need its own float32 temporary added to float64).
    """
    nb = 1 if device.type != "cpu" or dtype != torch.float64 else max(1, round(n / block_rows))
    return [int(e) for e in np.linspace(0, n, nb + 1).round()]


def sym_update(g: torch.Tensor, a: torch.Tensor, edges: list[int]) -> None:
    """g += a·aᵀ on the upper block triangle of g (float64, n×n); a is n×w.

    With a float64 ``a`` the products accumulate in place (``addmm_``); with a
    float32 ``a`` each block product runs in float32 (or TF32) and is added to
    g in float64. With one block the whole of g is updated. Call
    :func:`sym_finish` once at the end.
    """
    exact = a.dtype == g.dtype
    for i in range(len(edges) - 1):
        ai = a[edges[i] : edges[i + 1]]
        for j in range(i, len(edges) - 1):
            gij = g[edges[i] : edges[i + 1], edges[j] : edges[j + 1]]
            aj = a[edges[j] : edges[j + 1]]
            if exact:
                gij.addmm_(ai, aj.T)
            else:
                gij.add_(ai @ aj.T)  # float32 product, added in float64 (type promotion)


def sym_finish(g: torch.Tensor, edges: list[int]) -> np.ndarray:
    """The full symmetric matrix (numpy float64) from what :func:`sym_update` accumulated."""
    out = g.detach().cpu().numpy()
    upper = np.zeros_like(out, dtype=bool)
    diag = np.zeros_like(upper)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        upper[a:b, a:] = True
        diag[a:b, a:b] = True
    full = np.where(upper, out, out.T)
    # Diagonal blocks were computed whole: average them with their transposes.
    full = np.where(diag, (full + full.T) / 2, full)
    return np.ascontiguousarray(full)


class GramKernel:
    """G = Σ P·Pᵀ (r×r, float64) over the panels handed to :meth:`update`."""

    name: ClassVar[str]
    #: Runs on host memory only (numpy/scipy BLAS).
    cpu_only: ClassVar[bool] = False

    def __init__(self, r: int, device: torch.device) -> None:
        self.r, self.device = r, device

    def update(self, panel: torch.Tensor) -> None:
        """G += P·Pᵀ for a float32 or float64 panel P (r×w) on the kernel's device."""
        raise NotImplementedError

    def diagonal(self) -> np.ndarray:
        """diag(G) so far (the squared row norms of H as the kernel computed them)."""
        raise NotImplementedError

    def result(self) -> np.ndarray:
        """The full symmetric G (numpy float64, C-contiguous)."""
        raise NotImplementedError


class TorchGemm(GramKernel):
    name = "torch-gemm"

    def __init__(self, r: int, device: torch.device) -> None:
        super().__init__(r, device)
        self.g = torch.zeros((r, r), dtype=torch.float64, device=device)

    def update(self, panel: torch.Tensor) -> None:
        if panel.dtype == torch.float64:
            self.g.addmm_(panel, panel.T)
        else:
            self.g.add_(panel @ panel.T)  # float32 product, added in float64

    def diagonal(self) -> np.ndarray:
        return self.g.diagonal().detach().cpu().numpy().copy()

    def result(self) -> np.ndarray:
        return sym_finish(self.g, [0, self.r])


class TorchBlocked(GramKernel):
    name = "torch-blocked"

    def __init__(self, r: int, device: torch.device, block_rows: int = BLOCK_ROWS) -> None:
        super().__init__(r, device)
        self.g = torch.zeros((r, r), dtype=torch.float64, device=device)
        nb = max(1, round(r / block_rows))
        self.edges = [int(e) for e in np.linspace(0, r, nb + 1).round()]

    def update(self, panel: torch.Tensor) -> None:
        sym_update(self.g, panel, self.edges)

    def diagonal(self) -> np.ndarray:
        return self.g.diagonal().detach().cpu().numpy().copy()

    def result(self) -> np.ndarray:
        return sym_finish(self.g, self.edges)


def _host(panel: torch.Tensor) -> np.ndarray:
    if panel.device.type != "cpu":
        raise ValueError(f"this Gram kernel runs on the CPU; the panels are on {panel.device}")
    return panel.detach().numpy()


class NumpySyrk(GramKernel):
    name = "numpy-syrk"
    cpu_only = True

    def __init__(self, r: int, device: torch.device) -> None:
        super().__init__(r, device)
        self.g = np.zeros((r, r), dtype=np.float64)

    def update(self, panel: torch.Tensor) -> None:
        a = _host(panel)
        np.add(self.g, a @ a.T, out=self.g)  # numpy calls syrk for a @ a.T; filled both ways

    def diagonal(self) -> np.ndarray:
        return np.diag(self.g).copy()

    def result(self) -> np.ndarray:
        return np.ascontiguousarray((self.g + self.g.T) / 2)


class ScipySyrk(GramKernel):
    name = "scipy-syrk"
    cpu_only = True

    def __init__(self, r: int, device: torch.device) -> None:
        super().__init__(r, device)
        self.g = np.zeros((r, r), dtype=np.float64)
        self._gf = self.g.T  # Fortran-ordered view: BLAS updates its upper = g's lower triangle
        self._c32: np.ndarray | None = None

    def update(self, panel: torch.Tensor) -> None:
        from scipy.linalg import blas

        a = _host(panel)
        # aᵀ (w×r) is Fortran-ordered when a is C-ordered: trans=1 gives (aᵀ)ᵀ·aᵀ = a·aᵀ.
        if a.dtype == np.float64:
            out = blas.dsyrk(1.0, a.T, beta=1.0, c=self._gf, trans=1, overwrite_c=1)
            if out is not self._gf:  # BLAS worked on a copy: keep its sum
                self._gf[...] = out
            return
        if self._c32 is None:
            self._c32 = np.zeros((self.r, self.r), dtype=np.float32, order="F")
        c = blas.ssyrk(1.0, a.T, beta=0.0, c=self._c32, trans=1, overwrite_c=1)
        np.add(self._gf, c, out=self._gf)  # c's other triangle stays zero (never written)

    def diagonal(self) -> np.ndarray:
        return np.diag(self.g).copy()

    def result(self) -> np.ndarray:
        low = np.tril(self.g)
        return np.ascontiguousarray(low + np.tril(self.g, -1).T)


#: The Gram kernels by name (``--kernel``); ``auto`` chooses among them by measurement.
GRAM_KERNELS: dict[str, type[GramKernel]] = {
    k.name: k for k in (NumpySyrk, ScipySyrk, TorchBlocked, TorchGemm)
}
KERNEL_CHOICES = ("auto", *GRAM_KERNELS)


def gram_kernel(name: str, device: torch.device) -> type[GramKernel]:
    """The kernel class for ``name`` on ``device``.

    Raises:
        ValueError: an unknown name (naming the valid ones), or a CPU kernel on CUDA.
    """
    cls = GRAM_KERNELS.get(str(name))
    if cls is None:
        raise ValueError(f"unknown Gram kernel {name!r}; choose one of: {', '.join(KERNEL_CHOICES)}")
    if cls.cpu_only and device.type != "cpu":
        gpu = [k for k, c in GRAM_KERNELS.items() if not c.cpu_only]
        raise ValueError(
            f"the Gram kernel {name!r} runs on the CPU; on {device.type} choose one of: {', '.join(gpu)}"
        )
    return cls


def default_kernel(dtype: torch.dtype, device: torch.device) -> str:
    """The kernel used without a measurement: one full GEMM on CUDA; numpy's ``syrk`` for
    float32 panels on the CPU (half the flops of a GEMM, and it leaves the GIL to the reads:
    in the Gram pass of a 1,500 × 4e5 float32 store on a 2-core EPYC, 2026-12-02, it took
    6.3-6.9 s against torch's full GEMM's ~2x slower rate, which was this default); blocked
    GEMMs for float64 on the CPU (measured on MKL; see ``block_edges``)."""
    if device.type != "cpu":
        return TorchGemm.name
    return NumpySyrk.name if dtype != torch.float64 else TorchBlocked.name
