"""Privacy accounting for DP-SGD, with Google's dp-accounting as the engine.

(For RDP, gradspec evaluates dp-accounting's formulas itself, vectorised: see below.)

Three methods (`gradspec._enums.Accounting`), all for the add/remove-one
neighbouring relation:

- ``pld``: privacy loss distributions (`dp_accounting.pld.PLDAccountant`,
  Koskela et al. 2020; Doroshenko et al. 2022), the tightest; it reads
  epsilon(delta) off the composed distribution, so there is no conversion.
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
import numbers
from typing import Any, NamedTuple

import numpy as np

from gradspec._enums import Accounting, parse_choice

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

_STATE_VERSION = 1
_KINDS = ("poisson", "shuffle", "gaussian")


def default_delta(n: int) -> float:
    """The default delta for a training set of ``n`` examples: ``n ** -1.1``.

    Slightly below 1/n, as in Li et al. (2022, "Large language models can be
    strong differentially private learners").

    Raises:
        ValueError: if ``n`` is not an integer >= 2.
    """
    n = _check_int(n, "n (the training-set size)", minimum=2)
    return float(n) ** -1.1


# ----------------------------------------------------------------------------- validation
def _check_int(value: Any, what: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def _check_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r}")
    return float(value)


def check_noise_multiplier(value: Any) -> float:
    """A finite noise multiplier >= 0 (0 means no noise: non-private)."""
    sigma = _check_float(value, "noise_multiplier")
    if not math.isfinite(sigma) or sigma < 0:
        raise ValueError(f"noise_multiplier must be finite and >= 0 (0 = non-private), got {sigma}")
    return sigma


def check_sample_rate(value: Any) -> float:
    q = _check_float(value, "sample_rate")
    if not 0 < q <= 1:
        raise ValueError(f"sample_rate must be in (0, 1] (batch size / dataset size), got {q}")
    return q


def check_delta(value: Any) -> float:
    delta = _check_float(value, "delta")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), e.g. n ** -1.1 for n examples; got {delta}")
    return delta


# ----------------------------------------------------------------------------- events
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
            gaussian_weight += e.count / e.noise_multiplier**2
    if method == Accounting.PLD:
        parts: list[Any] = [
            dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), count)
            for q, sigma, count in poisson
        ]
        if gaussian_weight > 0:
            parts.append(dpa.GaussianDpEvent(gaussian_weight**-0.5))
        if not poisson:
            return float(dpa.get_epsilon_gaussian(gaussian_weight**-0.5, delta))
        accountant = dpa.pld.PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
        eps = float(accountant.compose(dpa.ComposedDpEvent(parts)).get_epsilon(delta))
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


# ----------------------------------------------------------------------------- accountant
class PrivacyAccountant:
    """Records the mechanisms a DP-SGD run applies and answers ``epsilon(delta)``.

    Events are kept as a compact list (consecutive identical mechanisms merge
    into a count), so `state_dict` is a small JSON-able dict and a resumed run
    continues its accounting exactly. ``epsilon`` recomputes from the events
    with dp-accounting, cached by (events, delta); with ``pld`` a recomputation
    costs about a second for 10^4 Poisson steps, so log epsilon every few steps.

    Args:
        method: ``pld`` (default), ``rdp`` or ``rdp-classic``; see the module docstring.

    Example:
        >>> acc = PrivacyAccountant(method="rdp")
        >>> acc.record_poisson(1.1, 256 / 60000, steps=1000)
        >>> round(acc.epsilon(1e-5), 3)
        0.889
    """

    def __init__(self, *, method: Accounting | str = Accounting.PLD) -> None:
        self.method: Accounting = parse_choice(Accounting, method, "accounting method")
        self._events: list[_Event] = []
        self._steps = 0
        # The shuffled epoch in progress: (steps done in it, its noise multiplier, steps per epoch).
        self._epoch: tuple[int, float, int] | None = None

    # ------------------------------------------------------------------ recording
    def _append(self, kind: str, sigma: float, q: float, count: int) -> None:
        if count == 0:
            return
        last = self._events[-1] if self._events else None
        if last is not None and (last.kind, last.noise_multiplier, last.sample_rate) == (
            kind,
            sigma,
            q,
        ):
            self._events[-1] = last._replace(count=last.count + count)
        else:
            self._events.append(_Event(kind, sigma, q, count))

    def record_poisson(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` DP-SGD steps on Poisson-sampled batches (each example joins w.p. q).

        Args:
            noise_multiplier: sigma; the noise std is sigma times the clipping norm.
            sample_rate: q in (0, 1]; q = 1 is full-batch (a plain Gaussian mechanism).
            steps: how many such steps (>= 1).
        """
        sigma = check_noise_multiplier(noise_multiplier)
        q = check_sample_rate(sample_rate)
        steps = _check_int(steps, "steps", minimum=1)
        self._append("poisson", sigma, q, steps)
        self._steps += steps

    def record_shuffled(
        self, noise_multiplier: float, steps_per_epoch: int, steps: int = 1
    ) -> None:
        """Record ``steps`` DP-SGD steps on shuffled fixed-size batches.

        Every started epoch is one Gaussian mechanism (no amplification by
        subsampling); a partial epoch is carried across calls, so 10 calls of
        one step with 10 steps per epoch record one mechanism, not ten. If the
        noise multiplier changes inside an epoch, the rest of that epoch is
        recorded as a further Gaussian mechanism (an upper bound).

        Args:
            noise_multiplier: sigma of these steps.
            steps_per_epoch: batches per epoch (>= 1); may change only at an epoch boundary.
            steps: how many steps (>= 1).

        Raises:
            ValueError: on bad inputs, or a change of ``steps_per_epoch`` inside an epoch.
        """
        sigma = check_noise_multiplier(noise_multiplier)
        per_epoch = _check_int(steps_per_epoch, "steps_per_epoch", minimum=1)
        steps = _check_int(steps, "steps", minimum=1)
        new = 0
        rest = steps
        position = 0
        if self._epoch is not None:
            position, open_sigma, open_per_epoch = self._epoch
            if per_epoch != open_per_epoch:
                raise ValueError(
                    f"steps_per_epoch changed from {open_per_epoch} to {per_epoch} inside an epoch "
                    f"({position} of {open_per_epoch} steps done); change it only at an epoch boundary"
                )
            inside = min(rest, per_epoch - position)  # steps that finish the open epoch
            if sigma != open_sigma:
                new += 1
            rest -= inside
        new += -(-rest // per_epoch)  # ceil
        self._append("shuffle", sigma, 1.0, new)
        position = (position + steps) % per_epoch
        self._epoch = (position, sigma, per_epoch) if position else None
        self._steps += steps

    def record_gaussian(self, noise_multiplier: float, count: int = 1) -> None:
        """Record ``count`` non-subsampled Gaussian mechanisms (sensitivity 1, std sigma).

        For privacy spent outside the gradient steps, e.g. a noisy
        preconditioner computed on the private data. Does not advance `steps`.
        """
        sigma = check_noise_multiplier(noise_multiplier)
        count = _check_int(count, "count", minimum=1)
        self._append("gaussian", sigma, 1.0, count)

    # ------------------------------------------------------------------ queries
    @property
    def steps(self) -> int:
        """DP-SGD steps recorded (Poisson and shuffled; not `record_gaussian`)."""
        return self._steps

    @property
    def events(self) -> list[dict[str, Any]]:
        """The compact event list, as dicts (a copy)."""
        return [e._asdict() for e in self._events]

    def epsilon(self, delta: float) -> float:
        """epsilon at ``delta`` of everything recorded (0 if nothing; inf if any sigma is 0)."""
        return _epsilon(self.method, tuple(self._events), check_delta(delta))

    def to_dict(self, delta: float | None = None) -> dict[str, Any]:
        """A readable summary: method, steps, events; and epsilon when ``delta`` is given."""
        out: dict[str, Any] = {
            "method": self.method.value,
            "steps": self._steps,
            "events": self.events,
        }
        if delta is not None:
            out["delta"] = float(delta)
            out["epsilon"] = self.epsilon(delta)
        return out

    def __repr__(self) -> str:
        return f"PrivacyAccountant(method={self.method.value!r}, steps={self._steps}, events={len(self._events)})"

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able dict from which `load_state_dict` restores this accountant."""
        epoch = None
        if self._epoch is not None:
            position, sigma, per_epoch = self._epoch
            epoch = {"position": position, "noise_multiplier": sigma, "steps_per_epoch": per_epoch}
        return {
            "version": _STATE_VERSION,
            "method": self.method.value,
            "steps": self._steps,
            "events": self.events,
            "epoch": epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` output, after checking it; nothing changes on error.

        Raises:
            ValueError: naming what is wrong (method mismatch, missing or bad fields).
        """
        if not isinstance(state, dict):
            raise ValueError(f"accountant state must be a dict, got {type(state).__name__}")
        missing = [k for k in ("method", "steps", "events") if k not in state]
        if missing:
            raise ValueError(f"accountant state lacks {', '.join(missing)}")
        if state.get("version", _STATE_VERSION) != _STATE_VERSION:
            raise ValueError(
                f"accountant state version {state['version']!r}; this gradspec reads {_STATE_VERSION}"
            )
        if state["method"] != self.method.value:
            raise ValueError(
                f"accountant state was recorded with method {state['method']!r}, "
                f"but this accountant uses {self.method.value!r}; create it with method={state['method']!r}"
            )
        try:
            steps = _check_int(state["steps"], "steps", minimum=0)
            if not isinstance(state["events"], list):
                raise ValueError(f"events must be a list, got {type(state['events']).__name__}")
            events = [_load_event(i, raw) for i, raw in enumerate(state["events"])]
            epoch = _load_epoch(state.get("epoch"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad accountant state: {exc}") from None
        self._events, self._steps, self._epoch = events, steps, epoch


def _load_event(i: int, raw: Any) -> _Event:
    if not isinstance(raw, dict):
        raise ValueError(f"event {i} must be a dict, got {type(raw).__name__}")
    missing = [f for f in _Event._fields if f not in raw]
    if missing:
        raise ValueError(f"event {i} lacks {', '.join(missing)}")
    if raw["kind"] not in _KINDS:
        raise ValueError(f"event {i} has kind {raw['kind']!r}; expected one of {', '.join(_KINDS)}")
    sigma = check_noise_multiplier(raw["noise_multiplier"])
    q = check_sample_rate(raw["sample_rate"])
    if raw["kind"] != "poisson" and q != 1:
        raise ValueError(f"event {i} ({raw['kind']}) must have sample_rate 1, got {q}")
    return _Event(raw["kind"], sigma, q, _check_int(raw["count"], f"event {i} count", minimum=1))


def _load_epoch(raw: Any) -> tuple[int, float, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or {"position", "noise_multiplier", "steps_per_epoch"} - set(raw):
        raise ValueError(
            "epoch must be null or a dict with position, noise_multiplier, steps_per_epoch"
        )
    per_epoch = _check_int(raw["steps_per_epoch"], "epoch steps_per_epoch", minimum=1)
    position = _check_int(raw["position"], "epoch position", minimum=1)
    if position >= per_epoch:
        raise ValueError(f"epoch position {position} must be below steps_per_epoch {per_epoch}")
    return position, check_noise_multiplier(raw["noise_multiplier"]), per_epoch
