"""Rows of H projected onto the top-k right-singular subspaces of a spectrum, streamed.

``‖(I − P_k) g‖² = ‖g‖² − Σ_{j≤k} (v_jᵀ g)²`` for every k of a rank grid, from one pass over
the gradient matrix H (r × p): per column block c, accumulate ``H_c V_c`` (r × K) and the
squared row norms; nothing p × p is formed. Each residual is a difference of two numbers near
‖g‖², so it carries its row's rounding level (``RowProjections.resolution_sq``): the
in-sample residual at the rank of H is exactly 0 and computes as rounding noise, which is
reported as 0 and never fitted as a value. What is made of the residuals (G_k, its decay):
``_lipschitz``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gradspec.store import V_UNIT_ATOL


class RowSliceable(Protocol):
    """A (p × K) basis read by row slices: a numpy array, a memmap, a zarr array."""

    shape: tuple[int, ...]

    def __getitem__(self, key: Any) -> Any: ...


def rank_grid(k_max: int, *, every: bool = False, include_zero: bool = True) -> np.ndarray:
    """Ranks at which G_k is evaluated: ``0, 1, 2, 4, …, 2^m, k_max`` or every rank.

    Args:
        k_max: the largest rank (at most the number of stored singular vectors).
        every: all ranks ``0..k_max`` instead of powers of two.
        include_zero: include ``k = 0`` (G_0, the plain Lipschitz constant).
    """
    if k_max < 0:
        raise ValueError(f"k_max must be >= 0, got {k_max}")
    if every:
        ks = np.arange(0, k_max + 1)
    else:
        pw = [2**i for i in range(int(k_max).bit_length()) if 2**i <= k_max]
        ks = np.array(sorted({0, *pw, k_max}), dtype=np.int64)
    return ks if include_zero else ks[ks > 0]


@dataclass
class RowProjections:
    """Per-row squared norms and residuals after projecting onto the top-k subspace.

    Attributes:
        ks: ranks (sorted, unique), shape (m,).
        sq_norms: ``‖g_i‖²``, shape (n,).
        residual_sq: ``‖(I − P_k) g_i‖²`` for each k in ``ks``, shape (n, m), clamped at 0.
        coords: optional coordinates of g_i in the top-K subspace, shape (n, K)
            (``keep_coords``): ``V_Kᵀ g_i``, or ``L⁻¹ V_Kᵀ g_i`` with ``exact_projector``.
        resolution_sq: per row, the rounding level of ``residual_sq``, shape (n,) or None.
            A residual is ``‖g_i‖² − ‖P_k g_i‖²``, a difference of two numbers near
            ``‖g_i‖²``: at or below this level it cannot be told from 0 (the in-sample
            residual at the rank of H is exactly 0 and computes as rounding noise).
        residual_sq_all: the same residuals at *every* rank 0..max(ks), shape (n, max(ks) + 1),
            or None. The projection forms them anyway; the hypothesis "G_k ≤ G_0·k^(−c) for
            all k" of Theorem 3.3 eq. (2) is decided on them, not on the grid ``ks`` alone
            (between grid points the grid says nothing).
    """

    ks: np.ndarray
    sq_norms: np.ndarray
    residual_sq: np.ndarray
    coords: np.ndarray | None = None
    resolution_sq: np.ndarray | None = None
    residual_sq_all: np.ndarray | None = None

    @property
    def n_rows(self) -> int:
        return int(self.sq_norms.size)

    def unresolved(self) -> np.ndarray:
        """Residuals at or below their row's rounding level, shape (n, m) (bool)."""
        return self._unresolved_in(self.residual_sq)

    def _unresolved_in(self, residual_sq: np.ndarray) -> np.ndarray:
        """Entries of ``residual_sq`` (rows × ranks) at or below their row's rounding level."""
        if self.resolution_sq is None:
            return np.zeros(residual_sq.shape, dtype=bool)
        return residual_sq <= np.asarray(self.resolution_sq, dtype=np.float64).reshape(-1, 1)

    def residual_norms(self) -> np.ndarray:
        """``‖(I − P_k) g_i‖``, shape (n, m); 0 where :meth:`unresolved` (rounding noise)."""
        return np.where(self.unresolved(), 0.0, np.sqrt(self.residual_sq))

    def residual_norms_all(self) -> np.ndarray | None:
        """:meth:`residual_norms` at every rank 0..max(ks), shape (n, max(ks) + 1), or None."""
        if self.residual_sq_all is None:
            return None
        res = self.residual_sq_all
        return np.where(self._unresolved_in(res), 0.0, np.sqrt(res))

    def relative_residuals(self) -> np.ndarray:
        """``‖(I − P_k) g_i‖ / ‖g_i‖`` (0 for zero rows), shape (n, m)."""
        norms = np.sqrt(self.sq_norms)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(norms > 0, self.residual_norms() / norms, 0.0)
        return out


