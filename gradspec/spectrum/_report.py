"""Assemble every number of a decay analysis: the library entry point behind `gradspec decay`.

:func:`analyze_spectrum` takes arrays and block iterables (never paths): the
singular values, the basis V, and optionally the gradient rows that G_k,
explained variance and per-step errors are measured on (the rows the spectrum
came from, and held-out rows). :meth:`DecayAnalysis.to_dict` is the content of
``report.json``; the caller adds where the inputs came from (``sources``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gradspec._json import report_jsonable as _jsonable
from gradspec.spectrum._bounds import BoundReport, TailRule, restricted_lipschitz_bound
from gradspec.spectrum._density import SpectralDensity, spectral_density
from gradspec.spectrum._fit import PowerLawFit, fit_spectrum
from gradspec.spectrum._lipschitz import (
    REL_FLOOR,
    LipschitzDecay,
    RestrictedLipschitz,
    envelope_exponent,
    lipschitz_decay,
    restricted_lipschitz,
)
from gradspec.spectrum._projection import RowProjections, project_rows, rank_grid
from gradspec.spectrum._variance import (
    ExplainedVariance,
    StepError,
    explained_variance,
    explained_variance_rows,
    reconstruction_error_by_step,
)

logger = logging.getLogger(__name__)

REPORT_FORMAT = "gradspec.decay-report/1"


@dataclass(frozen=True)
class DecayConfig:
    """Settings of a decay analysis (saved in ``report.json``).

    Attributes:
        k_max: largest rank for G_k and explained variance; default all stored vectors.
        every_rank: evaluate G_k at every rank up to ``k_max`` (default 0, 1, 2, 4, …).
        fit_range: inclusive rank range of the spectrum fits; default ``(1, min(K, 1000))``.
        ci: ``"analytic"`` or ``"bootstrap"`` confidence intervals.
        level: confidence level.
        n_boot: bootstrap resamples.
        seed: bootstrap seed.
        quantiles: row quantiles of ‖(I − P_k)g‖ reported beside the maximum.
        density_space: ``"log10"`` or ``"linear"``.
        bandwidth: ``"scott"``, ``"silverman"`` or an absolute bandwidth.
        n, epsilon, delta, diameter: the setting of Theorems 3.3/3.5; bounds are
            computed only when all four are given.
        dim: the dimension d of the bound; default p (the basis rows).
        tail: how G_k is continued beyond ``k_max`` in the bound (``hold``/``fit``/``zero``).
    """

    k_max: int | None = None
    every_rank: bool = False
    fit_range: tuple[int, int] | None = None
    ci: str = "analytic"
    level: float = 0.95
    n_boot: int = 1000
    seed: int = 0
    quantiles: tuple[float, ...] = (0.5, 0.95)
    density_space: str = "log10"
    bandwidth: str | float = "scott"
    n: int | None = None
    epsilon: float | None = None
    delta: float | None = None
    diameter: float | None = None
    dim: int | None = None
    tail: str = TailRule.HOLD.value

    @property
    def has_bound_inputs(self) -> bool:
        return None not in (self.n, self.epsilon, self.delta, self.diameter)

    def ranks(self, k_stored: int) -> np.ndarray:
        """The ranks G_k is measured at for a basis of ``k_stored`` directions: 0, 1, 2, 4, …,
        ``k_max`` (default ``k_stored``), or every rank with ``every_rank``.

        Raises:
            ValueError: ``k_max`` outside ``[1, k_stored]``.
        """
        k_max = int(k_stored) if self.k_max is None else int(self.k_max)
        if not 1 <= k_max <= k_stored:
            raise ValueError(
                f"k_max must lie in [1, {k_stored}] (the stored singular vectors), got {k_max}"
            )
        return rank_grid(k_max, every=self.every_rank)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fit_range"] = list(self.fit_range) if self.fit_range else None
        d["quantiles"] = list(self.quantiles)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecayConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown decay settings {sorted(unknown)}; valid: {sorted(known)}")
        kw = dict(d)
        if kw.get("fit_range") is not None:
            kw["fit_range"] = tuple(kw["fit_range"])
        if "quantiles" in kw:
            kw["quantiles"] = tuple(kw["quantiles"])
        return cls(**kw)


@dataclass
class RowAnalysis:
    """Everything measured on one set of gradient rows."""

    G: RestrictedLipschitz
    decay: LipschitzDecay | None
    explained: ExplainedVariance
    by_step: StepError | None
    bounds: dict[str, BoundReport] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "G_k": self.G.to_dict(),
            "G_k_decay": self.decay.to_dict() if self.decay else None,
            "explained_variance": self.explained.to_dict(),
            "reconstruction_error_by_step": self.by_step.to_dict() if self.by_step else None,
            "bounds": {k: v.to_dict() for k, v in self.bounds.items()},
        }


@dataclass
class DecayAnalysis:
    """The numbers of ``report.json``; see :func:`analyze_spectrum`."""

    sigma: np.ndarray
    config: DecayConfig
    fit_singular: PowerLawFit
    fit_eigen: PowerLawFit
    density: SpectralDensity
    explained_spectrum: np.ndarray
    total_energy: float | None
    rows: dict[str, RowAnalysis] = field(default_factory=dict)
    sources: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The headline numbers."""
        out: dict[str, Any] = {
            "spectrum_fit": self.fit_singular.describe(),
            "eigenvalue_fit": self.fit_eigen.describe(),
        }
        for name, ra in self.rows.items():
            # In-sample G_k reach 0 at the rank of H: what is built on them is optimistic.
            caveat = " [in-sample G_k: optimistic]" if name == "collected" else ""
            if ra.decay:
                out[f"G_k_{name}"] = ra.decay.verdict() + caveat
            for tag, b in ra.bounds.items():
                unmet = [h for h, ok in b.hypotheses.items() if not ok]
                out[f"bound_{name}_{tag}"] = (
                    f"Theorem {b.theorem}: min over k at k* = {b.k_star}: {b.bound:.4g} vs "
                    f"dimension-dependent {b.dimension_dependent:.4g} (x{b.improvement:.3g})"
                    + caveat
                    + (f" [hypotheses not met: {', '.join(unmet)}]" if unmet else "")
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        k = np.arange(1, self.sigma.size + 1)
        return _jsonable(
            {
                "format": REPORT_FORMAT,
                "sources": self.sources,
                "config": self.config.to_dict(),
                "summary": self.summary(),
                "spectrum": {
                    "k": k.tolist(),
                    "sigma": self.sigma.tolist(),
                    "fit_singular": self.fit_singular.to_dict(),
                    "fit_eigen": self.fit_eigen.to_dict(),
                    "explained_variance": self.explained_spectrum.tolist(),
                    "explained_variance_denominator": (
                        (
                            "squared Frobenius norm of the column-centred H"
                            if self.sources.get("spectrum", {}).get("center")
                            else "squared Frobenius norm of H"
                        )
                        if self.total_energy is not None
                        else "sum of the computed sigma^2 (total energy unknown)"
                    ),
                    "total_energy": self.total_energy,
                    "density": self.density.to_dict(),
                },
                "rows": {name: ra.to_dict() for name, ra in self.rows.items()},
                "notes": list(self.notes),
            }
        )


def _ranks_text(ks: np.ndarray) -> str:
    """``12`` / ``398..400`` / ``5, 9 and 12`` for a short list of ranks."""
    ks = [int(k) for k in ks]
    if len(ks) > 2 and ks == list(range(ks[0], ks[-1] + 1)):
        return f"{ks[0]}..{ks[-1]}"
    return ", ".join(map(str, ks[:-1])) + (" and " if len(ks) > 1 else "") + str(ks[-1])


def _analyze_rows(
    name: str,
    rows: Iterable[tuple[int, np.ndarray]] | RowProjections,
    basis: Any,
    ks: np.ndarray,
    steps: Sequence[int] | np.ndarray | None,
    config: DecayConfig,
    source: dict[str, Any],
    progress: bool,
) -> RowAnalysis:
    if isinstance(rows, RowProjections):
        proj = rows
        if not np.array_equal(proj.ks, ks):
            raise ValueError(
                f"the {name} rows were projected at ranks {proj.ks.tolist()}, the analysis measures "
                f"{ks.tolist()} (DecayConfig.ranks)"
            )
    else:
        proj = project_rows(rows, basis, ks=ks, progress=progress)
    G = restricted_lipschitz(proj, quantiles=config.quantiles, source=source)
    try:
        decay = lipschitz_decay(G, ci=config.ci, level=config.level)
    except ValueError as exc:
        logger.warning("no G_k fit on %s rows: %s", name, exc)
        decay = None
    ra = RowAnalysis(
        G=G,
        decay=decay,
        explained=explained_variance_rows(proj, source=source),
        by_step=reconstruction_error_by_step(proj, steps, source=source)
        if steps is not None
        else None,
    )
    if config.has_bound_inputs:
        dim = int(config.dim or basis.shape[0])
        g0, why = _bound_lipschitz(G, source)
        # eq. (2)'s rate at the largest c with G_k ≤ G_0·k^(−c) at every rank measured
        ks_all, g_all = G.statistic_every("max")
        c_rate = envelope_exponent(ks_all, g_all, g0, floor=REL_FLOOR * G.G0)
        for population in (False, True):
            tag = "population" if population else "empirical"
            ra.bounds[tag] = restricted_lipschitz_bound(
                ks=G.ks,
                G=G.max,
                n=config.n,
                epsilon=config.epsilon,
                delta=config.delta,  # type: ignore[arg-type]
                diameter=config.diameter,
                dim=dim,
                population=population,  # type: ignore[arg-type]
                tail=config.tail,
                tail_fit=decay.fit if decay else None,
                c=c_rate if np.isfinite(c_rate) else None,
                lipschitz=g0,
            )
            ra.bounds[tag].settings["G0_why"] = why
    return ra


def _bound_lipschitz(G: RestrictedLipschitz, source: Mapping[str, Any]) -> tuple[float, str]:
    """G_0 of Theorems 3.3/3.5 for these rows, and a line saying which it is.

    The theorems' G_0 bounds every per-example gradient (DP-SGD's noise is G_0·ζ); for
    rows clipped to C it is C, whatever the rows' own largest norm (a step average's is
    well below C). Without a clip norm, Ĝ_0 = the largest row norm stands in for it.
    """
    c = source.get("max_grad_norm")
    g0 = float(G.G0)
    if isinstance(c, int | float) and not isinstance(c, bool) and np.isfinite(c) and c > 0:
        if g0 <= float(c) * (1 + 1e-6):
            return float(c), (f"bounds: G_0 = C = {float(c):g}, the clip norm (the per-example bound the noise is "
                              f"scaled to); the rows' largest norm is {g0:.4g}")
        return g0, (f"bounds: the rows' largest norm {g0:.4g} exceeds their clip norm C = {float(c):g}; G_0 = "
                    "that norm")
    return g0, (f"bounds: G_0 = {g0:.4g}, the rows' largest norm (no clip norm recorded: for step averages "
                "it understates the per-example bound the theorems need)")


def analyze_spectrum(
    *,
    sigma: Sequence[float] | np.ndarray,
    config: DecayConfig | None = None,
    basis: Any | None = None,
    gradients: Iterable[tuple[int, np.ndarray]] | RowProjections | None = None,
    gradient_steps: Sequence[int] | np.ndarray | None = None,
    heldout: Iterable[tuple[int, np.ndarray]] | RowProjections | None = None,
    heldout_steps: Sequence[int] | np.ndarray | None = None,
    total_energy: float | None = None,
    sources: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> DecayAnalysis:
    """Decay fits, density, G_k, explained variance, per-step error and bounds of one spectrum.

    Args:
        sigma: singular values, decreasing.
        config: settings (:class:`DecayConfig`).
        basis: V (p × K), row-sliceable; needed for anything measured on gradient rows.
        gradients: column blocks ``(offset, (n, c) array)`` of the rows the spectrum was
            computed from (G_k in-sample; one pass), or their :class:`RowProjections` at
            ``config.ranks(K)`` (e.g. :func:`row_projections_from_svd`: no pass).
        gradient_steps: the training step of each of those rows (per-step error).
        heldout: column blocks of held-out rows (another row range or another store), or
            their :class:`RowProjections`.
        heldout_steps: their steps.
        total_energy: ``‖H‖_F²`` for the explained variance of the spectrum itself.
        sources: where the inputs came from (paths, row ranges), copied into the report.
        progress: a progress bar on stderr for each pass over rows and V.

    Returns:
        :class:`DecayAnalysis`; ``.to_dict()`` is ``report.json``.
    """
    cfg = config or DecayConfig()
    s = np.asarray(sigma, dtype=np.float64).reshape(-1)
    if s.size < 3:
        raise ValueError(f"a decay analysis needs at least 3 singular values, got {s.size}")
    if cfg.k_max is not None and not 1 <= cfg.k_max <= s.size:
        raise ValueError(
            f"k_max must lie in [1, {s.size}] (the stored singular values), got {cfg.k_max}"
        )
    if basis is not None and cfg.dim is not None and cfg.dim < int(basis.shape[0]):
        raise ValueError(
            f"dim = {cfg.dim} is below p = {int(basis.shape[0])}, the rows of the basis; the "
            "bounds' d is the dimension of the trained parameters"
        )
    fit_range = cfg.fit_range or (1, min(s.size, 1000))
    kw = dict(k_range=fit_range, ci=cfg.ci, level=cfg.level, n_boot=cfg.n_boot, seed=cfg.seed)
    analysis = DecayAnalysis(
        sigma=s,
        config=cfg,
        fit_singular=fit_spectrum(s, scale="singular", **kw),
        fit_eigen=fit_spectrum(s, scale="eigen", **kw),
        density=spectral_density(s, space=cfg.density_space, bandwidth=cfg.bandwidth),
        explained_spectrum=explained_variance(s, total_energy=total_energy),
        total_energy=total_energy,
        sources=dict(sources or {}),
    )
    if (gradients is not None or heldout is not None) and basis is None:
        raise ValueError("G_k and explained variance on gradient rows need the basis V")
    if basis is not None:
        ks = cfg.ranks(int(basis.shape[1]))
        for name, blocks, steps in (
            ("collected", gradients, gradient_steps),
            ("heldout", heldout, heldout_steps),
        ):
            if blocks is None:
                continue
            src = dict(analysis.sources.get(name, {}))
            analysis.rows[name] = _analyze_rows(name, blocks, basis, ks, steps, cfg, src, progress)
        for name, ra in analysis.rows.items():
            flat = ra.G.unresolved_ranks("max")
            if flat.size:
                analysis.notes.append(
                    f"G_k on the {name} rows at k = {_ranks_text(flat)}: every row's residual is at the "
                    "rounding level of how it was measured (the in-sample residual is exactly 0 from the "
                    "rank of H on), so it is reported as 0 and left out of the fits."
                )
        if "collected" in analysis.rows:
            analysis.notes.append(
                "G_k on the collected rows is in-sample: the subspace was fitted to these rows, "
                "so it is optimistic and reaches 0 at the rank of H; G_k on held-out rows is "
                "the honest estimate."
            )
    if cfg.has_bound_inputs:
        analysis.notes.append(
            "Bounds: Li et al. 2022 Theorem 3.3 eq. (1) (empirical) and Theorem 3.5 "
            "(population) with all constants set to 1; G_k beyond the measured ranks "
            f"continued by tail rule '{cfg.tail}'."
        )
    return analysis
