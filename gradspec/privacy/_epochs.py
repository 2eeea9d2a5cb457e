"""Steps per epoch, and epochs <-> steps, for the two samplers of DP-SGD.

The one place that says how long an epoch is:

* Poisson sampling with rate q: ``1 / q`` steps per epoch in expectation (a float).
* Shuffled fixed-size batches of B out of n: ``n // B`` batches (the remainder is
  dropped), `batches_per_epoch`; where only q = B / n is known (``gradspec account``,
  `compute_epsilon`), ``max(1, round(1 / q))``, which is the same count when the
  trainer hands the accountant q = 1 / (n // B).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gradspec._enums import Sampling, parse_choice
from gradspec.privacy._validate import check_sample_rate

#: Slack when turning a fractional number of epochs into steps, so that e.g.
#: 0.3 epochs of 10 steps are 3 steps and not 4 (0.3 * 10 = 3.0000000000000004).
_EPOCH_SLACK = 1e-9


def batches_per_epoch(n: int, batch_size: int) -> int:
    """Batches in one epoch of shuffled fixed-size batches: ``n // batch_size``.

    Args:
        n: dataset size.
        batch_size: examples per batch, in [1, n].
    """
    return int(n) // int(batch_size)


def accountant_rate(n: int, batch_size: int, sampling: Sampling | str) -> float:
    """The sample rate the accountant counts for batches of B out of n, the one place that says it:
    q = B / n under Poisson sampling; 1 / (n // B) for shuffled batches (one Gaussian mechanism
    a batch of each epoch of n // B batches, the remainder dropped), which B / n is not."""
    if parse_choice(Sampling, sampling, "sampling") == Sampling.POISSON:
        return int(batch_size) / int(n)
    return 1.0 / batches_per_epoch(n, batch_size)


def steps_per_epoch(sample_rate: float, *, sampling: Sampling | str = Sampling.SHUFFLE) -> float:
    """Steps per epoch at sample rate q.

    Shuffled batches (the default): ``max(1, round(1/q))``, an int. For q = b/n with
    n/b not an integer, round(n/b) <= ceil(n/b), so counting epochs with it never
    undercounts them. Poisson sampling: ``1 / q``, the expected number (a float).

    Args:
        sample_rate: q in (0, 1].
        sampling: ``shuffle`` or ``poisson``.
    """
    q = check_sample_rate(sample_rate)
    if parse_choice(Sampling, sampling, "sampling") == Sampling.POISSON:
        return 1 / q
    return max(1, round(1 / q))


def steps_for_epochs(epochs: float, per_epoch: float) -> int:
    """Steps that ``epochs`` epochs of ``per_epoch`` steps take: ``ceil(epochs * per_epoch)``.

    Up to a slack of 1e-9, so that rounding in the product never adds a step.
    """
    return math.ceil(epochs * per_epoch - _EPOCH_SLACK)


def epochs_for_steps(steps: int, sample_rate: float, *, sampling: Sampling | str = Sampling.SHUFFLE) -> float:
    """Epochs that ``steps`` steps at sample rate q make: ``steps / steps_per_epoch(q)``
    for shuffled batches, ``steps * q`` under Poisson sampling."""
    if parse_choice(Sampling, sampling, "sampling") == Sampling.POISSON:
        return steps * check_sample_rate(sample_rate)
    return steps / steps_per_epoch(sample_rate)


def accounted_sample_rate(run: Mapping[str, Any]) -> float | None:
    """The sample rate the accountant counted for a run config (a store's ``config``, run.json).

    Poisson sampling: q = B / n, the recorded ``sample_rate``. Shuffled batches: 1 / (n // B),
    one Gaussian mechanism a batch of each epoch; the recorded ``sample_rate`` is then B / n,
    which `gradspec account --q` refuses. From ``accounted_sample_rate`` where the run recorded
    it, else from ``n_train`` and the batch size; None where the config does not say.
    """
    if isinstance(run.get("accounted_sample_rate"), int | float):
        return float(run["accounted_sample_rate"])
    collect = run.get("collect") or {}
    q = run.get("sample_rate")
    if str(collect.get("sampling", Sampling.POISSON.value)) != Sampling.SHUFFLE.value:
        return float(q) if isinstance(q, int | float) else None
    n, b = run.get("n_train"), collect.get("batch_size")
    if isinstance(n, int) and isinstance(b, int) and 0 < b <= n:
        return accountant_rate(n, b, Sampling.SHUFFLE)
    return None


def rate_text(sample_rate: float, accounted: float | None) -> str:
    """``q = ...`` as a run prints it: the accounted rate, with B / n beside it where they differ
    (shuffled batches), so that the printed q is the one `gradspec account --q` takes."""
    if accounted is None or not math.isfinite(accounted) or math.isclose(accounted, sample_rate, rel_tol=1e-12):
        return f"q = {sample_rate:.4g}"
    return (f"q = {accounted:.4g} (shuffled: 1 / {round(1 / accounted)} batches an epoch; "
            f"B / n = {sample_rate:.4g})")
