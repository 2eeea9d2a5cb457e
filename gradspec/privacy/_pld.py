"""PLD accounting of Poisson-subsampled Gaussian steps, in bounded memory and with cached steps.

dp-accounting builds the privacy loss distribution (PLD) of one step (its connect-the-dots
discretisation of the subsampled Gaussian, Doroshenko et al. 2022); the composition and
the reading of epsilon are a numpy port of dp-accounting 0.6's ``DensePLDPmf``:
``self_compose`` (one FFT power, its range cut by the Chernoff bound of
``common.compute_self_convolve_bounds``), ``compose`` (one FFT convolution, tails of mass
<= 1e-15 truncated pessimistically) and ``_get_epsilon_for_delta`` (vectorised: its
Python loop over every loss point took most of a query). The tests check the results
against dp-accounting's ``PLDAccountant``.

Why this module exists:

- **Bounded memory.** The composed distribution of T steps has about ``c * sqrt(T)`` to
  ``c * T`` points at the 1e-4 loss discretisation; 10^9 steps need terabytes. Each size is
  known before anything is allocated (the single step's range from dp-accounting's
  ``connect_dots_bounds``, the composition's from the Chernoff bound), and a distribution of
  more than `MAX_PLD_POINTS` points is refused with a `ValueError` that names the largest
  step count that fits and the RDP method, which answers any step count.
- **Cheap repeated queries.** A training loop asks for epsilon every few steps. The single
  step's PLD (dp-accounting's, built in 0.04-0.3 s by `_pld_step`; 0.3-2 s by the library's
  own Python loop) and the moments its
  Chernoff bound needs are built once per (q, noise multiplier) and cached, so a query
  costs one FFT power of the composed size and a vectorised read: the same computation a
  fresh accountant does for the same steps, so the numbers are identical whatever was
  asked before. (Composing only the new steps onto a kept PLD would not be cheaper: one
  FFT convolution of the kept distribution costs what one FFT power does, and reading
  epsilon is linear in the distribution's size either way.)
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np
from scipy import fft, signal

from gradspec.privacy._pld_step import gaussian_step, step_grid

# dp-accounting's defaults (PLDAccountant, PrivacyLossDistribution.compose / self_compose).
DISCRETISATION = 1e-4
TAIL_MASS = 1e-15
# The most points one loss distribution (a single step's, or a composition's) may have:
# 2^24 points are 128 MiB per array; a composition peaks at about 40 bytes a point (about
# 0.7 GB) and takes seconds. Building a single step of 2^24 points in dp-accounting takes
# a minute and about 3 GB (its Python dicts), which is why the limit is not higher.
MAX_PLD_POINTS = 2**24


class PldTooLarge(ValueError):
    """A PLD distribution would exceed :data:`MAX_PLD_POINTS` points (refused before it is
    allocated); a calibration catches it to say so without the noise multiplier it tried."""
_BYTES_PER_POINT = 40  # peak memory of a self-composition, per point (reported in the refusal)
_CACHE_POINTS = 2**24  # single steps kept (the most recent one always)
_SPECTRUM_POINTS = 2**22  # a transform is kept for the next query only up to this size (32 MiB)


class _Pmf(NamedTuple):
    """A dense loss distribution: loss ``(lower + i) * DISCRETISATION`` has mass ``probs[i]``."""

    lower: int
    probs: np.ndarray
    infinity_mass: float


class _Pld(NamedTuple):
    """The distributions of the remove and the add neighbour (the same one if symmetric)."""

    remove: _Pmf
    add: _Pmf

    @property
    def size(self) -> int:
        return max(len(self.remove.probs), len(self.add.probs))


# ---------------------------------------------------------------------------- building blocks
def _from_library(pld) -> _Pld:
    """The dense arrays of a dp-accounting ``PrivacyLossDistribution``."""

    def dense(pmf) -> _Pmf:
        pmf = pmf.to_dense_pmf()
        try:
            lower, probs, inf = pmf._lower_loss, pmf._probs, pmf._infinity_mass  # noqa: SLF001
            disc = pmf._discretization  # noqa: SLF001
        except AttributeError as exc:  # pragma: no cover - a dp-accounting we were not written for
            raise RuntimeError(f"this dp-accounting's PLD has no {exc.name}; gradspec's PLD "
                               "port was written against dp-accounting 0.6") from None
        if disc != DISCRETISATION:  # pragma: no cover
            raise RuntimeError(f"dp-accounting discretised at {disc}, expected {DISCRETISATION}")
        probs = np.array(probs, dtype=np.float64)
        probs.flags.writeable = False
        return _Pmf(int(lower), probs, float(inf))

    remove = dense(pld._pmf_remove)  # noqa: SLF001
    add = remove if pld._symmetric else dense(pld._pmf_add)  # noqa: SLF001
    return _Pld(remove, add)


def _library_size(noise_multiplier: float, sample_rate: float) -> int:
    """Points of dp-accounting's discretisation of one (subsampled) Gaussian step, before building it."""
    size = 0
    for adjacency in ("remove", "add"):
        _, lower, upper = step_grid(noise_multiplier, sample_rate, adjacency, DISCRETISATION)
        size = max(size, upper - lower + 1)
    return size


