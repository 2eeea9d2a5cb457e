"""Sketched per-example gradients (issue 22): seeded random projections of each clipped
per-example gradient into M columns, with independent blocks for error statements.

The sketch in one place. The plan (`make_plan`, `SketchPlan`), the seeded regeneration of
every factor (`factor_seed`, `SketchFactors`), and the dense float64 reference `sketch_rows`.
The per-example fast path, which never forms a per-example gradient of a linear-like layer,
lives with the ghost-clipping rules in ``gradspec.train``; `DenseSketch` applies a plan to
dense gradients (the per-step rows of issue 37), and `dense_kinds`, `check_width` and
`width_note` serve every sketched collection. Reading a sketched store back: its blocks
among the columns pca selects (`sketch_selection`, `SketchSelection`,
`check_sketch_memory`), and the stated error of its spectrum from the block Grams: the
block bootstrap of version-2 plans (`block_error`, issue 37), the perturbation statement of
version-1 plans (`sketch_error`, issue 22), the report section pca writes (`error_report`),
and the check against an exact spectrum (`compare_to_exact`, `format_table`). The Gram pass
that forms the block Grams is ``gradspec.linalg``'s (``SketchGram``).

Importing it needs torch, not zarr: the stores (``gradspec.store``, the floor below) are
imported where a stored sketch is read.
"""

from gradspec.sketch._bootstrap import block_error, principal_sines
from gradspec.sketch._dense import (
    WIDTH_NOTE_KEY,
    DenseSketch,
    check_width,
    dense_kinds,
    plan_attribute,
    plan_settings,
    row_energies,
    same_plan,
    width_note,
)
from gradspec.sketch._error import compare_to_exact, error_report, format_table, sketch_error
from gradspec.sketch._factors import (
    DENSE_MAX,
    BlockFactors,
    SketchFactors,
    StackedFactors,
    block_factors,
    factor_seed,
)
from gradspec.sketch._plan import (
    DEFAULT_BLOCKS,
    FACTORED_VERSION,
    FAMILY,
    KINDS,
    ROTATION_BLOCK,
    SKETCH_KINDS,
    VERSION,
    ParamSketch,
    SketchPlan,
    energy_weights,
    make_plan,
)
from gradspec.sketch._reference import sketch_matrix, sketch_rows
from gradspec.sketch._selection import SketchSelection, check_sketch_memory, sketch_selection

__all__ = [
    "BlockFactors",
    "DEFAULT_BLOCKS",
    "DENSE_MAX",
    "DenseSketch",
    "FACTORED_VERSION",
    "FAMILY",
    "KINDS",
    "ParamSketch",
    "ROTATION_BLOCK",
    "SKETCH_KINDS",
    "SketchFactors",
    "SketchPlan",
    "SketchSelection",
    "StackedFactors",
    "VERSION",
    "WIDTH_NOTE_KEY",
    "block_error",
    "block_factors",
    "check_sketch_memory",
    "check_width",
    "compare_to_exact",
    "dense_kinds",
    "energy_weights",
    "error_report",
    "factor_seed",
    "format_table",
    "make_plan",
    "plan_attribute",
    "plan_settings",
    "principal_sines",
    "row_energies",
    "same_plan",
    "sketch_error",
    "sketch_matrix",
    "sketch_rows",
    "sketch_selection",
    "width_note",
]
