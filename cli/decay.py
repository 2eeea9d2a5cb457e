"""`gradspec decay` and `gradspec plot`: spectrum decay, G_k, bounds and figures.

Heavy imports (numpy, zarr, matplotlib) happen inside the commands so that
``gradspec --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli._common import user_errors
from cli._outputs import RECORD_NAME, check_outputs, record_outputs

# Every figure `report_figures` / `overlay_figures` can write (checked by a test): the names a
# run may write are checked before the analysis, so a refusal costs nothing.
REPORT_FIGURES = ("spectrum", "eigenvalues", "density", "lipschitz", "explained_variance", "step_error")
OVERLAY_FIGURES = tuple(f"overlay_{name}" for name in REPORT_FIGURES[:-1])
_OUT_RULE = (f"Files already there are replaced only if gradspec wrote them (listed in {RECORD_NAME}) "
             "and they are unchanged; any other file of those names is refused unless --overwrite.")
_OVERWRITE_HELP = "Replace files of the names this command writes even if gradspec did not write them."


def _formats(fmt: list[str] | None) -> tuple[str, ...]:
    formats = tuple(fmt or ("png", "pdf"))
    bad = set(formats) - {"png", "pdf", "svg"}
    if bad:
        raise ValueError(f"unknown format(s) {sorted(bad)}; choose png, pdf or svg")
    return formats


@user_errors
def decay_command(
    spectrum: Path = typer.Argument(..., help="Spectrum store written by `gradspec pca`."),
    out: Path = typer.Option(
        ..., "--out", "-o", help=f"Directory for report.json and the figures. {_OUT_RULE}"
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help=_OVERWRITE_HELP),
    gradients: Path | None = typer.Option(
        None, "--gradients",
        help="Gradient store for G_k (default: the spectrum's source store; a replayed spectrum's own "
        "rows need none, held-out rows need unsketched ones).",
    ),
    heldout_rows: str | None = typer.Option(
        None, "--heldout-rows", help="Rows A:B of the gradient store held out from the spectrum."
    ),
    spectrum_only: bool = typer.Option(
        False, "--spectrum-only", help="Analyse σ only; read no gradients."
    ),
    n: int | None = typer.Option(
        None, "--n", help="Training-set size n (bounds of Theorems 3.3/3.5)."
    ),
    epsilon: float | None = typer.Option(None, "--epsilon", help="Privacy ε (bounds)."),
    delta: float | None = typer.Option(None, "--delta", help="Privacy δ (bounds)."),
    diameter: float | None = typer.Option(None, "--diameter", help="D ≥ ‖x⁽⁰⁾ − x*‖ (bounds)."),
    dim: int | None = typer.Option(None, "--dim", help="Dimension d of the bound (default: p)."),
    tail: str = typer.Option(
        "hold", "--tail", help="G_k beyond the measured ranks: hold, fit or zero."
    ),
    k_max: int | None = typer.Option(
        None, "--k-max", help="Largest rank for G_k (default: all stored)."
    ),
    every_rank: bool = typer.Option(False, "--every-rank", help="G_k at every rank, not 0,1,2,4,…"),
    fit_range: str | None = typer.Option(
        None, "--fit-range", help="Ranks A:B of the spectrum fit."
    ),
    ci: str = typer.Option("analytic", "--ci", help="Confidence intervals: analytic or bootstrap."),
    bandwidth: str = typer.Option(
        "scott", "--bandwidth", help="KDE bandwidth: scott, silverman or h."
    ),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write the figures."),
    fmt: list[str] | None = typer.Option(
        None, "--format", help="Figure formats (default png and pdf)."
    ),
    progress: bool = typer.Option(
        True, "--progress/--no-progress",
        help="Progress bars on stderr for the passes over the rows and V (as pca's).",
    ),
) -> None:
    """Fit the spectrum's decay, measure G_k, evaluate the bounds; write report.json (+ figures)."""
    from gradspec.spectrum import decay_analysis, decay_config, write_report

    formats = _formats(fmt)  # before the analysis: a bad --format must not leave a report behind
    config = decay_config(
        k_max=k_max, every_rank=every_rank, fit_range=fit_range, ci=ci, bandwidth=bandwidth,
        n=n, epsilon=epsilon, delta=delta, diameter=diameter, dim=dim, tail=tail,
    )
    if (out / "zarr.json").exists():
        raise ValueError(
            f"--out {str(out)!r} is a Zarr store; choose a directory for report.json and the figures"
        )
    figures = [f"{name}.{f}" for name in REPORT_FIGURES for f in formats] if plots else []
    check_outputs(out, ["report.json", *figures], overwrite=overwrite)
    analysis = decay_analysis(
        spectrum=spectrum,
        gradients=gradients,
        heldout_rows=heldout_rows,
        use_gradients=not spectrum_only,
        config=config,
        progress=progress,
    )
    out.mkdir(parents=True, exist_ok=True)
    report = analysis.to_dict()
    write_report(report, out / "report.json")
    written = ["report.json"]
    if plots:
        from gradspec.plot import report_figures

        figs = report_figures(analysis, out, formats=formats)
        written += [f"{name}.{f}" for name in figs for f in formats]
    record_outputs(out, written, replaces=_every_format(REPORT_FIGURES))
    for key, line in report["summary"].items():
        typer.echo(f"{key}: {line}")
    for line in report.get("notes") or []:  # what-if settings, rows left out, ... (found by review:
        typer.echo(f"note: {line}")  # they reached report.json and the page, never the console)
    typer.echo(f"wrote {out / 'report.json'}")


