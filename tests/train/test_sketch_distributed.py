"""Sketched collection under torch.distributed (issue 37 §3): 2 gloo processes on the CPU, as
``torchrun`` runs them, against one process with the same seeds.

Per-step rows: every rank computes its share's clipped sum, the ranks all-reduce it (as they do
for the update), and rank 0 sketches the mean, once (the sketch is linear: this equals the sum of
the ranks' sketched sums divided by b, without a second collective). The rows then differ from
one process's by the float32 rounding of the sums (tests/train/test_distributed.py) carried
through the sketch (whose factors have norm about 1): compared at ``atol = 1e-6``, ``rtol = 1e-5``.
Per-example rows: each rank sketches its own examples (ghost clipping, the same seeded plan on
every rank) and rank 0 gathers the M-column rows in batch order.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.collect import collect
from gradspec.store import GradientStore

from ..collect._tiny import tiny_task
from ..collect.test_collect import cfg
from ._ranks import run_ranks
from .test_distributed import ROWS, _assert_same_rows, _collect, _ok

SKETCH = {"sketch": 96, "sketch_blocks": 4, "sketch_seed": 2}


@pytest.mark.slow  # 21 s: two gloo processes; DenseSketch's arithmetic is covered fast in tests/sketch/test_dense.py
def test_two_ranks_sketch_per_step_rows_as_one_process(tmp_path):
    options = {"backend": "ghost", "steps": 6, "batch_size": 16, **SKETCH}
    lead, other = _ok(run_ranks(_collect, tmp_path / "two", options))
    single = collect(cfg(**options), out=tmp_path / "one", task=tiny_task())
    assert other["store"] is None and other["rows"] == 0
    two, one = GradientStore.open(lead["store"]), GradientStore.open(single.store)
    assert two.sketch == one.sketch and not two.per_example and two.config["world_size"] == 2
    assert two.status == "complete" and two.n_rows == one.n_rows > 0
    _assert_same_rows(one, two)  # (one process's rows are the plan of the exact rows: tests/collect/test_sketch_steps.py)
    assert lead["epsilon"] == single.epsilon


@pytest.mark.slow
def test_two_ranks_sketch_per_example_rows_as_one_process(tmp_path):
    options = {"mode": "per-example", "backend": "ghost", "steps": 4, **SKETCH}
    lead, _ = _ok(run_ranks(_collect, tmp_path / "two", options))
    single = collect(cfg(**options), out=tmp_path / "one", task=tiny_task())
    two, one = GradientStore.open(lead["store"]), GradientStore.open(single.store)
    assert two.sketch == one.sketch and two.per_example and two.p == two.sketch["M"]
    a, b = one.row_meta(), two.row_meta()
    for key in ("step", "example_index", "batch_size"):
        np.testing.assert_array_equal(b[key], a[key])
    np.testing.assert_allclose(two.read(), one.read(), **ROWS)
    for get in ("row_norms", "clip_factors", "param_norms"):
        np.testing.assert_allclose(getattr(two, get)(), getattr(one, get)(), rtol=1e-5)
