"""Stores on disk: the only package that imports zarr."""

from gradspec._layout import ParamLayout, ParamSpec, match_names
from gradspec.store._gradients import META_FIELDS, GradientStore
from gradspec.store._gradients_schema import SKETCH_KEY, STATS_ARRAY
from gradspec.store._integrity import StoreDamagedError
from gradspec.store._lock import LOCK_NAME, DirectoryBusyError, RunLock
from gradspec.store._precision import disk_rows
from gradspec.store._precision import material as precision_material
from gradspec.store._rowkind import MEAN_OF_EXAMPLES, RowKind, kind_mismatch, row_kind
from gradspec.store._source import (
    as_slice,
    config_digest,
    describe_row_indices,
    jsonable,
    resolve_rows,
    resolved_path,
    rows_digest,
    rows_text,
)
from gradspec.store._spectrum import SpectrumStore
from gradspec.store._spectrum_schema import V_UNIT_ATOL, SpectrumStatus
from gradspec.store._writer import BackgroundWriter, WriterError
from gradspec.store._zarr import is_url, update_attrs

__all__ = [
    "BackgroundWriter",
    "DirectoryBusyError",
    "GradientStore",
    "LOCK_NAME",
    "MEAN_OF_EXAMPLES",
    "META_FIELDS",
    "ParamLayout",
    "ParamSpec",
    "RowKind",
    "RunLock",
    "SKETCH_KEY",
    "STATS_ARRAY",
    "SpectrumStatus",
    "SpectrumStore",
    "StoreDamagedError",
    "V_UNIT_ATOL",
    "WriterError",
    "as_slice",
    "config_digest",
    "describe_row_indices",
    "disk_rows",
    "is_url",
    "jsonable",
    "kind_mismatch",
    "match_names",
    "precision_material",
    "resolve_rows",
    "resolved_path",
    "row_kind",
    "rows_digest",
    "rows_text",
    "update_attrs",
]


def open_store(path, mode: str = "r"):
    """Open any gradspec store, gradient or spectrum, by what its attributes say it is."""
    from gradspec.store._zarr import KIND_KEY, open_checked

    kind = open_checked(path, None, mode).attrs.asdict()[KIND_KEY]
    if kind == "gradients":
        return GradientStore.open(path, mode)
    if kind == "spectrum":
        return SpectrumStore.open(path, mode)
    raise ValueError(f"{str(path)!r} is a gradspec store of unknown kind {kind!r}; its zarr.json is damaged")


__all__ += ["open_store"]
