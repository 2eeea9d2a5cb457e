"""A run's length in epochs: the trainer counts steps as ``gradspec.privacy`` does.

Before, the trainer computed ``ceil(epochs * n / B)`` itself, and the float product put
e.g. 2.2 epochs of 50 / 22 Poisson steps at 5.000000000000001, so 6 steps, where the
accountant's `steps_for_epochs` (and `gradspec account --epochs`) counted 5.
The reference here is exact rational arithmetic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from gradspec.privacy import accountant_rate, batches_per_epoch, steps_for_epochs, steps_per_epoch
from gradspec.train import TrainConfig, train
from tests.collect._tiny import tiny_task

# (n, batch size, epochs, sampling): sizes where the float product lands just above an
# integer (the old count was one step too many), and plain ones.
CASES = [
    (50, 22, 2.2, "poisson"),
    (70, 13, 1.3, "poisson"),
    (64, 10, 0.35, "poisson"),
    (100, 4, 2.2, "shuffle"),
    (25, 1, 2.2, "shuffle"),
    (64, 10, 1.5, "shuffle"),
]


def _exact(n: int, batch: int, epochs: float, sampling: str) -> int:
    per_epoch = Fraction(n, batch) if sampling == "poisson" else Fraction(n // batch)
    return math.ceil(Fraction(str(epochs)) * per_epoch)


@pytest.mark.parametrize(("n", "batch", "epochs", "sampling"), CASES)
def test_the_privacy_helpers_count_epochs_exactly(n, batch, epochs, sampling):
    per_epoch = (steps_per_epoch(batch / n, sampling="poisson") if sampling == "poisson"
                 else batches_per_epoch(n, batch))
    assert steps_for_epochs(epochs, per_epoch) == _exact(n, batch, epochs, sampling)


@pytest.mark.parametrize(("n", "batch", "epochs", "sampling"), CASES)
def test_the_trainer_runs_the_steps_the_privacy_helpers_count(tmp_path, n, batch, epochs, sampling):
    cfg = TrainConfig(task="tiny", epochs=epochs, steps=None, batch_size=batch, sampling=sampling,
                      noise_multiplier=1.0, lr=0.1, optimizer="sgd", eval_every=0, log_every=1000,
                      checkpoint_every=1000, delta=1e-5 / n)
    res = train(cfg, out=tmp_path / "run", task=tiny_task(n=n))
    assert res.steps == _exact(n, batch, epochs, sampling)
    # the rate it accounted: B / n under Poisson, 1 / (n // B) shuffled (one rule, privacy's)
    want = Fraction(batch, n) if sampling == "poisson" else Fraction(1, n // batch)
    assert res.accounted_sample_rate == accountant_rate(n, batch, sampling) == pytest.approx(float(want), rel=1e-15)
