"""All figures of one decay analysis, or overlays of several (Li et al. 2022, Figures 2a, 3–5)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from gradspec.plot._figures import (
    plot_density,
    plot_explained_variance,
    plot_lipschitz,
    plot_spectrum,
    plot_step_error,
    save_figure,
)
from gradspec.spectrum import (
    DecayAnalysis,
    ExplainedVariance,
    PowerLawFit,
    RestrictedLipschitz,
    SpectralDensity,
    StepError,
)

logger = logging.getLogger(__name__)


class ReportView:
    """The plottable parts of a decay analysis, from a :class:`DecayAnalysis` or ``report.json``."""

    def __init__(
        self,
        sigma: np.ndarray,
        fit_singular: PowerLawFit,
        fit_eigen: PowerLawFit,
        density: SpectralDensity,
        explained_spectrum: np.ndarray,
        G: dict[str, RestrictedLipschitz],
        G_fits: dict[str, PowerLawFit],
        explained: dict[str, ExplainedVariance],
        by_step: dict[str, StepError],
        sources: Mapping[str, Any] | None = None,
    ) -> None:
        #: where the analysis' inputs came from (the spectrum's row kind: overlays warn on unlike
        #: kinds; found by review: views carried none, so `gradspec plot A B` never warned)
        self.sources = dict(sources or {})
        self.sigma = sigma
        self.fit_singular = fit_singular
        self.fit_eigen = fit_eigen
        self.density = density
        self.explained_spectrum = explained_spectrum
        self.G = G
        self.G_fits = G_fits
        self.explained = explained
        self.by_step = by_step

    @classmethod
    def from_analysis(cls, a: DecayAnalysis) -> ReportView:
        return cls(
            sigma=a.sigma,
            fit_singular=a.fit_singular,
            fit_eigen=a.fit_eigen,
            density=a.density,
            explained_spectrum=a.explained_spectrum,
            G={n: r.G for n, r in a.rows.items()},
            G_fits={n: r.decay.fit for n, r in a.rows.items() if r.decay},
            explained={n: r.explained for n, r in a.rows.items()},
            by_step={n: r.by_step for n, r in a.rows.items() if r.by_step is not None},
            sources=a.sources,
        )

    @classmethod
    def from_report(cls, d: Mapping[str, Any]) -> ReportView:
        """From the dict of ``report.json``.

        Raises:
            ValueError: an entry the figures need is missing or of another type (one line).
        """
        try:
            return cls._from_report(d)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            what = f"it has no {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0][:100]
            raise ValueError(f"the decay report is damaged or incomplete ({what}); run `gradspec decay` "
                             "again to rewrite it") from None

    @classmethod
    def _from_report(cls, d: Mapping[str, Any]) -> ReportView:
        sp = d["spectrum"]
        rows = d.get("rows", {})
        return cls(
            sigma=np.asarray(sp["sigma"], dtype=np.float64),
            fit_singular=PowerLawFit.from_dict(sp["fit_singular"]),
            fit_eigen=PowerLawFit.from_dict(sp["fit_eigen"]),
            density=SpectralDensity.from_dict(sp["density"]),
            explained_spectrum=np.asarray(sp["explained_variance"], dtype=np.float64),
            G={n: RestrictedLipschitz.from_dict(r["G_k"]) for n, r in rows.items()},
            G_fits={
                n: PowerLawFit.from_dict(r["G_k_decay"]["fit"])
                for n, r in rows.items()
                if r.get("G_k_decay")
            },
            explained={
                n: ExplainedVariance.from_dict(r["explained_variance"]) for n, r in rows.items()
            },
            by_step={
                n: StepError.from_dict(r["reconstruction_error_by_step"])
                for n, r in rows.items()
                if r.get("reconstruction_error_by_step")
            },
            sources=d.get("sources"),
        )


def _view(x: DecayAnalysis | ReportView | Mapping[str, Any]) -> ReportView:
    if isinstance(x, ReportView):
        return x
    if isinstance(x, DecayAnalysis):
        return ReportView.from_analysis(x)
    return ReportView.from_report(x)


def report_figures(
    analysis: DecayAnalysis | ReportView | Mapping[str, Any],
    out_dir: str | Path | None = None,
    *,
    formats: tuple[str, ...] = ("png", "pdf"),
) -> dict[str, Figure]:
    """The figures of one analysis: spectrum, eigenvalues, density, G_k, explained variance, steps.

    Args:
        analysis: a :class:`DecayAnalysis`, a :class:`ReportView` or a ``report.json`` dict.
        out_dir: when given, each figure is saved there as ``<name>.png`` and ``<name>.pdf``.

    Returns:
        name → figure (names: ``spectrum``, ``eigenvalues``, ``density``, and when gradient
        rows were analysed ``lipschitz``, ``explained_variance``, ``step_error``).
    """
    v = _view(analysis)
    figs: dict[str, Figure] = {
        "spectrum": plot_spectrum({"σ_k": v.sigma}, fits={"σ_k": v.fit_singular}),
        "eigenvalues": plot_spectrum({"σ_k²": v.sigma}, fits={"σ_k²": v.fit_eigen}, scale="eigen"),
        "density": plot_density({"singular values": v.density}),
    }
    if v.G:
        figs["lipschitz"] = plot_lipschitz(v.G, fits=v.G_fits)
    ev: dict[str, Any] = {
        "spectrum (σ²/‖H‖²)": (np.arange(1, v.sigma.size + 1), v.explained_spectrum)
    }
    ev.update({f"{n} rows": e for n, e in v.explained.items()})
    if v.explained:
        figs["explained_variance"] = plot_explained_variance(ev)
    if v.by_step:
        figs["step_error"] = plot_step_error(v.by_step)
    if out_dir is not None:
        for name, fig in figs.items():
            save_figure(fig, out_dir, name, formats=formats)
    return figs


def _row_kind_of(analysis: Any) -> dict[str, Any] | None:
    sources = getattr(analysis, "sources", None)
    if sources is None and isinstance(analysis, Mapping):
        sources = analysis.get("sources")
    return ((sources or {}).get("spectrum") or {}).get("source", {}).get("row_kind")


def _warn_if_kinds_differ(analyses: Mapping[str, Any]) -> None:
    """Overlaid spectra of rows of different kinds (clipped vs not, per-step vs per-example,
    a Trainer's .grad) are warned about by name: they do not measure the same thing."""
    from gradspec.store import RowKind, kind_mismatch

    kinds = {label: k for label, a in analyses.items() if (k := _row_kind_of(a))}
    labels = list(kinds)
    for label in labels[1:]:
        differ = kind_mismatch(RowKind(**kinds[labels[0]]), RowKind(**kinds[label]),
                               names=(repr(labels[0]), repr(label)))
        if differ:
            logger.warning("overlaying spectra of rows of different kinds: %s", differ)


def overlay_figures(
    analyses: Mapping[str, DecayAnalysis | ReportView | Mapping[str, Any]],
    out_dir: str | Path | None = None,
    *,
    formats: tuple[str, ...] = ("png", "pdf"),
    rows: str = "heldout",
) -> dict[str, Figure]:
    """Several runs in one figure each (e.g. T = 10/50/100, r = 1000/4000; Figures 3–5).

    Args:
        analyses: run label → analysis.
        out_dir: save ``overlay_<name>.png/.pdf`` there when given.
        rows: which row set's G_k and explained variance to overlay (``"heldout"``, falling
            back to ``"collected"``).
    """
    views = {label: _view(a) for label, a in analyses.items()}
    if not views:
        raise ValueError("overlay_figures needs at least one analysis")
    _warn_if_kinds_differ(analyses)
    figs: dict[str, Figure] = {
        "spectrum": plot_spectrum(
            {lab: v.sigma for lab, v in views.items()},
            fits={lab: v.fit_singular for lab, v in views.items()},
        ),
        "eigenvalues": plot_spectrum(
            {lab: v.sigma for lab, v in views.items()},
            fits={lab: v.fit_eigen for lab, v in views.items()},
            scale="eigen",
        ),
    }
    spaces = {v.density.space for v in views.values()}
    if len(spaces) == 1:
        figs["density"] = plot_density({lab: v.density for lab, v in views.items()})
    else:  # a figure left out is said, never silently missing
        logger.warning("no density overlay: the runs' densities are of different quantities (%s)",
                       ", ".join(f"{lab!r}: {v.density.space}" for lab, v in views.items()))
    G, Gf, ev = {}, {}, {}
    for lab, v in views.items():
        key = rows if rows in v.G else ("collected" if "collected" in v.G else None)
        if key is None:
            logger.warning("%r has no G_k (its analysis fitted sigma only): it is left out of the G_k and "
                           "explained-variance overlays", lab)
            continue
        G[f"{lab} ({key})"] = v.G[key]
        if key in v.G_fits:
            Gf[f"{lab} ({key})"] = v.G_fits[key]
        ev[f"{lab} ({key})"] = v.explained[key]
    if G:
        figs["lipschitz"] = plot_lipschitz(G, fits=Gf, quantiles=False, threshold=False)
        figs["explained_variance"] = plot_explained_variance(ev)
    if out_dir is not None:
        for name, fig in figs.items():
            save_figure(fig, out_dir, f"overlay_{name}", formats=formats)
    return figs
