"""epsilon(delta) of a composition of DP-SGD mechanisms, with Google's dp-accounting as the engine.

Pure math: `_epsilon` maps a tuple of events (mechanisms with counts) and delta to
epsilon; the stateful `PrivacyAccountant` (`gradspec.privacy._accountant`) records the
events and calls it.

(For RDP, gradspec evaluates dp-accounting's formulas itself, vectorised: see below.)

Three methods (`gradspec._enums.Accounting`), all for the add/remove-one
neighbouring relation:

- ``pld``: privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022),
  the tightest; it reads epsilon(delta) off the composed distribution, so there is no
  conversion. dp-accounting discretises each kind of step; the composition is
  `gradspec.privacy._pld`'s port of dp-accounting's (the single step cached, sizes checked
  before anything is allocated: a run too long for `MAX_PLD_POINTS` is refused, naming the
  steps that fit and ``rdp``).
- ``rdp``: Renyi DP (Mironov 2017) on `RDP_ORDERS`, converted with
  dp-accounting's improved bound (`dp_accounting.rdp.compute_epsilon`)
  eps = min_a RDP(a) + log(1 - 1/a) - log(delta * a)/(a - 1)
  (Balle et al. 2020, Prop. 12; Canonne et al. 2020, Eq. 20).
- ``rdp-classic``: the same RDP values, converted with the classical bound of
  older papers (Mironov 2017, Prop. 3; Abadi et al. 2016):
  eps = min_a RDP(a) + log(1/delta)/(a - 1).

rdp-classic >= rdp (the improved bound is smaller at every order) and pld is
smallest up to its discretisation.

RDP orders. Both RDP methods minimise over orders on a lattice: fractional
orders 1.02, 1.03, ..., 11.99 and the integers 12, ..., 10,000. `RDP_ORDERS` is
a subset: every lattice order up to 3, then the lattice orders nearest a
geometric sequence of a - 1 with ratio 1.005 up to 12, every integer up to 256,
and ratios of sqrt(2) above (the previous grid 1.1, ..., 11, 12, ..., 64, 128,
..., 1024 is kept). When the best order in `RDP_ORDERS` is 256 or more, the
integers between its two neighbours are searched too (16 evenly spaced, then
around the best of those, down to single integers); below 256 the answer is
exactly dp-accounting's `RdpAccountant` on `RDP_ORDERS`. Integer resolution
matters because at small epsilon the optimum often sits where the subsampled
Gaussian's RDP turns steep (near a = 2 sigma^2 log(1/q)), where each order
moves epsilon by about 1/a. Against the minimum over the whole lattice (with
dp-accounting's RDP), epsilon is at most 2.3e-4 (relative) larger for sigma in
[0.5, 50], q in [1e-4, 0.5], 10 to 1e5 steps, delta 1e-5 and 1e-8
(tests/privacy/test_rdp_orders.py). The previous grid over-reported by up to
2x at epsilon ~ 0.1 (sigma 3, q 1e-3, one step), by 17-24% at epsilon 0.02-0.1
over 1000 steps (sigma 2-5, q <= 1e-3), by 2-6% at sigma 14-30, q 0.025, 1200
steps, and 25x at epsilon ~ 1e-4. RDP values come from
`gradspec.privacy._rdp`, a vectorised port of dp-accounting's formulas checked
against it order by order: one evaluation of all orders takes 10-80 ms (the
previous grid took 20-150 ms in dp-accounting's loops, at every call), and each
Poisson mechanism's per-step values are cached, so the epsilon logged at every
step costs about a millisecond (a few where the search runs).

Sampling. Poisson-subsampled steps are Poisson-subsampled Gaussian mechanisms.
Shuffled fixed-size batches are accounted WITHOUT amplification: each example
is in exactly one batch per epoch, so an epoch is one Gaussian mechanism
(parallel composition over its steps), and a run of T steps with S steps per
epoch is ceil(T/S) Gaussian mechanisms. We deliberately do not account
shuffled batches as if they were Poisson sampled: Chua et al. (2024, "How
private are DP-SGD implementations?") show that this underestimates epsilon.
Each such epoch has sensitivity ``SHUFFLED_SENSITIVITY`` = 2 (in units of C), not 1:
the batches hold a fixed B examples and the remainder of n // B is dropped, so an
example added to the data takes some other example's place in a batch (couple the
two permutations by swapping it with the first dropped one: the two epochs then differ
in one batch, whose sum moves by g_x − g_y, up to 2C), and a replaced example moves
its batch's sum by up to 2C too. So an epoch is the Gaussian mechanism at noise
multiplier σ/2. (Until 2026-12-04 it was counted at σ, sensitivity C: at σ = 1 with one
batch an epoch, the δ actually reached at the reported ε was 5.9e-2, not 1e-5.) The
coupling needs n // B to be the same for both datasets, as it is under replace-one.

Gaussian mechanisms (shuffled epochs, `record_gaussian`) compose exactly: k
mechanisms with multipliers sigma_i are one with
sigma = (sum_i 1/sigma_i^2)^(-1/2) (Dong et al. 2019, Gaussian DP). We fold them
into that one mechanism before calling the library; with ``pld`` and no Poisson
steps its epsilon is the analytic Gaussian mechanism's
(`dp_accounting.get_epsilon_gaussian`, Balle & Wang 2018), exact and fast.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, NamedTuple

import numpy as np

from gradspec._enums import Accounting

logger = logging.getLogger(__name__)

# The RDP order lattice (see the module docstring): fractional orders in steps of 0.01
# below FRACTIONAL_TOP, integers from there to MAX_ORDER.
FRACTIONAL_TOP = 12
MAX_ORDER = 10_000
DENSE_TOP = 256  # RDP_ORDERS holds every lattice order below this; above, the best is refined
_REFINE_POINTS = 16


def _rdp_orders() -> tuple[float, ...]:
    # The previous grid, kept as a subset: 1.1, 1.2, ..., 11.0, 12, ..., 64, 128, ..., 1024.
    orders = {round(1 + x / 10, 1) for x in range(1, 101)} | {512.0, 1024.0}
    u = 0.02  # a - 1, geometric with ratio 1.005: every lattice order up to a = 3
    while 1 + u < FRACTIONAL_TOP:
        orders.add(round(1 + u, 2))
        u *= 1.005
    orders |= {float(a) for a in range(FRACTIONAL_TOP, DENSE_TOP + 1)}
    a = float(DENSE_TOP)
    while a < MAX_ORDER:
        a *= math.sqrt(2)
        orders.add(float(min(MAX_ORDER, round(a))))
    return tuple(sorted(orders))


RDP_ORDERS: tuple[float, ...] = _rdp_orders()

#: The sensitivity of a shuffled epoch's batch sums, in units of the clip norm (module note):
#: a fixed-size batch's sum moves by up to 2C when one example takes another's place.
SHUFFLED_SENSITIVITY = 2.0


class _Event(NamedTuple):
    """``count`` repetitions of one mechanism; consecutive equal mechanisms merge."""

    kind: str  # "poisson" | "shuffle" (one shuffled epoch) | "gaussian"
    noise_multiplier: float
    sample_rate: float  # 1.0 unless kind == "poisson"
    count: int


@functools.lru_cache(maxsize=256)
def _epsilon(method: Accounting, events: tuple[_Event, ...], delta: float) -> float:
    """epsilon(delta) of the composition of ``events``; cached (cheap repeated logging)."""
    import dp_accounting as dpa

    if not events:
        return 0.0
    if any(e.noise_multiplier == 0 for e in events):
        return math.inf
    gaussian_weight = 0.0  # sum of count / sigma^2 over (non-subsampled) Gaussian mechanisms
    poisson: list[tuple[float, float, int]] = []  # (q, sigma, steps)
    for e in events:
        if e.kind == "poisson" and e.sample_rate < 1:
            poisson.append((e.sample_rate, e.noise_multiplier, e.count))
        else:
            sens = SHUFFLED_SENSITIVITY if e.kind == "shuffle" else 1.0
            gaussian_weight += e.count * (sens / e.noise_multiplier) ** 2
    if method == Accounting.PLD:
        if not poisson:
            return float(dpa.get_epsilon_gaussian(gaussian_weight**-0.5, delta))
        from gradspec.privacy._pld import pld_epsilon

        groups: dict[tuple[float, float], int] = {}  # composition commutes: one count per mechanism
        for q, sigma, count in poisson:
            groups[q, sigma] = groups.get((q, sigma), 0) + count
        eps = pld_epsilon([(q, sigma, count) for (q, sigma), count in groups.items()],
                          gaussian_weight**-0.5 if gaussian_weight > 0 else None, delta)
        if math.isfinite(eps):
            return eps
        # The discretised PLD truncates its tail, so at a tiny delta (<= ~1e-15) it can only
        # answer inf. RDP bounds the same composition; both are valid upper bounds, so the
        # smaller one is too.
        logger.info("PLD gives epsilon = inf at delta = %g; using the RDP bound", delta)
        return _epsilon(Accounting.RDP, events, delta)

    from gradspec.privacy._rdp import poisson_gaussian_rdp  # scipy: imported when first used

    def rdp_at(orders: np.ndarray, cached: bool = False) -> np.ndarray:
        """RDP of the whole composition (Renyi DP adds up) at ``orders``."""
        total = orders * (gaussian_weight / 2)  # Gaussian mechanism: a / (2 sigma^2)
        for q, sigma, count in poisson:
            step = _step_rdp(q, sigma) if cached else poisson_gaussian_rdp(q, sigma, orders)
            total = total + count * step
        return total

    classic = method == Accounting.RDP_CLASSIC
    orders = np.asarray(RDP_ORDERS)
    rdp = rdp_at(orders, cached=True)
    orders, rdp = _refine(orders, rdp, rdp_at, delta, classic)
    if not classic:
        return float(dpa.rdp.compute_epsilon(orders, rdp, delta)[0])
    return rdp_classic_epsilon(orders, rdp, delta)


@functools.lru_cache(maxsize=256)
def _step_rdp(q: float, sigma: float) -> np.ndarray:
    """Per-step RDP of one Poisson-subsampled Gaussian mechanism on `RDP_ORDERS` (read-only)."""
    from gradspec.privacy._rdp import poisson_gaussian_rdp

    rdp = poisson_gaussian_rdp(q, sigma, np.asarray(RDP_ORDERS))
    if np.isinf(rdp).any():
        logger.debug("%d fractional RDP orders did not converge (q=%g, sigma=%g) and are left out",
                     int(np.isinf(rdp).sum()), q, sigma)
    rdp.flags.writeable = False
    return rdp


def _conversion(orders: np.ndarray, rdp: np.ndarray, delta: float, classic: bool) -> np.ndarray:
    """epsilon at each order: the classical bound, or dp-accounting's improved one (same cases)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if classic:
            eps = rdp + math.log(1 / delta) / (orders - 1)
        else:
            eps = rdp + np.log1p(-1 / orders) - np.log(delta * orders) / (orders - 1)
            eps = np.where(orders > 1.01, eps, np.inf)
            eps = np.where(delta**2 + np.expm1(-rdp) > 0, 0.0, eps)  # the KL bound suffices
            eps = np.where(rdp < 0, 0.0, eps)
    return np.where(np.isnan(eps), np.inf, eps)


