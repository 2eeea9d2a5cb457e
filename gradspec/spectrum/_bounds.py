"""Excess-risk bounds of DP-SGD from restricted-Lipschitz coefficients (Li et al. 2022).

Theorem 3.3, eq. (1) (excess empirical loss), for every k ∈ [d]:

    E[F(x̄) − min F] ≲ G_0·D·sqrt(k·log(1/δ))/(ε·n) + D·sqrt(Σ_{s=1..S} s²·2^s·G²_{2^(s−1)·k}),
    S = ⌊log₂(d/k)⌋ + 1.

Theorem 3.5 (excess population loss) adds G_0·D/sqrt(n). Both hold for
δ ∈ (0, 1/2] and ε ∈ (0, 10]. If G_k ≤ G_0·k^(−c) with c > 1/2 and
n ≥ sqrt(log(1/δ))/ε, minimising over k gives eq. (2):

    E[F(x̄) − min F] ≲ G_0·D·(sqrt(log(1/δ))/(ε·n))^(2c/(1+2c)),

at k* ≍ (ε·n/sqrt(log(1/δ)))^(2/(1+2c)), with no dependence on d. Beside it,
the dimension-dependent rate of DP-SGD for G-Lipschitz losses on a domain of
diameter D (Bassily et al. 2014, quoted in Li et al. §2.3) is
G_0·D·sqrt(d·log(1/δ))/(ε·n) — which is eq. (1) at k = d, where the second
term vanishes (G_d = 0).

All bounds hold up to universal constants ("≲"); we evaluate them with the
constants set to 1, so compare them with each other, not with a loss value.
The dyadic index 2^(s−1)·k comes from the proof (§3.3): the subspaces U_s
double in dimension, so the logarithm in S is base 2.

G_k is only measured up to K ≤ r. For 2^(s−1)·k between measured ranks we use
the value at the largest measured rank below it (a valid upper bound since G_k
does not increase). Beyond K the data say nothing; ``tail`` picks the rule:
``"hold"`` keeps G_K (the conservative, dimension-dependent choice),
``"fit"`` extrapolates a power-law fit (never above G_K), ``"zero"`` sets 0
(treats the span of the stored gradients as exact — optimistic).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from gradspec.spectrum._fit import PowerLawFit


class TailRule(StrEnum):
    """How G_k is continued beyond the largest measured rank."""

    HOLD = "hold"  # G_k = G_K for k > K (conservative)
    FIT = "fit"  # min(G_K, a·k^(−c)) from a power-law fit
    ZERO = "zero"  # G_k = 0 for k > K (optimistic)


def _check_privacy(n: float, epsilon: float, delta: float, diameter: float) -> dict[str, bool]:
    for name, value in (("n", n), ("epsilon", epsilon), ("delta", delta), ("diameter D", diameter)):
        if isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(
                f"{name} must be a finite number, got {value!r}: the bounds need a finite "
                "privacy budget, training-set size and diameter"
            )
    if n <= 0:
        raise ValueError(f"n (the number of training examples) must be > 0, got {n}")
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if diameter <= 0:
        raise ValueError(f"diameter D must be > 0, got {diameter}")
    return {
        "delta_in_(0,1/2]": bool(delta <= 0.5),
        "epsilon_in_(0,10]": bool(epsilon <= 10),
        "n_ge_sqrt(log(1/delta))/epsilon": bool(n >= math.sqrt(math.log(1 / delta)) / epsilon),
    }


def privacy_term(
    k: np.ndarray | float, *, G0: float, diameter: float, n: float, epsilon: float, delta: float
) -> np.ndarray:
    """The first term of Theorem 3.3, eq. (1): ``G_0·D·sqrt(k·log(1/δ))/(ε·n)``."""
    k = np.asarray(k, dtype=np.float64)
    return G0 * diameter * np.sqrt(k * math.log(1 / delta)) / (epsilon * n)


def dimension_dependent_bound(
    *,
    dim: int,
    G0: float,
    diameter: float,
    n: float,
    epsilon: float,
    delta: float,
    population: bool = False,
) -> float:
    """DP-SGD's dimension-dependent rate ``G_0·D·sqrt(d·log(1/δ))/(ε·n)`` (Li et al. §2.3, [BST14]).

    With ``population=True`` adds the statistical term ``G_0·D/sqrt(n)`` (Theorem 3.5).
    """
    _check_privacy(n, epsilon, delta, diameter)
    out = float(privacy_term(dim, G0=G0, diameter=diameter, n=n, epsilon=epsilon, delta=delta))
    return out + (G0 * diameter / math.sqrt(n) if population else 0.0)


def dimension_free_rate(
    *,
    c: float,
    G0: float,
    diameter: float,
    n: float,
    epsilon: float,
    delta: float,
    population: bool = False,
) -> float:
    """The rate of eq. (2): ``G_0·D·(sqrt(log(1/δ))/(ε·n))^(2c/(1+2c))`` (+ ``G_0·D/sqrt(n)``).

    Valid (Theorem 3.3) when c > 1/2 and n ≥ sqrt(log(1/δ))/ε; the formula is
    returned for any c > 0 and the caller reports whether those hold.
    """
    _check_privacy(n, epsilon, delta, diameter)
    if c <= 0:
        raise ValueError(f"the decay exponent c must be > 0, got {c}")
    a = math.sqrt(math.log(1 / delta)) / (epsilon * n)
    out = G0 * diameter * a ** (2 * c / (1 + 2 * c))
    return out + (G0 * diameter / math.sqrt(n) if population else 0.0)


def lipschitz_lookup(
    ks: Sequence[int] | np.ndarray,
    G: Sequence[float] | np.ndarray,
    j: np.ndarray,
    *,
    dim: int,
    tail: TailRule | str = TailRule.HOLD,
    tail_fit: PowerLawFit | None = None,
) -> np.ndarray:
    """G_j at arbitrary ranks j from values measured at ranks ``ks`` (see the module note).

    ``j ≥ dim`` gives 0 (G_d = 0, Definition 3.1); measured ranges use the value at
    the largest measured rank ``≤ j``; beyond the largest measured rank ``tail`` rules.
    """
    from gradspec._enums import parse_choice

    rule = parse_choice(TailRule, tail, "tail rule")
    ks = np.asarray(ks, dtype=np.int64)
    G = np.asarray(G, dtype=np.float64)
    order = np.argsort(ks)
    ks, G = ks[order], G[order]
    if ks.size == 0 or ks[0] != 0:
        raise ValueError("the measured ranks must include k = 0 (G_0)")
    j = np.asarray(j, dtype=np.int64)
    idx = np.searchsorted(ks, j, side="right") - 1
    out = G[np.clip(idx, 0, ks.size - 1)]
    beyond = j > ks[-1]
    if np.any(beyond):
        if rule is TailRule.ZERO:
            out = np.where(beyond, 0.0, out)
        elif rule is TailRule.FIT:
            if tail_fit is None:
                raise ValueError("tail='fit' needs tail_fit (a power-law fit of G_k)")
            ext = np.minimum(G[-1], tail_fit.predict(np.maximum(j, 1)))
            out = np.where(beyond, ext, out)
    return np.where(j >= dim, 0.0, out)


@dataclass
class BoundReport:
    """Theorem 3.3 / 3.5 evaluated on candidate ranks k (constants set to 1).

    Attributes:
        theorem: ``"3.3"`` (empirical) or ``"3.5"`` (population).
        k: candidate ranks.
        privacy: ``G_0·D·sqrt(k·log(1/δ))/(ε·n)`` per k.
        subspace: ``D·sqrt(Σ_s s²·2^s·G²_{2^(s−1)k})`` per k.
        statistical: ``G_0·D/sqrt(n)`` (Theorem 3.5 only, else 0).
        total: the sum per k.
        k_star: the candidate minimising ``total``; ``bound``: its value.
        dimension_dependent: ``G_0·D·sqrt(d·log(1/δ))/(ε·n)`` (+ statistical).
        rate: eq. (2) at the given c (None without c); ``rate_valid`` its hypotheses.
        hypotheses: which hypotheses of the theorem hold.
        settings: the inputs (n, ε, δ, D, d, G_0, tail, c).
    """

    theorem: str
    k: np.ndarray
    privacy: np.ndarray
    subspace: np.ndarray
    statistical: float
    total: np.ndarray
    k_star: int
    bound: float
    dimension_dependent: float
    rate: float | None
    rate_valid: bool
    hypotheses: dict[str, bool]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def improvement(self) -> float:
        """``dimension_dependent / bound``: how much smaller the restricted-Lipschitz bound is."""
        return self.dimension_dependent / self.bound if self.bound > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "theorem": self.theorem,
            "k": self.k.tolist(),
            "privacy_term": self.privacy.tolist(),
            "subspace_term": self.subspace.tolist(),
            "statistical_term": self.statistical,
            "total": self.total.tolist(),
            "k_star": self.k_star,
            "bound_at_k_star": self.bound,
            "dimension_dependent_bound": self.dimension_dependent,
            "improvement_over_dimension_dependent": self.improvement,
            "rate_eq2": self.rate,
            "rate_eq2_valid": self.rate_valid,
            "hypotheses": dict(self.hypotheses),
            "settings": dict(self.settings),
            "constants": "all universal constants set to 1 (the theorems hold up to constants)",
        }


def subspace_term(
    k: np.ndarray,
    *,
    ks: np.ndarray,
    G: np.ndarray,
    dim: int,
    diameter: float,
    tail: TailRule | str = TailRule.HOLD,
    tail_fit: PowerLawFit | None = None,
) -> np.ndarray:
    """The second term of Theorem 3.3, eq. (1): ``D·sqrt(Σ_{s=1..S} s²·2^s·G²_{2^(s−1)·k})``.

    ``S = ⌊log₂(d/k)⌋ + 1``, computed exactly in integers as the bit length of ``⌊d/k⌋``.
    """
    k = np.asarray(k, dtype=np.int64).reshape(-1)
    if np.any(k < 1) or np.any(k > dim):
        raise ValueError(f"k must lie in [1, d = {dim}]")
    S = np.array([int(dim // int(kk)).bit_length() for kk in k], dtype=np.int64)
    s = np.arange(1, int(S.max()) + 1, dtype=np.int64)
    j = (2 ** (s[None, :] - 1)) * k[:, None]  # (m, S_max), ≤ d where s ≤ S
    active = s[None, :] <= S[:, None]
    g = lipschitz_lookup(ks, G, np.where(active, j, dim), dim=dim, tail=tail, tail_fit=tail_fit)
    terms = np.where(active, (s**2 * 2.0**s)[None, :] * g**2, 0.0)
    return diameter * np.sqrt(terms.sum(axis=1))


def restricted_lipschitz_bound(
    *,
    ks: Sequence[int] | np.ndarray,
    G: Sequence[float] | np.ndarray,
    n: float,
    epsilon: float,
    delta: float,
    diameter: float,
    dim: int,
    population: bool = False,
    tail: TailRule | str = TailRule.HOLD,
    tail_fit: PowerLawFit | None = None,
    c: float | None = None,
    candidates: Sequence[int] | np.ndarray | None = None,
    lipschitz: float | None = None,
) -> BoundReport:
    """Evaluate Theorem 3.3, eq. (1) (or Theorem 3.5) for every candidate k and minimise.

    Args:
        ks: ranks where G was measured (must include 0).
        G: Ĝ_k at those ranks (e.g. :attr:`RestrictedLipschitz.max`).
        n: training-set size; epsilon, delta: the privacy budget; diameter: D ≥ ‖x⁽⁰⁾ − x*‖.
        dim: the dimension d (p, the number of trained parameters).
        population: Theorem 3.5 (adds ``G_0·D/sqrt(n)``) instead of Theorem 3.3.
        tail: how G is continued beyond the measured ranks (module note).
        tail_fit: the power-law fit used by ``tail="fit"``.
        c: decay exponent for the rate of eq. (2); default ``tail_fit.c`` when given. The
            rate is valid only where its hypothesis G_k ≤ G_0·k^(−c) holds: checked at the
            ranks given (``hypotheses["G_k<=G_0*k^-c_at_measured_ranks"]``), so pass the
            exponent every rank satisfies (:func:`gradspec.spectrum.envelope_exponent`), not
            a least-squares slope, whose own prefactor is not G_0.
        candidates: ranks k to evaluate; default the measured ranks ≥ 1, the powers of
            two up to d, and d itself.
        lipschitz: G_0 of the theorems where it is not Ĝ_0: the per-example gradient bound
            of Assumption 3.2, to which DP-SGD's noise is scaled (its proof adds G_0·ζ). For
            clipped DP-SGD that is the clip norm C; rows that are step averages have norms
            well below it, so their Ĝ_0 would understate the privacy term. Default: Ĝ_0
            (``G`` at k = 0), which must not exceed it.

    Returns:
        :class:`BoundReport`.
    """
    hyp = _check_privacy(n, epsilon, delta, diameter)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer):
        raise ValueError(f"dim must be an integer (the number of trained parameters), got {dim!r}")
    ks_in = np.asarray(ks)
    if ks_in.size and not np.all(np.asarray(ks_in, dtype=np.float64) == np.round(ks_in.astype(np.float64))):
        raise ValueError(f"ks must be integer ranks, got {ks_in.tolist()}")
    ks = ks_in.astype(np.int64)
    if ks.size and ks.min() < 0:
        raise ValueError(f"ks must be ranks >= 0, got {int(ks.min())}")
    G = np.asarray(G, dtype=np.float64)
    if ks.shape != G.shape:
        raise ValueError(f"ks and G need the same length, got {ks.size} and {G.size}")
    if not np.all(np.isfinite(G)) or np.any(G < 0):
        raise ValueError("G must hold finite values >= 0 (norms of projected gradients)")
    G0_measured = float(G[ks == 0][0]) if np.any(ks == 0) else math.nan
    if not np.isfinite(G0_measured):
        raise ValueError("G must include G_0 (k = 0)")
    G0 = G0_measured
    if lipschitz is not None:
        if isinstance(lipschitz, bool) or not (math.isfinite(lipschitz) and lipschitz > 0):
            raise ValueError(f"lipschitz (the per-example gradient bound G_0) must be finite and > 0, got {lipschitz!r}")
        if G0_measured > float(lipschitz) * (1 + 1e-6):
            raise ValueError(
                f"the rows' largest norm {G0_measured:.6g} exceeds the per-example bound G_0 = {lipschitz:g}: "
                "these rows are not bounded by it (another clip norm, or unclipped rows)"
            )
        G0 = float(lipschitz)
    if ks.max() > dim:
        raise ValueError(
            f"dim = {dim} is below the largest measured rank {int(ks.max())}; d is the number of "
            "trained parameters, at least every rank measured"
        )
    order = np.argsort(ks, kind="stable")
    rising = np.diff(G[order]) > 1e-9 * max(G0, float(G.max()))
    if np.any(rising):
        i = int(np.argmax(rising))
        raise ValueError(
            f"G rises from G_{int(ks[order][i])} = {G[order][i]:.4g} to G_{int(ks[order][i + 1])} = "
            f"{G[order][i + 1]:.4g}; restricted-Lipschitz coefficients do not increase with k "
            "(pass G and ks of one measurement, in matching order)"
        )
    if candidates is None:
        pw = [2**i for i in range(int(dim).bit_length()) if 2**i <= dim]
        cand = np.unique(np.concatenate([ks[(ks >= 1) & (ks <= dim)], pw, [dim]]).astype(np.int64))
    else:
        cand = np.unique(np.asarray(candidates, dtype=np.int64))
    priv = privacy_term(cand, G0=G0, diameter=diameter, n=n, epsilon=epsilon, delta=delta)
    sub = subspace_term(cand, ks=ks, G=G, dim=dim, diameter=diameter, tail=tail, tail_fit=tail_fit)
    stat = G0 * diameter / math.sqrt(n) if population else 0.0
    total = priv + sub + stat
    i = int(np.argmin(total))
    if c is None and tail_fit is not None:
        c = tail_fit.c
    rate = None
    if c is not None and c > 0:
        rate = dimension_free_rate(
            c=c, G0=G0, diameter=diameter, n=n, epsilon=epsilon, delta=delta, population=population
        )
    if c is not None and c > 0:
        # G_k ≤ G_0·k^(−c) at the ranks given (k ≥ 1; G_0 itself bounds k = 0)
        pos = (ks >= 1) & (ks <= dim)
        hyp["G_k<=G_0*k^-c_at_measured_ranks"] = bool(
            np.all(G[pos] <= G0 * ks[pos].astype(np.float64) ** (-c) * (1 + 1e-12)))
    rate_valid = bool(c is not None and c > 0.5 and hyp["n_ge_sqrt(log(1/delta))/epsilon"]
                      and hyp.get("G_k<=G_0*k^-c_at_measured_ranks", False))
    return BoundReport(
        theorem="3.5" if population else "3.3",
        k=cand,
        privacy=priv,
        subspace=sub,
        statistical=float(stat),
        total=total,
        k_star=int(cand[i]),
        bound=float(total[i]),
        dimension_dependent=dimension_dependent_bound(
            dim=dim,
            G0=G0,
            diameter=diameter,
            n=n,
            epsilon=epsilon,
            delta=delta,
            population=population,
        ),
        rate=rate,
        rate_valid=rate_valid,
        hypotheses=hyp,
        settings={
            "n": n,
            "epsilon": epsilon,
            "delta": delta,
            "diameter": diameter,
            "dim": int(dim),
            "G0": G0,
            "G0_measured": G0_measured,
            "G0_from": "lipschitz" if lipschitz is not None else "measured",
            "tail": str(tail),
            "c": c,
            "k_measured_max": int(ks.max()),
        },
    )
