"""How `gradspec decay` measures a set of gradient rows: from the spectrum, or projected onto V.

The spectrum's own rows of an exact spectrum (method ``gram`` on uncentred rows, float32 or
float64 products) need no pass over H: H·V_k = U_k·Σ_k, so
‖(I − P_k)h_i‖² = ‖h_i‖² − Σ_{j≤k} σ_j²·U_ij² (Li et al. 2022, Definition 3.1), from U, σ
and the squared row norms pca recorded (:func:`row_projections_from_svd`); a spectrum store
from before those were recorded gets them from one norm-only pass over the rows (V unread).
Within the spectrum's precision this is what projecting the rows onto the stored V gives:
to ~1e-13 with float64 products and a float64 V, and with float32 products to their Gram's
rounding (~1e-6 relative on G_k, the σ error pca states for them).

A replayed spectrum (method ``replay``, `gradspec replay`) is of rows its source store holds only
sketched (columns that are sketch blocks, not V's parameters), so its own rows are never projected:
with every direction of the rows replayed (K = r: U_K spans them all) its Rayleigh–Ritz step is
the exact SVD of the exact rows, and U, σ and the exact rows' norms the replay recorded give G_k
as above; with K < r its U = U_K·W are Ritz vectors of span(U_K) and its rows' G_k cannot be
formed (:func:`why_no_replayed_rows`).

Every other set of rows — held-out rows, and the own rows of an iterative (Ritz vectors:
H·V = U·Σ only to their residuals), centred (G_k are of the raw rows) or TF32 spectrum — is
projected onto V (:func:`project_rows`) in one pass over those rows and V, in tiles of rows
(``GradientStore.iter_tiles``) sized by :func:`tile_rows` so that the rows held at a time stay
under a memory budget whatever their number.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gradspec.spectrum._projection import RowProjections, project_rows, unit_roundoff
from gradspec.spectrum._subspace import row_projections_from_svd

#: Bytes of gradient rows a projection holds at a time by default (`decay_analysis`'s ``memory``).
MEMORY = 512 * 2**20
#: Tiles a projection holds at once: the one multiplied, two read ahead, one being read.
TILES_IN_FLIGHT = 4


def tile_rows(store: Any, cols: list[tuple[int, int]], memory: int) -> int:
    """Rows per tile so that the tiles in flight (float32, one column block wide) fit ``memory``.

    A column block of ``GradientStore.iter_tiles`` is at most one chunk wide; tiles are a
    multiple of the store's chunk rows when one chunk row fits, so each chunk is decoded once.
    It does not depend on the number of rows projected.
    """
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 1:
        raise ValueError(f"memory must be a positive number of bytes, got {memory!r}")
    width = min(int(store.chunks[1]), max(b - a for a, b in cols))
    rows = max(1, int(memory) // (TILES_IN_FLIGHT * 4 * width))
    per_chunk = int(store.chunks[0])
    return rows // per_chunk * per_chunk if rows >= per_chunk else rows


def why_project_own_rows(spec: Any) -> str | None:
    """Why a spectrum's own rows must be projected onto V (None: U, σ and the norms give them)."""
    if spec.method != "gram":
        return (f"the spectrum is from method {spec.method!r}, whose U are Ritz vectors (H·V = U·Σ "
                "only to their residuals), not H's exact left singular vectors")
    if spec.source.get("center"):
        return "the spectrum is of the column-centred rows, G_k of the raw rows"
    precision = spec.params.get("precision")
    if precision not in ("float32", "float64"):
        return (f"the spectrum's Gram was formed with {precision or 'unrecorded'} products: its U do "
                "not resolve the residuals to the precision of a projection")
    return None