def _refine(orders: np.ndarray, rdp: np.ndarray, rdp_at: Any, delta: float, classic: bool):
    """Add the integer orders searched around the best order when that is >= DENSE_TOP.

    Between the best order's neighbours in `RDP_ORDERS`, evaluate 16 evenly spaced
    integers, keep the best of them and its two neighbours as the new bracket, and repeat
    until the bracket holds at most 16 integers, which are all evaluated. Returns
    (orders, rdp) with the evaluated orders appended.
    """
    eps = _conversion(orders, rdp, delta, classic)
    best = int(np.argmin(eps))
    if orders[best] < DENSE_TOP or not np.isfinite(eps[best]):
        return orders, rdp
    lo, hi = int(orders[best - 1]), int(orders[min(best + 1, len(orders) - 1)])
    found_orders, found_rdp = [orders], [rdp]
    while hi - lo > 1:
        last = hi - lo + 1 <= _REFINE_POINTS
        points = np.arange(lo + 1, hi) if last else np.unique(np.round(np.linspace(lo, hi, _REFINE_POINTS)))
        points = points.astype(np.float64)
        values = rdp_at(points)
        found_orders.append(points)
        found_rdp.append(values)
        if last:
            break
        j = int(np.argmin(_conversion(points, values, delta, classic)))
        lo, hi = int(points[max(j - 1, 0)]), int(points[min(j + 1, len(points) - 1)])
    return np.concatenate(found_orders), np.concatenate(found_rdp)


def rdp_classic_epsilon(orders: Any, rdp: Any, delta: float) -> float:
    """The classical RDP -> (eps, delta) conversion: min over a of RDP(a) + log(1/delta)/(a-1).

    Mironov (2017), Prop. 3; as used by Abadi et al. (2016) and most papers before 2020.
    """
    import numpy as np

    orders = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(rdp, dtype=np.float64)
    if orders.shape != rdp.shape or orders.ndim != 1 or np.any(orders <= 1):
        raise ValueError("orders and rdp must be 1-d arrays of equal length, with every order > 1")
    eps = rdp + math.log(1 / delta) / (orders - 1)
    return float(max(0.0, np.nanmin(eps)))

