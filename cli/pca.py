"""`gradspec pca`: top-k singular values/vectors of a gradient store into a spectrum store."""

from __future__ import annotations

from pathlib import Path

import typer

from cli._common import user_errors
from gradspec import PcaMethod

#: A relative triplet residual above this means an iterative method stopped short.
UNCONVERGED = 1e-2


@user_errors
def pca_command(
    store: Path = typer.Argument(..., help="Gradient store written by `gradspec collect`."),
    k: int = typer.Option(..., "--k", "-k", help="Number of singular values/vectors."),
    out: Path = typer.Option(..., "--out", "-o", help="Spectrum store to write (Zarr)."),
    method: str = typer.Option(
        PcaMethod.AUTO.value, "--method", help="auto | gram (exact) | orthogonal | krylov | lanczos."
    ),
    rows: str = typer.Option(
        None, "--rows", help="Row selection START:STOP[:STEP], e.g. 300:1300."
    ),
    params: list[str] = typer.Option(
        None, "--params", help="Parameter pattern (glob or re:REGEX); repeatable."
    ),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda | auto."),
    precision: str = typer.Option(
        "auto", "--precision", help="Block products (sums are float64): auto (float32 for float32/16 stores, with a refined sigma; float64 for float64 data) | float64 | float32 | tf32."
    ),
    memory: str = typer.Option(
        None, "--memory", help="Memory budget, e.g. 4G (default: half the free RAM, ≤ 8G)."
    ),
    iters: int = typer.Option(
        None, "--iters", help="Iterations (orthogonal: 10, the paper's; krylov: depth 4)."
    ),
    tol: float = typer.Option(
        None, "--tol", help="Orthogonal: stop when top-k Ritz residuals < TOL."
    ),
    oversample: int = typer.Option(10, "--oversample", help="Extra columns of iterative methods."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random start."),
    scheduler: str = typer.Option(
        None, "--scheduler", help="dask.distributed scheduler address (tcp://...)."
    ),
    center: bool = typer.Option(
        False, "--center", help="Subtract column means (the paper's H is uncentered)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue an interrupted orthogonal/krylov run in --out."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out."),
    verify: str = typer.Option(
        "cheap", "--verify",
        help="Accuracy check of the V pass: cheap (Gaussian probes of H·V with a stated "
        "confidence, the Gram's eigen-residual, rounding terms; far less than a product) | "
        "full (the products H·V and VᵀV: a second GEMM the size of V's) | none.",
    ),
    no_verify: bool = typer.Option(
        False, "--no-verify", help="Skip the accuracy check (the same as --verify none)."
    ),
    kernel: str = typer.Option(
        "auto", "--kernel",
        help="Gram kernel: auto (the fastest measured on this machine, cached; see "
        "`gradspec info --machine`) | numpy-syrk | scipy-syrk | torch-blocked | torch-gemm.",
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars."),
) -> None:
    """Top-k SVD of the gradient matrix, out of core; writes σ, U, V and an accuracy report."""
    from gradspec.linalg import parse_rows, pca

    if no_verify and verify not in ("cheap", "none"):
        raise ValueError(f"--no-verify and --verify {verify} contradict each other; give one of them")
    result = pca(
        source=str(store),
        k=k,
        method=method,
        rows=parse_rows(rows),
        params=list(params) if params else None,
        center=center,
        out=out,
        overwrite=overwrite,
        resume=resume,
        device=device,
        precision=precision,
        memory=memory,
        iters=iters,
        tol=tol,
        oversample=oversample,
        seed=seed,
        scheduler=scheduler,
        verify="none" if no_verify else verify,
        kernel=kernel,
        progress=not no_progress,
    )
    acc = result.accuracy()
    r, p = result.source.get("shape", ["?", "?"])
    top = ", ".join(f"{s:.4g}" for s in result.sigma[:5])
    typer.echo(
        f"H: {r} x {p}   k={result.k}   method={result.method} ({result.params.get('reason')})"
    )
    if result.params.get("k_reason"):
        typer.echo(
            f"kept k={result.k} of --k {result.params['k_requested']}: "
            f"{result.params['k_reason']}; the store holds these {result.k} directions"
        )
    typer.echo(f"sigma[:5]: {top}   sigma[k]: {result.sigma[-1]:.4g}")
    typer.echo(
        f"accuracy: max residual {acc['max_residual']:.2e}, reconstruction error "
        f"{acc['reconstruction_error']:.4f}, explained variance {acc['explained_variance']:.4f}"
    )
    _check(acc)
    _sketch(acc.get("sketch"))
    _rates(result.params)
    typer.echo(f"{result.passes} passes in {result.timings.get('total', 0):.1f}s -> {out}")
    if acc["max_residual"] > UNCONVERGED:
        typer.echo(
            f"warning: max residual {acc['max_residual']:.2e} > {UNCONVERGED:g}: the top-{result.k} "
            "triplets have not converged, so sigma and V are off; raise --iters (or --oversample), "
            "or use --method gram",
            err=True,
        )


def _check(acc: dict) -> None:
    """Which accuracy check ran and what it found (its findings are also logged as warnings)."""
    if not acc.get("check"):
        return
    found = acc.get("flags") or {}
    verdict = "" if acc["check"] == "none" else (
        f": {len(found)} finding(s): {', '.join(found)}" if found else ": ok"
    )
    typer.echo(f"check: {acc['check']}, {acc.get('check_text', '')}{verdict}")
    if acc["check"] != "none":
        typer.echo(
            f"  U orthogonality {acc.get('orthogonality_u', float('nan')):.1e}"
            + (f", Gram eigen-residual {acc['gram_residual']:.1e}" if "gram_residual" in acc else "")
            + f", rounding can add ~{acc.get('rounding', 0.0):.1e}"
            + (f", underflow up to {acc['underflow']:.1e}" if acc.get("underflow", 0.0) >= 1e-3 else "")
        )


def _sketch(rep: dict | None) -> None:
    """One line: the stated error of a spectrum of a sketched store (``gradspec.sketch.error_report``)."""
    if not rep:
        return
    rel = [x for x in rep["relative_half_width"] if x is not None]
    top = f"{rel[0]:.2%}" if rep["relative_half_width"][0] is not None else "unbounded"
    med = f"{rep['median_relative_half_width']:.2%}" if rep.get("median_relative_half_width") is not None else "unbounded"
    ang = ", ".join(f"k={a['k']}: " + ("vacuous" if a["vacuous"] else f"{a['bound']:.2g}") for a in rep["angles"])
    # Spectra computed before the block bootstrap hold the jackknife's intervals: nominal 95% but
    # measured to cover ~72% of the top 100 (docs/sketch_calibration.md): not a guarantee. Newer
    # ones carry the bootstrap's measured calibration in one line (``calibration``).
    uncalibrated = "NOT YET CALIBRATED" in str(rep.get("statement", ""))
    typer.echo(
        f"sketch: M={rep['M']} J={rep['J']} p={rep['p']}: sigma_1 within ±{top}, median ±{med} "
        f"({len(rel)}/{rep['k']} bounded); sin(angle) of top-k U {ang}; V lives in sketch space"
        + ("\n  (intervals nominal 95%, not yet calibrated: they covered 72% of the true top-100 sigma "
           "in docs/sketch_calibration.md, so read them as about one actual error wide)" if uncalibrated else "")
        + (f"\n  ({rep['calibration']})" if rep.get("calibration") and not uncalibrated else "")
        + "".join(f"\n  caveat: {line}" for line in rep.get("caveats") or [])
    )


def _rates(params: dict) -> None:
    """Each kind of pass: its time, symmetric-counted GFLOP/s and read rate; the Gram kernel."""
    groups: dict[str, dict] = {}
    for e in params.get("rates") or []:
        g = groups.setdefault(e["pass"], {"n": 0, "seconds": 0.0, "flops": 0.0, "bytes": 0, "wait": 0.0})
        g["n"] += 1
        g["seconds"] += e["seconds"]
        g["flops"] += (e.get("gflops") or 0.0) * 1e9 * e["seconds"]
        g["bytes"] += e.get("bytes_read") or 0
        g["wait"] += e.get("read_wait") or 0.0
    parts = []
    for name, g in groups.items():
        sec = max(g["seconds"], 1e-12)
        times = f" x{g['n']}" if g["n"] > 1 else ""
        parts.append(
            f"{name}{times} {g['seconds']:.1f}s"
            + (f" {g['flops'] / sec / 1e9:.1f} GFLOP/s" if g["flops"] else "")
            + (f" {g['bytes'] / sec / 1e9:.2f} GB/s read" if g["bytes"] else "")
            + (f" (waited {g['wait']:.1f}s for reads)" if g["wait"] >= 0.05 else "")
        )
    if parts:
        typer.echo("rates: " + "; ".join(parts))
    if params.get("kernel"):
        typer.echo(f"gram kernel: {params['kernel']} ({params.get('kernel_reason')})")

