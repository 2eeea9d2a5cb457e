"""`gradspec replay`: a per-step sketched run's directions in parameter space (issue 37 §4)."""

from __future__ import annotations

from pathlib import Path

import typer

from cli._common import user_errors


@user_errors
def replay_command(
    store: Path = typer.Argument(..., help="Per-step sketched gradient store (collect --sketch M, no --per-example)."),
    spectrum: Path = typer.Option(..., "--spectrum", "-s", help="`gradspec pca` of STORE (U and sigma; V in sketch space)."),
    out: Path = typer.Option(..., "--out", "-o", help="Spectrum store to write: V in parameter space (retrain --projector takes it)."),
    k: int = typer.Option(None, "--k", "-k", help="Directions to keep (default: all of --spectrum's; all are used)."),
    memory: str = typer.Option(None, "--memory", help="Budget of the k x p float64 accumulators, e.g. 4G (default 4G); more columns take more replays."),
    tolerance: float = typer.Option(None, "--tolerance", help="Largest relative difference of a replayed row from the stored one (default: 1e-5 for float32 stores, one unit in the last place for 16-bit ones)."),
    check: bool = typer.Option(False, "--check", help="Replay once more to measure H·V of the written directions: their residuals ||H v_i - sigma_i u_i|| (default: a bound, loose unless every direction of the rows is replayed), and the rows' G_k onto their span for gradspec decay."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Replay the seeded run of a sketched store; write its top-k directions in parameter space.

    Every replayed step's row is sketched with the store's plan and compared with the stored
    row: a row that differs by more than the tolerance (1e-5 of the row's largest entry by
    default; changed code, data or settings and non-deterministic kernels usually differ by
    more, but a change below it passes) is refused, naming the step, and nothing is written.
    How many rows replayed bit for bit is printed: fewer than all means the run was not
    reproduced exactly.
    """
    from gradspec import replay
    from gradspec.linalg import parse_memory

    res = replay(store, spectrum, out=out, k=k, memory=parse_memory(memory), tolerance=tolerance,
                 overwrite=overwrite, progress=not no_progress, check=check)
    rec = res.record
    ver = rec["verification"]
    typer.echo(
        f"replayed {res.steps} steps: {res.rows_checked} rows checked against the store, {res.rows_exact} bit for "
        f"bit, worst relative difference {res.max_relative_difference:.2g} (tolerance {ver['tolerance']:.2g})"
    )
    typer.echo(f"sigma[:5] replayed: {', '.join(f'{s:.4g}' for s in res.sigma[:5])}   "
               f"sketched: {', '.join(f'{s:.4g}' for s in res.sigma_sketch[:5])}")
    typer.echo(f"V: {rec['k']} directions of p = {res.record.get('p', '?')} in parameter space from K = {rec['K']} "
               f"(Rayleigh-Ritz of the exact rows on the sketched U), orthonormal to {res.orthogonality:.1e}")
    worst = float(res.residual_h.max())
    if res.measured:
        typer.echo(f"residuals measured (one more replay): max ||H v_i - sigma_i u_i|| / sigma_i = {worst:.2e} "
                   f"(the bound without it: {max(rec['check_replay']['residual_h_bound']):.2e})")
    else:
        typer.echo(f"residuals not measured: ||H v_i - sigma_i u_i|| / sigma_i <= {worst:.2e} (the rows' mass "
                   f"outside the K = {rec['K']} directions{', 0 as K = r' if worst == 0 else ''}); "
                   "--check measures them with one more replay")
    typer.echo(f"{res.passes + res.check_passes} replay(s) in {res.seconds:.1f}s -> {out}")