class _Step:
    """One mechanism's PLD, and the log moment generating functions its Chernoff bound needs."""

    def __init__(self, pld: _Pld) -> None:
        self.pld = pld
        self._mgf: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._spectrum: dict[int, tuple[int, np.ndarray]] = {}  # log of each pmf's last rfft

    def _log_mgfs(self, pmf: _Pmf) -> tuple[np.ndarray, np.ndarray]:
        """dp-accounting's orders (+-1..20 over the length) and log E[exp(order * index)] at each."""
        key = id(pmf.probs)
        if key not in self._mgf:
            n = len(pmf.probs)
            orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
            index = np.arange(n, dtype=np.float64)
            live = np.flatnonzero(pmf.probs > 0)
            values = np.full(len(orders), -np.inf)  # (no mass at all: every moment is -inf)
            for j, order in enumerate(orders.tolist() if live.size else ()):
                # log sum p_i exp(order * i), shifted by its largest exponent over the points with
                # mass (what scipy's logsumexp does, 3-4x faster without its generality; the
                # values agree to ~1e-14)
                top = order * float(live[-1] if order > 0 else live[0])
                values[j] = math.log(float(np.dot(pmf.probs, np.exp(index * order - top)))) + top
            self._mgf[key] = (orders, values)
        return self._mgf[key]

    def _range(self, pmf: _Pmf, count: int) -> tuple[int, int]:
        """``common.compute_self_convolve_bounds``: indices outside hold mass <= TAIL_MASS."""
        upper, lower = (len(pmf.probs) - 1) * count, 0
        orders, values = self._log_mgfs(pmf)
        log_tail = math.log(2 / TAIL_MASS)
        for order, value in zip(orders.tolist(), values.tolist(), strict=True):
            bound = (count * value + log_tail) / order
            if not math.isfinite(bound):
                continue
            if order > 0:
                upper = min(upper, math.ceil(bound))
            else:
                lower = max(lower, math.floor(bound))
        return lower, upper

    def composed_size(self, count: int) -> int:
        """Points of the ``count``-fold self-composition (the larger of remove and add)."""
        sizes = []
        for pmf in (self.pld.remove, self.pld.add):
            lower, upper = self._range(pmf, count)
            sizes.append(max(upper - lower + 1, len(pmf.probs)))
        return max(sizes)

    def max_count(self, points: int) -> int:
        """The largest count whose self-composition has at most ``points`` points (0 if none)."""
        if self.composed_size(1) > points:
            return 0
        lo, hi = 1, 2
        while self.composed_size(hi) <= points:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.composed_size(mid) <= points else (lo, mid)
        return lo

    def self_compose(self, count: int) -> _Pld:
        """``DensePLDPmf.self_compose(count, TAIL_MASS)`` for both neighbours."""
        remove = self._self_compose(self.pld.remove, count)
        add = remove if self.pld.add is self.pld.remove else self._self_compose(self.pld.add, count)
        return _Pld(remove, add)

    def _self_compose(self, pmf: _Pmf, count: int) -> _Pmf:
        if count == 1:
            return pmf
        lower, upper = self._range(pmf, count)
        length = upper - lower + 1
        size = fft.next_fast_len(max(length, len(pmf.probs)), real=True)
        key = id(pmf.probs)
        cached = self._spectrum.get(key)
        if cached is None or cached[0] != size:
            with np.errstate(divide="ignore"):
                cached = (size, np.log(fft.rfft(pmf.probs, size)))
            if size <= _SPECTRUM_POINTS:
                self._spectrum[key] = cached
            else:
                self._spectrum.pop(key, None)
        # The count-th power of the transform (exp(count log z), as numpy's own power computes
        # it, with the log kept for the next count). The convolution is cyclic modulo `size`:
        # the window [lower, upper] is read out.
        out = fft.irfft(np.exp(count * cached[1]), size)
        probs = np.roll(out, -lower)[:length]
        infinity = TAIL_MASS - math.expm1(count * math.log1p(-pmf.infinity_mass))
        return _Pmf(pmf.lower * count + lower, probs, infinity)


