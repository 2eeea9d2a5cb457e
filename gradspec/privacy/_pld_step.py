"""One Poisson-subsampled Gaussian step's PLD, as dp-accounting builds it, without its Python loop.

dp-accounting 0.6 builds a step's connect-the-dots PLD (``from_gaussian_mechanism``) from the
hockey-stick divergence δ(ε) at every loss point ε = iΔ of the discretisation,
``AdditiveNoisePrivacyLoss.get_delta_for_epsilon``. That evaluates the noise's CDFs on the
whole grid at once, but finds the point x where the privacy loss equals ε (the inverse
privacy loss) in a Python loop, one call per point: 10^4 to 10^5 points per neighbour, about
a second per step here, and a calibration of the noise multiplier builds 6 to 8 of them. This
module computes the same inverse on the whole grid with numpy, from the same closed forms in
the same order of operations (below), and hands everything else back to dp-accounting: the
bounds of the grid (``connect_dots_bounds``), the CDFs, and the connect-the-dots PMF
(``create_pmf_pessimistic_connect_dots_fixed_gap``). So the result is dp-accounting's own
distribution; the tests hold it bit for bit equal to ``from_gaussian_mechanism``'s.

Every build also spot-checks itself against the library: δ at a few grid points (both ends,
the points beside the edge log(1 - q), a spread of others) from dp-accounting's own loop must
equal the vectorised ones exactly. A dp-accounting whose formulas differ (another version)
fails the check, and the library's own build is used from then on in the process, with one
warning: never a number the library would not give.

The closed forms (sensitivity s = 1, noise multiplier σ, sampling rate q; the privacy loss is
non-increasing in x, and the inverse at ε is the largest x whose loss is at least ε):

- without subsampling, the remove neighbour: x = -s/2 - ε·σ²/s; the add neighbour: s + that;
- remove, q < 1: ε is first mapped to log(1 + (e^ε - 1)/q) (for ε > log(1 - q); at log(1 - q)
  itself x = +∞); add, q < 1: to -log(1 + (e^-ε - 1)/q) (for ε < -log(1 - q); at it, x = -∞);
  ``log(a·e^b + c)`` is evaluated as dp-accounting's ``common.log_a_times_exp_b_plus_c`` does.
"""

from __future__ import annotations

import logging
import math

import numpy as np

logger = logging.getLogger(__name__)

#: Grid points of each neighbour whose δ the library computes itself, to check the vectorised ones.
SPOT_CHECKS = 12
#: Set when a spot check failed in this process: every later step is the library's own build.
_library_only = False
_REL_TOL = 1e-9  # math.isclose's default, which dp-accounting's edge tests use


class _Unsupported(ValueError):
    """A grid point where dp-accounting itself raises or takes another branch: build with the library."""


def _isclose(x: np.ndarray, t: float) -> np.ndarray:
    """``math.isclose(x_i, t)`` for every element (relative tolerance 1e-9, no absolute one)."""
    return (x == t) | (np.abs(x - t) <= _REL_TOL * np.maximum(np.abs(x), abs(t)))


def _log_a_exp_b_plus_c(a: float, b: np.ndarray, c: float) -> np.ndarray:
    """``common.log_a_times_exp_b_plus_c(a, b_i, c)`` elementwise, for a > 0 > c (q < 1)."""
    out = np.empty_like(b)
    zero = b == 0
    out[zero] = np.log(a + c)
    d = b[~zero] + np.log(a)
    log_neg_c = np.log(-c)
    if np.any(log_neg_c >= d):  # dp-accounting raises here (a·e^b + c <= 0)
        raise _Unsupported("log(a exp(b) + c) of a non-positive argument")
    out[~zero] = d + np.log1p(-np.exp(log_neg_c - d))  # common._log_sub(d, log(-c))
    return out


def _without_subsampling_remove(loss: np.ndarray, sigma: float, s: float) -> np.ndarray:
    return -0.5 * s - loss * (sigma**2) / s


def inverse_privacy_loss(sigma: float, q: float, adjacency: str, eps: np.ndarray, s: float = 1.0) -> np.ndarray:
    """x(ε) of the Gaussian mechanism's ``remove`` or ``add`` neighbour at sampling rate q, for
    the ε that ``get_delta_for_epsilon`` inverts (remove: ε > log1p(-q); add: ε < -log1p(-q))."""
    if adjacency not in ("remove", "add"):
        raise ValueError(f"adjacency must be 'remove' or 'add', got {adjacency!r}")
    if q == 1.0:
        x = _without_subsampling_remove(eps, sigma, s)
        return x if adjacency == "remove" else s + x
    if adjacency == "remove":
        edge = _isclose(eps, math.log(1 - q))
        if np.any(~edge & (eps <= math.log(1 - q))):
            raise _Unsupported("a loss below log(1 - q)")
        x = np.full_like(eps, math.inf)  # inverse without subsampling at -inf
        x[~edge] = _without_subsampling_remove(_log_a_exp_b_plus_c(1 / q, eps[~edge], 1 - 1 / q), sigma, s)
        return x
    edge = _isclose(eps, -math.log(1 - q))
    if np.any(~edge & (eps > -math.log(1 - q))):
        raise _Unsupported("a loss above -log(1 - q)")
    x = np.full_like(eps, -math.inf)  # s + the inverse without subsampling at +inf
    loss = -_log_a_exp_b_plus_c(1 / q, -eps[~edge], 1 - 1 / q)
    x[~edge] = s + _without_subsampling_remove(loss, sigma, s)
    return x


