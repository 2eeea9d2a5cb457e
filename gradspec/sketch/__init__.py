"""Sketched per-example gradients (issue 22): seeded random projections of each clipped
per-example gradient into M columns, with independent blocks for error statements.

Zarr-free and below the trainer: the plan (`make_plan`, `SketchPlan`), the seeded
regeneration of every factor (`factor_seed`, `SketchFactors`), and the dense float64
reference `sketch_rows`. The per-example fast path, which never forms a per-example gradient
of a linear-like layer, lives with the ghost-clipping rules in ``gradspec.train``;
`DenseSketch` applies a plan to dense gradients (the per-step rows of issue 37), and
`dense_kinds`, `check_width` and `width_note` serve every sketched collection.
"""

from gradspec.sketch._dense import (
    WIDTH_NOTE_KEY,
    DenseSketch,
    check_width,
    dense_kinds,
    plan_attribute,
    same_plan,
    width_note,
)
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
    FAMILY,
    KINDS,
    SKETCH_KINDS,
    VERSION,
    ParamSketch,
    SketchPlan,
    energy_weights,
    make_plan,
)
from gradspec.sketch._reference import sketch_matrix, sketch_rows

__all__ = [
    "BlockFactors",
    "DEFAULT_BLOCKS",
    "DENSE_MAX",
    "DenseSketch",
    "FAMILY",
    "KINDS",
    "ParamSketch",
    "SKETCH_KINDS",
    "SketchFactors",
    "SketchPlan",
    "StackedFactors",
    "VERSION",
    "WIDTH_NOTE_KEY",
    "block_factors",
    "check_width",
    "dense_kinds",
    "energy_weights",
    "factor_seed",
    "make_plan",
    "plan_attribute",
    "same_plan",
    "sketch_matrix",
    "sketch_rows",
    "width_note",
]
