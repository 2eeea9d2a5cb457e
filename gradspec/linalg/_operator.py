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
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gradspec._device import resolve_device
from gradspec._units import size_text
from gradspec.linalg._kernel_choice import check_gram_pass, choose_gram_kernel
from gradspec.linalg._kernels import GramKernel, gram_kernel
from gradspec.linalg._operator_base import ArraySink, OperatorBase, Sink, scipy_operator
from gradspec.linalg._passes import _Gram, _HHt, _Matmat, _Project, _Rmatmat
from gradspec.linalg._precision import (
    cast_into,
    effective_precision,
    resolve_precision,
    to_device,
    to_numpy,
)
from gradspec.linalg._sources import ColRanges, RowSelection, make_source

logger = logging.getLogger(__name__)


def pass_record(name: str, seconds: float, waited: float | None, nbytes: int, flops: float) -> dict[str, Any]:
    """One ``pass_log`` entry: what a pass did and the rates it achieved."""
    return {
        "pass": name,
        "seconds": seconds,
        "read_wait": waited,
        "bytes_read": nbytes,
        "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else None,
        "gflops": flops / seconds / 1e9 if seconds > 0 and flops else None,
    }


class GradientOperator(OperatorBase):
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
        prefetch: blocks read ahead on a background thread (the next block is read while
            the current one multiplies).
        kernel: the Gram kernel: ``"auto"`` (measured once per machine, see
            ``_kernel_choice``) or a name of ``_kernels.GRAM_KERNELS``.
        kernel_cache: directory of the kernel-choice cache (default: the user's cache).
        progress: show a progress bar on stderr for each pass.

    Each pass appends what it did to ``pass_log``: its consumers, seconds, the time spent
    waiting for reads, bytes read, GB/s and symmetric-counted GFLOP/s.

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
        kernel: str = "auto",
        kernel_cache: str | None = None,
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
        if kernel != "auto":
            gram_kernel(kernel, self.device)  # an unknown name or a CPU kernel on CUDA: now
        self.kernel, self.kernel_cache = str(kernel), kernel_cache
        self.kernel_choice: tuple[str, str] | None = None
        self.progress = progress
        self.passes = 0
        self.pass_log: list[dict[str, Any]] = []
        self.row_sq_norms: np.ndarray | None = None
        self._buf: torch.Tensor | None = None
        r = self.shape[0]
        self.memory = int(memory) if memory is not None else 2 * 2**30
        self.panel_cols = int(np.clip((128 * 2**20) // (8 * r), 256, 8192))
        self.prefetch, self.block_cols = self._plan(block_cols, prefetch)

    def _plan(self, block_cols: int | None, prefetch: int) -> tuple[int, int]:
        r = self.shape[0]
        chunk = getattr(self.source, "chunk_cols", None)
        bc = int(block_cols or chunk or 8192)
        per_block = r * bc * int(getattr(self.source, "read_itemsize", None) or 4)  # one block as read
        panel = r * self.panel_cols * 8 * 3
        while prefetch > 0 and (prefetch + 1) * per_block + panel > self.memory:
            prefetch -= 1
        if per_block + panel > self.memory:
            if chunk is None and block_cols is None:
                bc = max(self.panel_cols, int((self.memory - panel) // (r * 4)))
            else:
                raise ValueError(
                    f"a column block of {r} rows × {bc} columns needs {size_text(per_block + panel)}, over "
                    f"the memory budget for blocks in flight, {size_text(self.memory)} (pca gives them "
                    "half of --memory); raise --memory or select fewer rows"
                )
        return prefetch, bc

    def gram_kernel(self) -> type[GramKernel]:
        """The Gram kernel of this operator, chosen on first use (see ``_kernel_choice``)."""
        if self.kernel_choice is None:
            r, p = self.shape
            self.kernel_choice = choose_gram_kernel(
                self.kernel, dtype=self.dtype, device=self.device, flops=float(r) * r * p,
                cache=self.kernel_cache, rows=r,
            )
            logger.info("Gram kernel %s (%s)", *self.kernel_choice)
        return gram_kernel(self.kernel_choice[0], self.device)

    def _compute_panel(self, raw: torch.Tensor) -> torch.Tensor:
        """The panel in the compute dtype; narrower panels are widened into a reused buffer."""
        if raw.dtype == self.dtype:
            return raw
        if self._buf is None or self._buf.numel() < raw.numel():
            self._buf = torch.empty(self.shape[0] * self.panel_cols, dtype=self.dtype, device=self.device)
        return cast_into(self._buf, raw)

    def _nbytes(self, block: Any) -> int:
        """Bytes a block took to read (a store's on-disk dtype, else the block's own)."""
        size = getattr(self.source, "read_itemsize", None)
        if size is None:
            size = block.itemsize if isinstance(block, np.ndarray) else block.element_size()
        return int(size) * int(np.prod(block.shape))

    # ------------------------------------------------------------------ the pass
    def fused(self, consumers: Sequence[Any]) -> list[Any]:
        """One pass over H feeding every panel to each consumer; returns their results.

        The first pass also records the squared row norms of H (``row_sq_norms``;
        from the Gram's diagonal when a Gram is accumulated), which locate
        NaN/inf rows and give ‖H‖_F² for free. Blocks are read ahead by the source
        (``prefetch``), so reading overlaps the products; ``pass_log`` records the time
        the products waited for a read.
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
        t0 = time.perf_counter()
        waited, nbytes = 0.0, 0
        blocks = iter(self.source.iter_col_blocks(self.block_cols, self.prefetch))
        while True:
            tw = time.perf_counter()
            item = next(blocks, None)
            waited += time.perf_counter() - tw
            if item is None:
                break
            off, block = item
            nbytes += self._nbytes(block)
            for j in range(0, block.shape[1], self.panel_cols):
                raw = to_device(block[:, j : j + self.panel_cols], self.device)
                if self.center:
                    # centred in float64 and rounded once: in the compute dtype the column means'
                    # rounding (u·|mean|) swamped rows that vary little about a large mean, and the
                    # checks measured that rounded matrix (found by review: max residual 1e-6
                    # reported, 8.6e-4 true, with a mean row norm of 30 and sigma_1 of 1e-3)
                    wide = raw.to(torch.float64, copy=True)  # never the source's own memory
                    wide -= wide.mean(dim=0, keepdim=True)
                    panel = wide if self.dtype == torch.float64 else self._compute_panel(wide)
                    raw = wide  # the centred H itself, for the checks that widen the panel
                else:
                    panel = self._compute_panel(raw)
                if norms is not None:
                    norms += torch.linalg.vector_norm(panel, dim=1).double() ** 2
                for c in consumers:
                    c.update(off + j, panel, raw)
            if bar is not None:
                bar.update(block.shape[1])
        if bar is not None:
            bar.close()
        self._log_pass(consumers, time.perf_counter() - t0, waited, nbytes)
        if first:
            self.row_sq_norms = gram.diagonal() if gram is not None else to_numpy(norms)
            bad = np.flatnonzero(~np.isfinite(self.row_sq_norms))
            if bad.size:
                self.row_sq_norms = None
                raise ValueError(
                    f"H has NaN or inf in {bad.size} selected row(s), e.g. row {int(bad[0])} of the "
                    "selection; exclude them with --rows or recollect"
                )
        return [c.result() for c in consumers]

    def _log_pass(self, consumers: Sequence[Any], seconds: float, waited: float, nbytes: int) -> None:
        r, p = self.shape
        flops = sum(c.flops(r, p) for c in consumers)
        self.passes += 1
        name = "+".join(c.name for c in consumers) or "norms"
        self.pass_log.append(pass_record(name, seconds, waited, nbytes, flops))
        if name == "gram" and self.kernel == "auto" and self.kernel_choice is not None:
            # a pass far faster than its kernel's cached rate: that measurement was taken under load
            check_gram_pass(self.kernel_choice[0], dtype=self.dtype, device=self.device, flops=flops,
                            gflops=self.pass_log[-1]["gflops"], cache=self.kernel_cache, rows=r)

    # ------------------------------------------------------------------ products
    def _norms_pass(self) -> None:
        self.fused([])

    def gram(self) -> np.ndarray:
        """H·Hᵀ (r×r, float64) in one pass."""
        return self.fused([_Gram(self)])[0]

    def _hht(self, q: np.ndarray) -> np.ndarray:
        return self.fused([_HHt(self, q)])[0]

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        return self.fused([_Matmat(self, x)])[0]

    def _rmatmat(self, y: np.ndarray, sink: Sink | None) -> np.ndarray | None:
        out = ArraySink(self.p, y.shape[1], np.float64) if sink is None else None
        self.fused([_Rmatmat(self, y, sink if out is None else out)])
        return None if out is None else out.array

    def _project(
        self, u: np.ndarray, sigma: np.ndarray, sink: Sink, *, out_dtype: Any, verify: str,
        gram: np.ndarray | None, omega: np.ndarray | None, seed: int = 0,
    ) -> dict[str, np.ndarray] | None:
        return self.fused([_Project(self, u, sigma, sink, out_dtype, verify, gram, omega, seed)])[0]

    def describe(self) -> dict[str, Any]:
        """What H is, as a spectrum store records it (its ``source``): the source, shape, centring."""
        return {**self.source.describe(), "shape": list(self.shape), "center": self.center}

    def __repr__(self) -> str:
        return f"GradientOperator(shape={self.shape}, device={self.device}, precision={self.precision})"


__all__ = ["ArraySink", "GradientOperator", "Sink", "scipy_operator"]
