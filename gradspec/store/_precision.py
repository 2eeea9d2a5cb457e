"""What storing float32 gradients in a 16-bit dtype loses, measured on the rows as they are converted.

float16 keeps 11 significant bits but its normal range ends at 6.1e-5: below
that the numbers are subnormal (fewer significant bits, down to one) and
below 3.0e-8 they round to zero. Gradient entries are often that small
(clipped per-example gradients of a large layer, averaged over a batch), so a
float16 store can silently lose a share of its entries. bfloat16 has float32's
range and 8 significant bits: its rounding is coarse but uniform.

Per written row the store keeps five numbers (array ``dtype_stats``, columns
:data:`STATS_COLUMNS`): nonzero entries, entries that became 0, entries that
became subnormal, ‖x̂ − x‖² and ‖x‖². They are summed over the committed rows
into the attribute ``gradspec.dtype_report`` at every commit, so truncating a
store (resuming from an earlier checkpoint) keeps the report exact.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gradspec.store._zarr import from_disk_dtype, to_disk_dtype

STATS_COLUMNS = ("nonzero", "underflowed", "subnormal", "err_sq", "norm_sq")

# Raw 16-bit patterns: |x| bits, the smallest normal magnitude, +inf; unit roundoff 2^-t.
_FORMATS: dict[str, tuple[int, int, float]] = {
    "float16": (0x0400, 0x7C00, 2.0**-11),
    "bfloat16": (0x0080, 0x7F80, 2.0**-8),
}

#: A report is *material* (logged as a warning) past either threshold.
UNDERFLOW_SHARE = 1e-3
REL_ERROR = 1e-3

_BLOCK_ELEMENTS = 2**20  # temporaries of a few MB, whatever the row length


def conversion_stats(x: np.ndarray, disk: np.ndarray, dtype: str) -> tuple[np.ndarray, int]:
    """Per-row losses of converting float32 rows ``x`` to their on-disk 16-bit form ``disk``.

    Args:
        x: float32 rows (b, p).
        disk: ``to_disk_dtype(x, dtype)`` (float16, or bfloat16's raw bits as uint16).
        dtype: ``"float16"`` or ``"bfloat16"``.

    Returns:
        ``(stats, overflowed)``: stats (b, 5) float64 in the order of :data:`STATS_COLUMNS`
        (rows holding non-finite input count no error), and the number of finite entries
        that became ±inf (float16 above 65504).
    """
    min_normal, inf_bits, _ = _FORMATS[dtype]
    b, p = x.shape
    stats = np.zeros((b, len(STATS_COLUMNS)))
    overflowed = 0
    step = max(1, _BLOCK_ELEMENTS // max(p, 1))
    # Column tiles too: a row of 22.7M entries in one piece made every temporary 22-91 MB and
    # every pass a trip to memory (0.24 s a row); tiles of _BLOCK_ELEMENTS stay in cache.
    for i in range(0, b, step):
        xb, db = x[i : i + step], disk[i : i + step]
        n = xb.shape[0]
        width = max(1, _BLOCK_ELEMENTS // n)
        nz_in = np.zeros(n, np.int64)
        nz_out = np.zeros(n, np.int64)
        tiny_out = np.zeros(n, np.int64)
        bad_out = np.zeros(n, np.int64)
        bad_in = np.zeros(n, np.int64)
        err = np.zeros(n)
        norm = np.zeros(n)
        for j in range(0, p, width):
            xs, ds = xb[:, j : j + width], db[:, j : j + width]
            mag = ds.view(np.uint16) & np.uint16(0x7FFF)
            nz_in += np.count_nonzero(xs, axis=1)
            nz_out += np.count_nonzero(mag, axis=1)
            tiny_out += np.count_nonzero(mag < min_normal, axis=1)  # zeros and subnormals
            back = from_disk_dtype(ds, dtype)  # a new float32 array
            with np.errstate(invalid="ignore"):  # inf - inf in rows holding non-finite input
                np.subtract(back, xs, out=back)
            err += [np.dot(r, r) for r in back]
            norm += [np.dot(r, r) for r in xs]
            if mag.max(initial=0) >= inf_bits:
                bad_out += np.count_nonzero(mag >= inf_bits, axis=1)
                bad_in += xs.shape[1] - np.count_nonzero(np.isfinite(xs), axis=1)
        overflowed += int((bad_out - bad_in).sum())
        err[bad_out > 0] = 0.0
        norm[bad_out > 0] = 0.0
        s = stats[i : i + step]
        s[:, 0] = nz_in
        s[:, 1] = nz_in - nz_out
        s[:, 2] = tiny_out - (p - nz_out)
        s[:, 3] = err
        s[:, 4] = norm
    return stats, overflowed


def disk_rows(x: np.ndarray, dtype: str, disk: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Float32 rows ``x`` in their on-disk 16-bit form, and what that form lost (``conversion_stats``).

    Args:
        x: the float32 rows (b, p) as they were before any rounding.
        dtype: ``"float16"`` or ``"bfloat16"``.
        disk: the on-disk form where the caller made it (a recorder rounds per-example rows
            itself and scales any whose rounded norm passed C): the stats compare it with
            ``x``. None: ``to_disk_dtype(x, dtype)``.

    Raises:
        ValueError: finite entries became ±inf (float16 above 65504).
    """
    x = np.asarray(x, dtype=np.float32)
    if disk is None:
        disk = to_disk_dtype(x, dtype)
    stats, overflowed = conversion_stats(x, disk, dtype)
    if overflowed:
        raise ValueError(
            f"{overflowed} finite gradient entries exceed {dtype}'s largest value (65504) and "
            "would be stored as infinity; collect with --dtype bfloat16 or float32"
        )
    return disk, stats


def accumulate(acc: tuple[int, np.ndarray, float] | None, stats: np.ndarray) -> tuple[int, np.ndarray, float]:
    """Add rows' stats (b, 5) to a running ``(rows, column sums, worst row relative error)``."""
    rows, sums, worst = acc if acc is not None else (0, np.zeros(len(STATS_COLUMNS)), 0.0)
    stats = np.asarray(stats, dtype=np.float64).reshape(-1, len(STATS_COLUMNS))
    with np.errstate(divide="ignore", invalid="ignore"):
        row_rel = np.where(stats[:, 4] > 0, np.sqrt(stats[:, 3] / stats[:, 4]), 0.0)
    worst = max(worst, float(row_rel.max())) if row_rel.size else worst
    return rows + stats.shape[0], sums + stats.sum(axis=0), worst


def summarize(acc: tuple[int, np.ndarray, float], p: int, dtype: str) -> dict[str, Any]:
    """The report of accumulated stats: counts, shares and relative errors (JSON-ready)."""
    rows, tot, worst = acc
    nonzero = int(tot[0])
    return {
        "dtype": dtype,
        "rows": int(rows),
        "entries": int(rows) * int(p),
        "nonzero": nonzero,
        "underflowed": int(tot[1]),
        "subnormal": int(tot[2]),
        "underflowed_share": float(tot[1] / nonzero) if nonzero else 0.0,
        "subnormal_share": float(tot[2] / nonzero) if nonzero else 0.0,
        "rel_error": float(math.sqrt(tot[3] / tot[4])) if tot[4] > 0 else 0.0,
        "max_row_rel_error": float(worst),
    }


def material(report: dict[str, Any]) -> str | None:
    """Why the losses of ``report`` matter (a sentence), or None when they do not.

    Material: more than 0.1% of the nonzero entries became 0, or the relative
    Frobenius error exceeds both 1e-3 and twice the dtype's unit roundoff (bfloat16's
    plain rounding alone is ~2e-3 and is what choosing it means).
    """
    if not report or not report.get("rows"):
        return None
    u = _FORMATS[report["dtype"]][2]
    under, rel = float(report["underflowed_share"]), float(report["rel_error"])
    if under <= UNDERFLOW_SHARE and rel <= max(REL_ERROR, 2 * u):
        return None
    return (
        f"storing the gradients as {report['dtype']} flushed {under:.2%} of their nonzero entries to 0 "
        f"and made {float(report['subnormal_share']):.1%} subnormal: relative error {rel:.2e} "
        f"(worst row {float(report['max_row_rel_error']):.2e}); collect with --dtype float32 "
        "(or bfloat16, which keeps float32's range) to keep them"
    )
