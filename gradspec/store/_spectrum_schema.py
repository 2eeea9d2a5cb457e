"""The spectrum store's schema: its kind, status words, array names, chunking and attribute
types, shared by its core and its writer (who writes a store: ``_spectrum_owner``)."""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Any

import numpy as np
import zarr

import gradspec.store._checksum as _checksum

logger = logging.getLogger(__name__)

KIND = "spectrum"
STATUS_KEY = "gradspec.status"


class SpectrumStatus(StrEnum):
    """The status words of a spectrum store (the module note's Lifecycle).

    ``DAMAGED`` is never recorded: :meth:`SpectrumStore.summary` reports it for a store
    with a missing or wrong-sized chunk.
    """

    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    DAMAGED = "damaged"


RUNNING, COMPLETE, FAILED, INTERRUPTED, DAMAGED = (
    SpectrumStatus.RUNNING, SpectrumStatus.COMPLETE, SpectrumStatus.FAILED,
    SpectrumStatus.INTERRUPTED, SpectrumStatus.DAMAGED,
)
#: |‖v_j‖ − 1| above which ``gradspec pca`` does not store a direction, and which every reader of a
#: spectrum's V allows (``gradspec.spectrum.project_rows``'s atol; retrain's repair, squared).
V_UNIT_ATOL = 1e-3
#: Statuses of a store that a run left unfinished (a resumable state is kept).
UNFINISHED = (FAILED, INTERRUPTED)
V_CHUNK_BYTES = 8 * 2**20
VECTOR_ARRAYS = (
    "residuals",
    "residual_h",
    "residual_ht",
    "explained_variance_ratio",
    "cumulative_explained_variance",
)
#: The arrays :meth:`SpectrumStore.finish` writes.
RESULT_ARRAYS = ("V", "U", "sigma", *VECTOR_ARRAYS)
#: The arrays a store may hold beside them (the module note of ``_spectrum``).
OPTIONAL_ARRAYS = ("source_rows", "row_sq_norms", "hv")
#: Arrays where NaN is a value: a residual that was not measured.
NAN_ALLOWED = ("residuals", "residual_h", "residual_ht")
#: zarr skips all-zero chunks by default; a spectrum store writes every chunk (see the module note).
ALL_CHUNKS = {"write_empty_chunks": True}


def _create_arrays(
    g: zarr.Group, *, r: int, p: int, k: int, v_dtype: str, v_chunk_rows: int | None = None
) -> None:
    """(Re)create V, U, σ and the per-vector arrays for k directions (all zero)."""
    for name in ("V", "U", "sigma", *VECTOR_ARRAYS):
        if name in g:
            del g[name]
    itemsize = np.dtype(v_dtype).itemsize
    rows = v_chunk_rows or max(256, V_CHUNK_BYTES // (itemsize * k))
    g.create_array(
        "V", shape=(p, k), chunks=(int(min(rows, p)), k), dtype=v_dtype, fill_value=0,
        compressors=_checksum.checksum_codecs(), config=ALL_CHUNKS,
    )
    g.create_array("U", shape=(r, k), chunks=(r, k), dtype="float64", fill_value=0, compressors=_checksum.checksum_codecs(),
                   config=ALL_CHUNKS)
    for name in ("sigma", *VECTOR_ARRAYS):
        g.create_array(name, shape=(k,), chunks=(k,), dtype="float64", fill_value=0, compressors=_checksum.checksum_codecs(),
                       config=ALL_CHUNKS)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool))


#: The JSON type of each attribute a reader uses, checked when a store is opened (a store
#: from someone else is data: a wrong type is a one-line error naming it, never a traceback).
ATTR_TYPES: dict[str, tuple[Any, str]] = {
    "gradspec.shape": (lambda v: isinstance(v, list) and len(v) == 2 and all(_count(x) for x in v),
                       "a list of two counts [r, p]"),
    "gradspec.k": (_count, "a count"),
    "gradspec.k_requested": (_count, "a count"),
    "gradspec.method": (lambda v: isinstance(v, str), "a string"),
    "gradspec.params": (lambda v: isinstance(v, dict), "an object"),
    "gradspec.source": (lambda v: isinstance(v, dict), "an object"),
    "gradspec.status": (lambda v: isinstance(v, str), "a string"),
    "gradspec.frob2": (_number_or_none, "a number"),
    "gradspec.accuracy": (lambda v: v is None or isinstance(v, dict), "an object"),
    "gradspec.state": (lambda v: v is None or isinstance(v, dict), "an object"),
    "gradspec.timings": (lambda v: v is None or isinstance(v, dict), "an object"),
    "gradspec.passes": (lambda v: v is None or _count(v), "a count"),
    "gradspec.owner": (lambda v: v is None or isinstance(v, dict), "an object"),
}


def check_attr_types(path: str, attrs: dict[str, Any]) -> None:
    """Refuse, in one line naming the store and the attribute, an attribute of the wrong type."""
    for key, (ok, what) in ATTR_TYPES.items():
        if key in attrs and not ok(attrs[key]):
            raise ValueError(f"{path!r} has {key} = {str(attrs[key])[:60]!r}, not {what}: the store is "
                             "damaged; restore it from a copy or rerun `gradspec pca`")