def why_no_replayed_rows(spec: Any) -> str | None:
    """Why a replayed spectrum's own rows get no G_k (None: U, σ and the recorded norms give them).

    Its rows cannot be projected onto V (the source store holds them sketched); the identity
    ‖(I − P_k)h_i‖² = ‖h_i‖² − Σ_{j≤k} σ_j²·U_ij² needs exact left singular vectors, which the
    replay's Rayleigh–Ritz step gives only when U_K spans every row (K = r).
    """
    rec = spec.source.get("replay") or {}
    K, r = rec.get("K"), rec.get("rows_used", spec.shape[0])
    if (K is None or int(K) < int(r)) and not spec.has_hv:
        return (f"the replay used K = {K} of the r = {r} directions of the rows, so its U are Ritz vectors of "
                "their span (H·V = U·Σ only there), and the rows are stored sketched, not in parameter "
                f"space; replay with --check (H·V measured), or every direction (`gradspec pca SKETCHED --k {r}`, "
                "then `gradspec replay`), for their G_k, or pass unsketched rows of its parameters with "
                "--gradients (held out)")
    if spec.row_sq_norms is None:
        return ("the replayed spectrum records no row norms (the sketched store holds only sketched rows; "
                "replays before this gradspec did not record them): rerun `gradspec replay`")
    return None


def measure_rows(
    *,
    spec: Any,
    store: Any,
    rows: np.ndarray,
    own: bool,
    cols: list[tuple[int, int]],
    basis: Any,
    ks: np.ndarray,
    tiles: int,
    read_rows: bool = False,
    progress: bool = False,
) -> tuple[RowProjections, str, str | None]:
    """The row projections of ``rows`` of ``store`` at ranks ``ks``, how they were measured, and
    a note when the spectrum's own rows had to be projected.

    Args:
        spec: the ``SpectrumStore``.
        store: the ``GradientStore`` holding the rows.
        rows: their indices in ``store``; with ``own``, the spectrum's own rows in U's order.
        own: the rows are the spectrum's own (``spec.source_rows``, of its source store).
        cols: the columns of ``store`` V's rows stand for.
        basis: V's first K columns, row-sliceable (p × K).
        ks: the ranks (``DecayConfig.ranks(K)``).
        tiles: rows per tile of a projection (:func:`tile_rows`).
        read_rows: project the own rows too (a cross-check of the exact path).
        progress: log each projected column block.
    """
    from gradspec.store import as_slice

    sel, k = as_slice(rows), int(basis.shape[1])

    def project(ranks: np.ndarray | list[int]) -> RowProjections:
        blocks = store.iter_tiles(rows=sel, col_ranges=cols, tile_rows=tiles)
        return project_rows(blocks, basis, ks=ranks, n_rows=int(rows.size), progress=progress)

    if own and spec.method == "replay":
        why = ("read_rows: its rows are stored sketched, they cannot be projected onto its V in parameter "
               "space") if read_rows else why_no_replayed_rows(spec)
        if why is not None:
            raise ValueError(f"G_k of the replayed spectrum's own rows cannot be formed: {why}")
        if spec.has_hv:  # ‖P_k h_i‖² = Σ_{j≤k} (h_i·v_j)², the measured H·V: U·Σ's place
            how = ("onto the replayed directions' span, from H·V measured by `replay --check` and the exact rows' "
                   "norms the replay recorded (no store read; with K < r the directions are Ritz vectors of "
                   "span(H^T U_K), not the exact top k)")
            sigma = spec.sigma[:k]
            return (row_projections_from_svd(spec.row_sq_norms, spec.hv[:, :k] / sigma, sigma, ks), how, None)
        how = ("from the replayed spectrum's U and sigma (K = r: the exact SVD of the exact rows) and the exact "
               "rows' norms the replay recorded (no store read)")
        return row_projections_from_svd(spec.row_sq_norms, spec.U[:, :k], spec.sigma[:k], ks), how, None
    why = ("asked to (read_rows)" if read_rows else why_project_own_rows(spec)) if own else None
    if own and why is None:
        norms = spec.row_sq_norms
        how = "from the spectrum's U, sigma and recorded row norms (exact Gram spectrum: no pass over H)"
        if norms is None:
            norms = project([0]).sq_norms
            how = ("from the spectrum's U and sigma and the rows' norms, read in one pass over them "
                   "(the spectrum store predates recorded row norms; rerun pca to record them)")
        products = unit_roundoff(spec.params.get("precision"))  # the Gram's products
        return (row_projections_from_svd(norms, spec.U[:, :k], spec.sigma[:k], ks, unit_roundoff=products),
                how, None)
    how = f"projected onto V (one pass over the rows and V, in tiles of {tiles} rows)"
    note = f"G_k on the collected rows were measured by projecting them onto V: {why}" if own else None
    return project(ks), how, note
