"""Sketched per-example gradients (issue 22): seeded random projections of each clipped
per-example gradient into M columns, with independent blocks for error statements.

Zarr-free and below the trainer: the plan (`make_plan`, `SketchPlan`), the seeded
regeneration of every factor (`factor_seed`, `SketchFactors`), and the dense float64
reference `sketch_rows`. The fast path, which never forms a per-example gradient of a
linear-like layer, lives with the ghost-clipping rules in ``gradspec.train``.
"""

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
    make_plan,
)
from gradspec.sketch._reference import sketch_matrix, sketch_rows

__all__ = [
    "BlockFactors",
    "DEFAULT_BLOCKS",
    "DENSE_MAX",
    "FAMILY",
    "KINDS",
    "ParamSketch",
    "SKETCH_KINDS",
    "SketchFactors",
    "SketchPlan",
    "StackedFactors",
    "VERSION",
    "block_factors",
    "factor_seed",
    "make_plan",
    "sketch_matrix",
    "sketch_rows",
]
