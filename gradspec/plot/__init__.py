"""Matplotlib figures of spectrum analyses (object API; no pyplot state, any backend)."""

from gradspec.plot._figures import (
    plot_density,
    plot_explained_variance,
    plot_lines_errorbars,
    plot_lipschitz,
    plot_spectrum,
    plot_step_error,
    save_figure,
)
from gradspec.plot._metrics import RunMetrics, load_curve, read_metrics
from gradspec.plot._report import ReportView, overlay_figures, report_figures
from gradspec.plot._retrain import (
    plot_metric_vs_epsilon,
    plot_retrain_curves,
    save_sweep_figures,
)
from gradspec.plot._training import plot_training

__all__ = [
    # single figures
    "plot_density",
    "plot_explained_variance",
    "plot_lines_errorbars",
    "plot_lipschitz",
    "plot_spectrum",
    "plot_step_error",
    "save_figure",
    # figure sets
    "ReportView",
    "overlay_figures",
    "report_figures",
    # a run's metrics.jsonl
    "RunMetrics",
    "load_curve",
    "plot_training",
    "read_metrics",
    # retraining runs and sweeps
    "plot_metric_vs_epsilon",
    "plot_retrain_curves",
    "save_sweep_figures",
]
