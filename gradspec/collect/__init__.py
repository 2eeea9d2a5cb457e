"""Training that streams clipped (per-example) gradients into a gradient store."""

from gradspec.collect._config import CollectConfig
from gradspec.collect._loop import CollectResult, collect, evaluate
from gradspec.collect._per_example import PerExampleGradients, layout_for, select_parameters
from gradspec.collect._sampling import PoissonSampler, ShuffleSampler

__all__ = [
    "CollectConfig",
    "CollectResult",
    "PerExampleGradients",
    "PoissonSampler",
    "ShuffleSampler",
    "collect",
    "evaluate",
    "layout_for",
    "select_parameters",
]