def _every_format(stems) -> list[str]:
    """Every file name of these figures in any format a run may have written."""
    return [f"{name}.{f}" for name in stems for f in ("png", "pdf", "svg")]


def _load_view(path: Path):
    """A report.json, a directory holding one, or a spectrum store → a ReportView."""
    from gradspec.plot import ReportView
    from gradspec.spectrum import read_report, sigma_analysis

    report = path / "report.json" if path.is_dir() else path
    if report.is_file():
        try:
            return ReportView.from_report(read_report(report))
        except ValueError as exc:
            raise ValueError(f"{str(report)!r}: {exc}") if "report is damaged" in str(exc) else exc from None
    return ReportView.from_analysis(sigma_analysis(path))


@user_errors
def plot_command(
    inputs: list[Path] = typer.Argument(
        ..., help="Spectrum stores, decay output directories or report.json files."
    ),
    out: Path = typer.Option(..., "--out", "-o", help=f"Directory for the figures. {_OUT_RULE}"),
    overwrite: bool = typer.Option(False, "--overwrite", help=_OVERWRITE_HELP),
    label: list[str] | None = typer.Option(
        None, "--label", "-l", help="Legend label per input (repeat; default: the input's name)."
    ),
    fmt: list[str] | None = typer.Option(None, "--format", help="png, pdf and/or svg (default png and pdf)."),
) -> None:
    """Figures of one analysis, or overlays of several runs (one input: all its figures)."""
    labels = list(label or [])
    if labels and len(labels) != len(inputs):
        raise ValueError(
            f"got {len(labels)} --label for {len(inputs)} inputs; give one per input or none"
        )
    formats = _formats(fmt)
    names = labels or [p.name if p.name != "report.json" else p.parent.name for p in inputs]
    if len(set(names)) != len(names):
        raise ValueError(f"labels must differ, got {names}; pass --label for each input")
    stems = REPORT_FIGURES if len(inputs) == 1 else OVERLAY_FIGURES
    check_outputs(out, [f"{name}.{f}" for name in stems for f in formats], overwrite=overwrite)
    from gradspec.plot import overlay_figures, report_figures

    views = {name: _load_view(p) for name, p in zip(names, inputs, strict=True)}
    if len(views) == 1:
        figs = report_figures(next(iter(views.values())), out, formats=formats)
    else:
        figs = overlay_figures(views, out, formats=formats)
        figs = {f"overlay_{k}": v for k, v in figs.items()}
    record_outputs(out, [f"{name}.{f}" for name in figs for f in formats], replaces=_every_format(stems))
    for name in figs:
        typer.echo(str(out / f"{name}.{formats[0]}"))
