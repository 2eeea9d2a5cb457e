"""The gradient store's schema: its attribute keys, statuses, dtypes, chunking defaults
and row-metadata fields (docs/store-format.md), shared by its core, writer and reader."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import gradspec.store._checksum as _checksum

KIND = "gradients"
ROWS_KEY = "gradspec.rows"
STATUS_KEY = "gradspec.status"
DTYPE_REPORT_KEY = "gradspec.dtype_report"
#: What ``gradspec.status`` may say: being written, finished by its run, or stopped by an
#: error its writer caught (its committed rows are intact; the run's ``error`` says why).
STATUSES = ("writing", "complete", "failed")
DTYPES = ("float32", "float16", "bfloat16")
STATS_ARRAY = "dtype_stats"
CHUNK_BYTES = 8 * 2**20
DEFAULT_ROWS_PER_CHUNK = 32

#: Row-metadata fields and their dtypes; per-example stores add ``example_index``.
META_FIELDS: dict[str, str] = {
    "step": "int64",
    "epoch": "int32",
    "loss": "float32",
    "batch_size": "int32",
    "norm_mean": "float32",
    "norm_max": "float32",
    "frac_clipped": "float32",
}
#: Metadata fields where NaN is a recorded value, "unknown" (a recorder given no loss or no
#: norms stores NaN), so ``verify`` counts only ±inf there as damage.
NAN_MEANS_UNKNOWN: frozenset[str] = frozenset({"loss", "norm_mean", "norm_max", "frac_clipped"})
PER_EXAMPLE_FIELDS: dict[str, str] = {"example_index": "int64"}
#: Per-example stores written since ``gradspec.example_norms`` (issue 22) add, row-aligned, each
#: example's own pre-clip L2 norm and the clip factor applied to it (float64), and the
#: ``PARAM_NORMS_ARRAY`` of its pre-clip norm per parameter, (capacity, parameters).
EXAMPLE_NORMS_KEY = "gradspec.example_norms"
EXAMPLE_NORM_FIELDS: dict[str, str] = {"pre_clip_norm": "float64", "clip_factor": "float64"}
PARAM_NORMS_ARRAY = "param_norms"
#: A sketched per-example store (``gradspec collect --sketch M``, issue 22): the plan that maps
#: each unsketched row (p values) to the stored M columns, as ``gradspec.sketch.SketchPlan.to_dict``
#: writes it (docs/store-format.md). Its ``gradspec.layout`` is then the stored columns as
#: pseudo-parameters (``sketch.exact``, ``sketch.block0``, ...), and ``param_norms`` has one
#: column per *model* parameter of the plan.
SKETCH_KEY = "gradspec.sketch"

RowSelection = slice | Sequence[int] | np.ndarray | None
ColRanges = Sequence[tuple[int, int]] | None


def _codecs(compressor: str | None):
    """The bytes-to-bytes codecs of ``grads``: the compressor, if any, then the chunk checksum."""
    if compressor in (None, "none"):
        return _checksum.checksum_codecs()
    from zarr.codecs import BloscCodec, ZstdCodec

    if compressor == "zstd":
        return _checksum.checksum_codecs([ZstdCodec(level=3)])
    if compressor == "blosc":
        return _checksum.checksum_codecs([BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")])
    raise ValueError(f"unknown compressor {compressor!r}; choose none, zstd or blosc")