def hockey_stick(privacy_loss, sigma: float, adjacency: str, eps: np.ndarray) -> np.ndarray:
    """``privacy_loss.get_delta_for_epsilon(eps)`` (a dp-accounting ``GaussianPrivacyLoss`` of
    noise multiplier ``sigma``), with the inverse privacy loss vectorised."""
    q = float(privacy_loss.sampling_prob)
    deltas = np.zeros_like(eps, dtype=float)
    if q == 1.0:
        inside = np.ones(eps.shape, dtype=bool)
    elif adjacency == "add":
        inside = eps < -math.log1p(-q)
    else:
        inside = eps > math.log1p(-q)
        deltas[~inside] = -np.expm1(eps[~inside])
    x = inverse_privacy_loss(sigma, q, adjacency, eps[inside], float(privacy_loss.sensitivity))
    deltas[inside] = privacy_loss.mu_upper_cdf(x) - np.exp(eps[inside] + privacy_loss.mu_lower_log_cdf(x))
    return np.clip(deltas, 0, 1)


def _spot_indices(eps: np.ndarray, q: float) -> np.ndarray:
    """Grid points to check against the library: both ends, a spread, and those beside the edge."""
    n = len(eps)
    picks = set(np.linspace(0, n - 1, SPOT_CHECKS - 4).round().astype(int).tolist())
    if q < 1.0:
        for t in (math.log1p(-q), -math.log1p(-q)):
            i = int(np.searchsorted(eps, t))
            picks.update(j for j in (i - 1, i) if 0 <= j < n)
    return np.array(sorted(picks))


def step_grid(sigma: float, q: float, adjacency: str, discretisation: float):
    """(dp-accounting's ``GaussianPrivacyLoss`` of the ``remove`` or ``add`` neighbour, and the
    range [lower, upper] of the loss indices its connect-the-dots PLD has), as
    ``_create_pld_pmf_from_monotone_privacy_loss`` rounds its bounds: the one rule for the size
    known before a step is built (`_pld._library_size`) and the grid it is built on."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    kind = plm.AdjacencyType.REMOVE if adjacency == "remove" else plm.AdjacencyType.ADD
    loss = plm.GaussianPrivacyLoss(sigma, sampling_prob=q, adjacency_type=kind)
    bounds = loss.connect_dots_bounds()
    return loss, math.floor(bounds.epsilon_lower / discretisation), math.ceil(bounds.epsilon_upper / discretisation)


def gaussian_step(sigma: float, q: float, discretisation: float):
    """dp-accounting's ``from_gaussian_mechanism(sigma, value_discretization_interval=
    discretisation, sampling_prob=q)`` (add-or-remove neighbours, connect the dots,
    pessimistic), built with the vectorised inverse; the library's own build where the spot
    check fails or a grid point needs a branch this module does not take."""
    import dp_accounting as dpa
    from dp_accounting.pld import pld_pmf

    def library():
        return dpa.pld.privacy_loss_distribution.from_gaussian_mechanism(
            standard_deviation=sigma, value_discretization_interval=discretisation, sampling_prob=q,
            neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
        )

    global _library_only
    if _library_only:
        return library()
    pmfs = {}
    for adjacency in ("remove", "add") if q < 1.0 else ("remove",):  # q = 1: one symmetric PLD
        loss, lower, upper = step_grid(sigma, q, adjacency, discretisation)
        eps = np.arange(lower, upper + 1) * discretisation
        try:
            deltas = hockey_stick(loss, sigma, adjacency, eps)
        except _Unsupported as exc:
            logger.debug("PLD step at sigma %g, q %g: %s; dp-accounting builds it", sigma, q, exc)
            return library()
        spots = _spot_indices(eps, q)
        theirs = np.asarray(loss.get_delta_for_epsilon(eps[spots]), dtype=float)
        if not np.array_equal(theirs, deltas[spots]):
            worst = float(np.max(np.abs(theirs - deltas[spots])))
            logger.warning(
                "this dp-accounting's hockey-stick divergence differs from gradspec's vectorised one "
                "(by up to %.3g at sigma %g, q %g); using the library's own, slower build from now on",
                worst, sigma, q,
            )
            _library_only = True
            return library()
        pmfs[adjacency] = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
            discretisation, lower, upper, deltas
        )
    cls = dpa.pld.privacy_loss_distribution.PrivacyLossDistribution
    return cls(pmfs["remove"]) if q == 1.0 else cls(pmfs["remove"], pmfs["add"])