def _compose_pmf(a: _Pmf, b: _Pmf) -> _Pmf:
    """``DensePLDPmf.compose(b, TAIL_MASS)`` (pessimistic): FFT convolution, tails truncated."""
    probs = signal.fftconvolve(a.probs, b.probs)
    infinity = a.infinity_mass + b.infinity_mass - a.infinity_mass * b.infinity_mass
    half = TAIL_MASS / 2

    def prefix(arr: np.ndarray) -> int:  # the longest prefix whose running sum stays <= half
        above = np.cumsum(arr) > half
        return int(np.argmax(above)) if above.any() else len(arr)

    left = prefix(probs)
    right = max(len(probs) - prefix(probs[::-1]), left + 1)
    left_mass, right_mass = float(np.sum(probs[:left])), float(np.sum(probs[right:]))
    kept = probs[left:right].copy()
    kept[0] += left_mass  # moved to a larger loss: an upper estimate
    return _Pmf(a.lower + b.lower + left, kept, infinity + right_mass)


def _compose(a: _Pld, b: _Pld) -> _Pld:
    remove = _compose_pmf(a.remove, b.remove)
    if a.add is a.remove and b.add is b.remove:
        return _Pld(remove, remove)
    return _Pld(remove, _compose_pmf(a.add, b.add))


_CHUNK = 1 << 16


def _epsilon_for_delta(pmf: _Pmf, delta: float) -> float:
    """``pld_pmf._get_epsilon_for_delta``, vectorised in chunks from the largest loss down.

    Walking the losses L_k in decreasing order with U (mass above, from the infinity mass)
    and W (the sum of exp(-L) times the mass above): stop at the first k where
    log((U - delta) / W) >= L_k and answer that log (0 if U <= W + delta).
    """
    if pmf.infinity_mass > delta:
        return math.inf
    probs = pmf.probs[::-1]
    top = pmf.lower + len(probs) - 1
    upper, lower = pmf.infinity_mass, 0.0
    for start in range(0, len(probs), _CHUNK):
        p = probs[start:start + _CHUNK]
        losses = (top - start - np.arange(len(p))) * DISCRETISATION
        with np.errstate(over="ignore"):
            weighted = np.exp(-losses) * p
        # U, W before each point (cumsum is sequential, as the reference loop's additions).
        u = np.cumsum(np.concatenate(([upper], p)))
        w = np.cumsum(np.concatenate(([lower], weighted)))
        with np.errstate(divide="ignore", invalid="ignore"):
            level = np.log((u[:-1] - delta) / w[:-1])
        stop = (u[:-1] > delta) & (w[:-1] > 0) & (level >= losses)
        # after adding point k: all of delta's mass sits at losses whose exp(-L) underflows
        zero = (u[1:] >= delta) & (w[1:] == 0)
        k_stop = int(np.argmax(stop)) if stop.any() else len(p)
        k_zero = int(np.argmax(zero)) if zero.any() else len(p)
        if k_zero < k_stop:
            return max(0.0, float(losses[k_zero]))
        if k_stop < len(p):
            upper, lower = float(u[k_stop]), float(w[k_stop])
            break
        upper, lower = float(u[-1]), float(w[-1])
    if upper <= lower + delta:
        return 0.0
    return math.log((upper - delta) / lower)