#: How many unit roundoffs (of the least precise input) of ‖g_i‖² a residual ‖g_i‖² − ‖P_k g_i‖²
#: must exceed to count as measured: float32 inputs resolve G_k down to 16·√u ≈ 4e-3 of ‖g_i‖,
#: float64 inputs to ≈ 2e-7. The in-sample residual at the rank of H, exactly 0, computed at
#: 0.7u·‖g_i‖² from a float32 U and 37u from a float64 Rayleigh–Ritz replay (tests/spectrum).
ROUNDING_MARGIN = 256.0


def unit_roundoff(dtype: Any) -> float:
    """Half the machine epsilon of a float dtype (float16 and bfloat16 included); float64's
    for a non-float dtype."""
    try:
        return float(np.finfo(dtype).eps) / 2.0
    except (TypeError, ValueError):
        return float(np.finfo(np.float64).eps) / 2.0


#: Columns of H multiplied at a time: the float64 copies of a tile's columns and of V's rows
#: are this wide, whatever the width of the blocks a store yields.
PANEL_COLS = 4096


def _tile(item: tuple) -> tuple[int, int, Any]:
    """``(row_offset, col_offset, tile)`` of a column block pair or a tile triple."""
    if len(item) == 2:
        return 0, int(item[0]), item[1]
    if len(item) == 3:
        return int(item[0]), int(item[1]), item[2]
    raise ValueError(
        f"expected (col_offset, block) pairs or (row_offset, col_offset, tile) triples, got {len(item)} items"
    )


def _progress_bar(p: int) -> Any:
    """A bar on stderr over the p columns one pass projects (gone when done, as pca's)."""
    import sys

    from tqdm import tqdm

    return tqdm(total=p, unit="col", unit_scale=True, file=sys.stderr, leave=False, desc="G_k: rows onto V")


