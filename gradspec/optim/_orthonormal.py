"""Orthonormal bases for projectors: checks, in-place Cholesky QR for large float32 bases,
and the basis fingerprint a run records.

Large bases (more than :data:`LARGE_BASIS` entries, e.g. k = 1000 directions of
MiniLM's 1.77M query/value weights: 7 GB in float32) stay in float32 and are
orthonormalised in place by Cholesky QR with float64 Gram sums, because a float64 copy
and a Householder QR of them would need 14–28 GB; small ones are kept in float64.
"""

from __future__ import annotations

import hashlib
import logging

import torch
from torch import Tensor

from gradspec.store import V_UNIT_ATOL

logger = logging.getLogger(__name__)

#: max |VᵀV − I| a spectrum store's V may have and still be repaired, not refused as damaged.
#: ``gradspec pca`` keeps a direction whose ‖v‖ is within ``V_UNIT_ATOL`` of 1, so its squared
#: norm may be off by 2·V_UNIT_ATOL + V_UNIT_ATOL²; the products' rounding moves its inner
#: products with the other directions by no more than that of the worst-resolved one. A
#: repeated or overwritten column is off by O(1).
SPECTRUM_V_ATOL = 2 * V_UNIT_ATOL + V_UNIT_ATOL**2

#: Above this many entries (p·k) a basis is kept in float32 and orthonormalised in place.
LARGE_BASIS = 20_000_000
#: Rows per block of the float64-summed Gram V^T V (the float32 products stay short).
_GRAM_ROWS = 8192


def _gram64(v: Tensor) -> Tensor:
    """``V^T V`` (k x k, float64) of a tall V: row-block products in V's dtype, summed in float64.

    Memory is one k x k block beyond V; a float64 copy of V is never made.
    """
    k = v.shape[1]
    gram = torch.zeros(k, k, dtype=torch.float64, device=v.device)
    for i in range(0, v.shape[0], _GRAM_ROWS):
        block = v[i:i + _GRAM_ROWS]
        gram += (block.T @ block).double()
    return (gram + gram.T) / 2


def _orthonormality_error(v: Tensor) -> float:
    """``max |V^T V - I|``."""
    gram = _gram64(v) if v.numel() > LARGE_BASIS else v.T.double() @ v.double()
    return (gram - torch.eye(v.shape[1], dtype=torch.float64, device=v.device)).abs().max().item()


def orthonormalize_(v: Tensor, *, tol: float | None = None, max_passes: int = 3,
                    repair_only: float | None = None) -> float:
    """Orthonormalise the columns of a tall ``v`` (p x k) in place; returns ``max |V^T V - I|``.

    Cholesky QR: with ``V^T V = R^T R`` (R upper triangular, from the float64 Gram),
    ``V <- V R^{-1}`` has orthonormal columns and, as R is triangular, its first j
    columns span what the first j columns of V spanned, for every j. One pass leaves
    an error of order eps·cond(V)^2, so passes repeat (at most ``max_passes``) until
    the measured error is at most ``tol`` (default 1e-5 in float32, 1e-12 in float64).
    The time is about 3pk^2 flops per pass plus 2pk^2 per check; the memory, V itself.
    ``repair_only``: V is meant to be orthonormal already (a spectrum store's V, rounded to
    float32); refuse, instead of orthonormalising, a V whose error exceeds this (a damaged
    store: QR would turn a repeated column into a direction of rounding noise).

    Raises:
        ValueError: if V is not 2-D with p >= k, or its columns are linearly dependent
            to working precision (Cholesky fails), or the error is still above ``tol``
            after ``max_passes`` passes (never returns a basis that is not orthonormal).
    """
    if v.ndim != 2 or v.shape[0] < v.shape[1]:
        raise ValueError(f"orthonormalize_ needs a tall p x k matrix (p >= k), got shape {tuple(v.shape)}")
    if tol is None:
        tol = 1e-5 if v.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-12
    eye = torch.eye(v.shape[1], dtype=torch.float64, device=v.device)
    gram = _gram64(v)
    err = (gram - eye).abs().max().item()
    if repair_only is not None and err > repair_only:
        raise ValueError(_not_orthonormal(err, repair_only))
    for _ in range(max_passes):
        if err <= tol:
            break
        chol, info = torch.linalg.cholesky_ex(gram)
        if int(info) != 0:
            raise ValueError(f"the basis columns are linearly dependent (Cholesky of V^T V failed at "
                             f"column {int(info)}): pass k independent directions")
        r = chol.T.to(v.dtype)
        for i in range(0, v.shape[0], _GRAM_ROWS):
            block = v[i:i + _GRAM_ROWS]
            block.copy_(torch.linalg.solve_triangular(r, block, upper=True, left=False))
        gram = _gram64(v)
        err = (gram - eye).abs().max().item()
    if err > tol:
        raise ValueError(f"the basis could not be orthonormalised to {tol:g} in {max_passes} passes (max "
                         f"|V^T V - I| = {err:.2e}): its columns are nearly dependent; pass k independent "
                         "directions")
    return err


def _not_orthonormal(err: float, atol: float) -> str:
    return (f"the spectrum's V is not orthonormal (max |V^T V - I| = {err:.2e} > {atol:g}): the store "
            "is damaged (e.g. a repeated or overwritten column); rerun `gradspec pca`")


def check_spectrum_basis(v: Tensor, atol: float = SPECTRUM_V_ATOL) -> None:
    """Refuse a spectrum store's V that is not orthonormal to ``atol`` (what ``decay`` checks)."""
    err = _orthonormality_error(v)
    if not err <= atol:
        raise ValueError(_not_orthonormal(err, atol))


def _orthonormal(v: Tensor, what: str, atol: float) -> None:
    err = _orthonormality_error(v)
    if err > atol:
        raise ValueError(
            f"{what} is not orthonormal (max |V^T V - I| = {err:.2e} > {atol:g}); pass "
            "orthonormalize=True to fix it with a QR decomposition"
        )


def _fingerprint(v: Tensor) -> str:
    """SHA-1 of V's float32 bytes, read in place (a float32 CPU basis is not copied)."""
    a = v.detach().to("cpu", torch.float32).contiguous().numpy()
    return hashlib.sha1(memoryview(a).cast("B")).hexdigest()