# ---------------------------------------------------------------------------- the cache
_cache: OrderedDict[tuple[str, float, float], _Step] = OrderedDict()
_cache_lock = threading.Lock()


def _step(noise_multiplier: float, sample_rate: float) -> _Step:
    """The cached single step of a Poisson-subsampled (q < 1) or plain (q = 1) Gaussian mechanism."""
    key = ("gaussian", noise_multiplier, sample_rate)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    size = _library_size(noise_multiplier, sample_rate)
    if size > MAX_PLD_POINTS:
        what = "one step" if sample_rate < 1 else "the Gaussian mechanisms"
        raise ValueError(
            f"PLD accounting at noise multiplier {noise_multiplier:.4g} (sample rate {sample_rate:.4g}) "
            f"needs {size:,} loss points for {what}, more than the {MAX_PLD_POINTS:,} it allows: "
            "use method 'rdp' (--method rdp), which answers any noise multiplier and number of steps"
        )
    # dp-accounting's from_gaussian_mechanism, bit for bit, without its Python loop (_pld_step)
    step = _Step(_from_library(gaussian_step(noise_multiplier, sample_rate, DISCRETISATION)))
    with _cache_lock:
        _cache[key] = step
        while len(_cache) > 1 and sum(s.pld.size for s in _cache.values()) > _CACHE_POINTS:
            _cache.popitem(last=False)
    return step


def clear_cache() -> None:
    """Forget the cached single steps (tests; a long-lived process that accounted a huge run)."""
    with _cache_lock:
        _cache.clear()


# ---------------------------------------------------------------------------- epsilon
def pld_epsilon(
    poisson: list[tuple[float, float, int]], gaussian_sigma: float | None, delta: float
) -> float:
    """epsilon(delta) of Poisson-subsampled Gaussian steps and one Gaussian mechanism, by PLD.

    Args:
        poisson: ``(q, noise multiplier, count)`` of each kind of step (q < 1, count >= 1),
            composed in this order.
        gaussian_sigma: the noise multiplier of one further (non-subsampled) Gaussian
            mechanism, or None.
        delta: in (0, 1).

    Raises:
        ValueError: before allocating it, if a distribution would exceed `MAX_PLD_POINTS`
            points; the message names the step count that fits and method ``rdp``.
    """
    steps = [(_step(sigma, q), count) for q, sigma, count in poisson]
    gaussian = _step(gaussian_sigma, 1.0) if gaussian_sigma is not None else None
    sizes = [step.composed_size(count) for step, count in steps]
    total = sum(sizes) - len(sizes) + 1 + (gaussian.pld.size - 1 if gaussian is not None else 0)
    if total > MAX_PLD_POINTS:
        fits = ""
        if len(steps) == 1 and gaussian is None:
            (q, sigma, count), (step, _) = poisson[0], steps[0]
            fits = f"; at q = {q:.4g} and noise multiplier {sigma:.4g} it takes at most {step.max_count(MAX_PLD_POINTS):,} steps"
        count = sum(c for _, _, c in poisson)
        raise PldTooLarge(
            f"PLD accounting of {count:,} steps needs {total:.3g} loss points (about "
            f"{total * _BYTES_PER_POINT / 2**30:.3g} GiB), more than the {MAX_PLD_POINTS:,} it allows{fits}: "
            "use method 'rdp' (--method rdp), which answers any number of steps"
        )
    result: _Pld | None = None
    for step, count in steps:
        part = step.self_compose(count)
        result = part if result is None else _compose(result, part)
    if gaussian is not None:
        result = gaussian.pld if result is None else _compose(result, gaussian.pld)
    assert result is not None
    return max(_epsilon_for_delta(result.remove, delta), _epsilon_for_delta(result.add, delta))