def project_rows(
    col_blocks: Iterable[tuple[int, np.ndarray]] | Iterable[tuple[int, int, np.ndarray]],
    basis: RowSliceable | np.ndarray,
    *,
    ks: Sequence[int] | np.ndarray | None = None,
    n_rows: int | None = None,
    keep_coords: bool = False,
    check_orthonormal: bool = True,
    exact_projector: bool = True,
    atol: float = V_UNIT_ATOL,
    progress: bool = False,
) -> RowProjections:
    """One pass over the column blocks of H: norms and top-k residuals of every row.

    For each block ``(offset, H_c)`` with ``H_c`` of shape (n, c), reads
    ``V_c = basis[offset:offset + c, :K]`` and accumulates ``C += H_c V_c`` and
    ``s += rowsum(H_c²)`` in float64; then
    ``‖(I − P_k) g_i‖² = s_i − Σ_{j≤k} C_ij²`` for all k at once. Cost
    ``2·n·p·K`` flops. A block may come in tiles of rows (``(row_offset, offset, tile)``,
    e.g. ``GradientStore.iter_tiles``): V_c is then read once per column block and only
    one tile of H is held, so the memory is ``n·K`` (the result) plus one tile and ``V_c``
    — not a column block of all n rows. Products run in panels of ``PANEL_COLS`` columns.

    Args:
        col_blocks: ``(col_offset, block)`` pairs covering the p columns once, each block
            holding every row (e.g. ``GradientStore.iter_col_blocks(rows=...)``), or
            ``(row_offset, col_offset, tile)`` triples: each column block as tiles of
            consecutive rows from 0 to ``n_rows``, one column block after another;
            ``col_offset`` indexes ``basis`` rows.
        basis: V, (p × K_stored) with orthonormal columns, sliceable by rows.
        ks: ranks to evaluate; default :func:`rank_grid` up to ``K_stored``.
        n_rows: the number of rows (needed with tiles; default the first block's rows).
        keep_coords: also return ``V_Kᵀ g_i`` (n × K).
        check_orthonormal: check the column norms of ``V_K`` (accumulated in the same pass)
            lie within ``atol`` of 1; the residual formula assumes orthonormal columns.
            (`gradspec pca` stores only directions that pass this, ``V_UNIT_ATOL`` there.)
        atol: tolerance of that check.
        exact_projector: also accumulate ``M = V_Kᵀ V_K`` (``p·K²`` flops, in the same pass)
            and use the orthogonal projector onto span(V_k), ``‖P_k g‖² = ‖L_k⁻¹ V_kᵀ g‖²`` with
            ``M = L Lᵀ`` (Cholesky; nested in k). A V stored in float32 is orthonormal only to
            ~1e-7, which otherwise limits the resolution of ``‖(I − P_k) g‖`` to about
            ``3e-4·‖g‖``; with the correction it is ~1e-8·‖g‖.
        progress: a progress bar on stderr over the p columns (the CLI's; `gradspec decay
            --no-progress` turns it off).

    Returns:
        :class:`RowProjections`.

    Raises:
        ValueError: on shape mismatches, ranks outside ``[0, K_stored]``, columns that
            the blocks do not cover exactly once, tiles that do not cover each column
            block's rows once and in order, or a basis that is not orthonormal.
    """
    p, k_stored = int(basis.shape[0]), int(basis.shape[1])
    if ks is not None:
        ks_in = np.asarray(ks)
        if ks_in.size and not np.issubdtype(ks_in.dtype, np.integer):
            raise ValueError(f"ks must be integer ranks, got {ks_in.tolist()}")
    ks_arr = rank_grid(k_stored) if ks is None else np.unique(np.asarray(ks, dtype=np.int64))
    if ks_arr.size == 0:
        raise ValueError("ks is empty; pass at least one rank")
    if ks_arr.min() < 0 or ks_arr.max() > k_stored:
        raise ValueError(
            f"ranks must lie in [0, {k_stored}] (the stored singular vectors), "
            f"got {ks_arr.min()}..{ks_arr.max()}"
        )
    kmax = int(ks_arr.max())
    coords: np.ndarray | None = None
    sq: np.ndarray | None = None
    col_norm_sq = np.zeros(kmax)
    gram = np.zeros((kmax, kmax)) if exact_projector else None
    covered = 0
    spans: list[tuple[int, int]] = []
    block: tuple[int, int] | None = None  # the column block being read: (offset, width)
    v: np.ndarray | None = None  # its rows of V, as stored
    done = 0  # its rows read so far
    bar = _progress_bar(p) if progress else None
    try:
        for item in col_blocks:
            r0, off, tile = _tile(item)
            h = np.asarray(tile)
            if h.ndim != 2:
                raise ValueError(f"column blocks must be 2-D (rows, cols), got shape {h.shape}")
            if coords is None:
                n = h.shape[0] if n_rows is None else int(n_rows)
                coords = np.zeros((n, kmax))
                sq = np.zeros(n)
            n, c = coords.shape[0], h.shape[1]
            if len(item) == 2 and h.shape[0] != n:
                raise ValueError(f"column blocks disagree on the row count: {h.shape[0]} vs {n}")
            if block is None or block != (off, c) or done == n:
                if block is not None and done != n:
                    raise ValueError(
                        f"the tiles of column block [{block[0]}, {sum(block)}) end at row {done} of "
                        f"{n}: give each column block's rows once, in order"
                    )
                if off < 0 or off + c > p:
                    raise ValueError(
                        f"column block [{off}, {off + c}) lies outside the basis rows [0, {p})"
                    )
                block, done = (off, c), 0
                v = np.asarray(basis[off : off + c, :kmax]) if kmax else None
                for j in range(0, c, PANEL_COLS) if v is not None else ():
                    v64 = v[j : j + PANEL_COLS].astype(np.float64, copy=False)
                    col_norm_sq += np.einsum("ij,ij->j", v64, v64)
                    if gram is not None:
                        gram += v64.T @ v64
                covered += c
                spans.append((off, off + c))
            if r0 != done or r0 + h.shape[0] > n:
                raise ValueError(
                    f"a tile of rows {r0}..{r0 + h.shape[0] - 1} of column block [{off}, {off + c}) "
                    f"came where row {done} of {n} was due: give each column block's rows once, in order"
                )
            rows = slice(r0, r0 + h.shape[0])
            for j in range(0, c, PANEL_COLS):
                h64 = h[:, j : j + PANEL_COLS].astype(np.float64, copy=False)
                if v is not None:
                    coords[rows] += h64 @ v[j : j + PANEL_COLS].astype(np.float64, copy=False)
                sq[rows] += np.einsum("ij,ij->i", h64, h64)
            done += h.shape[0]
            if bar is not None and done == n:
                bar.update(c)
    finally:
        if bar is not None:
            bar.close()
    if coords is None or sq is None:
        raise ValueError("no column blocks were given")
    if block is not None and done != coords.shape[0]:
        raise ValueError(
            f"the tiles of column block [{block[0]}, {sum(block)}) end at row {done} of "
            f"{coords.shape[0]}: give each column block's rows once, in order"
        )
    spans.sort()
    for (a0, b0), (a1, b1) in zip(spans, spans[1:], strict=False):
        if a1 < b0:
            raise ValueError(
                f"column blocks [{a0}, {b0}) and [{a1}, {b1}) overlap: columns would count twice; "
                "give each column once (offsets index the basis rows)"
            )
    if covered != p:
        raise ValueError(f"the column blocks cover {covered} columns but the basis has {p} rows")
    if not np.all(np.isfinite(col_norm_sq)):
        j = int(np.argmax(~np.isfinite(col_norm_sq)))
        raise ValueError(
            f"the basis V holds NaN/inf (column {j + 1}); check the spectrum with "
            "`gradspec info --verify`, or rerun `gradspec pca`"
        )
    if not np.all(np.isfinite(sq)):
        bad = np.flatnonzero(~np.isfinite(sq))
        raise ValueError(
            f"{bad.size} gradient row(s) hold NaN/inf (first: row {int(bad[0])} of the selection); "
            "exclude them (--heldout-rows), or find them with `gradspec info --verify`"
        )
    if check_orthonormal and kmax:
        dev = float(np.abs(np.sqrt(col_norm_sq) - 1.0).max())
        if dev > atol:
            j = int(np.argmax(np.abs(np.sqrt(col_norm_sq) - 1.0) > atol))
            raise ValueError(
                f"basis columns are not unit vectors (|‖v_{j + 1}‖ − 1| = "
                f"{abs(np.sqrt(col_norm_sq[j]) - 1.0):.2e} > {atol}, max {dev:.2e}): the "
                f"spectrum's V is not orthonormal beyond rank {j}; rerun `gradspec pca` (it "
                "stores only resolved directions)"
                + (f" or analyse ranks up to {j} (--k-max {j})" if j else "")
            )
    if gram is not None and kmax:
        from scipy.linalg import cholesky, solve_triangular

        try:
            L = cholesky(gram, lower=True)
        except np.linalg.LinAlgError:
            raise ValueError(
                "the basis columns are linearly dependent (V_Kᵀ V_K is singular)"
            ) from None
        coords = solve_triangular(L, coords.T, lower=True).T
    cum = np.concatenate([np.zeros((coords.shape[0], 1)), np.cumsum(coords**2, axis=1)], axis=1)
    residual_all = np.maximum(sq[:, None] - cum, 0.0)
    residual_sq = residual_all[:, ks_arr]
    # ‖P_k g‖² carries V's rounding and, without exact_projector, its departure from
    # orthonormal columns (measured here as max |‖v_j‖² − 1|).
    u = unit_roundoff(getattr(basis, "dtype", np.float64))
    skew = 0.0 if gram is not None or not kmax else float(np.abs(col_norm_sq - 1.0).max())
    return RowProjections(
        ks=ks_arr, sq_norms=sq, residual_sq=residual_sq, coords=coords if keep_coords else None,
        resolution_sq=(ROUNDING_MARGIN * u + 2.0 * skew) * sq, residual_sq_all=residual_all,
    )
