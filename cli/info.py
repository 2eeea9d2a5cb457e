"""`gradspec info`: what a store holds (gradient or spectrum store)."""

from __future__ import annotations

from pathlib import Path

import typer

from cli._common import echo_json, user_errors


def _size(n: int | None) -> str:
    if n is None:
        return "n/a (remote)"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)


@user_errors
def info_command(
    store: Path = typer.Argument(..., help="A gradient store (collect) or spectrum store (pca)."),
    as_json: bool = typer.Option(False, "--json", help="Print everything as JSON."),
) -> None:
    """Show a store's shape, dtype, size, layout, config and row summary."""
    from gradspec.store import open_store

    summary = open_store(store).summary()
    if as_json:
        echo_json(summary)
        return
    typer.echo(f"{summary['kind']} store  {summary['path']}  [{summary.get('status', '')}]")
    if summary["kind"] == "gradients":
        r, p = summary["shape"]
        typer.echo(f"shape    {r} rows x {p:,} columns   dtype {summary['dtype']}   chunks {tuple(summary['chunks'])}")
        typer.echo(f"size     {_size(summary['size_on_disk'])} on disk   per-example rows: {summary['per_example']}")
        lay = summary["layout"]
        typer.echo(f"layout   {lay['parameters']} parameters, p = {lay['p']:,}")
        for spec in lay["first"]:
            typer.echo(f"           {spec['name']}  {tuple(spec['shape'])}  @ {spec['offset']:,}")
        if lay["parameters"] > len(lay["first"]):
            spec = lay["last"]
            typer.echo(f"           ...  {spec['name']}  {tuple(spec['shape'])}  @ {spec['offset']:,}")
        cfg = summary["config"]
        c = cfg.get("collect", {})
        if c:
            typer.echo(
                f"run      task {cfg.get('task')}  mode {c.get('mode')}  steps {cfg.get('steps')}  "
                f"q {cfg.get('sample_rate', 0):.4g}  sigma {cfg.get('noise_multiplier', 0):.4g}  C {cfg.get('max_grad_norm')}  "
                f"lr {c.get('lr')} ({c.get('optimizer')})  seed {c.get('seed')}"
            )
        if "final_epsilon" in cfg:
            typer.echo(f"privacy  epsilon = {cfg['final_epsilon']:.3f} at delta = {cfg.get('delta', 0):.3g}")
        rows = summary["rows"]
        if rows:
            typer.echo(
                f"rows     steps {rows['steps'][0]}..{rows['steps'][1]}  loss {rows['loss_first_last'][0]:.4f} -> "
                f"{rows['loss_first_last'][1]:.4f}  grad norm mean {rows['grad_norm_mean']:.3g} max "
                f"{rows['grad_norm_max']:.3g}  clipped {rows['frac_clipped_mean']:.0%}"
            )
    else:
        _spectrum(summary)


def _spectrum(summary: dict) -> None:
    r, p = summary["shape"]
    src = summary.get("source") or {}
    params = summary.get("params") or {}
    acc = summary.get("accuracy") or {}
    typer.echo(f"shape    H is {r} x {p:,}   k = {summary['k']}   size {_size(summary.get('size_on_disk'))} on disk")
    typer.echo(f"method   {summary['method']}  ({params.get('reason', '')})")
    typer.echo(f"source   {src.get('path')}  rows {src.get('rows') or 'all'}  params {src.get('params') or 'all'}"
               f"  centered {src.get('center', False)}")
    top = ", ".join(f"{v:.4g}" for v in summary.get("sigma_top", []))
    typer.echo(f"sigma    {top}, ...  sigma_k = {summary.get('sigma_last', float('nan')):.4g}")
    if acc:
        typer.echo(
            f"accuracy max residual {acc.get('max_residual', float('nan')):.2e}   reconstruction error "
            f"{acc.get('reconstruction_error', float('nan')):.4f}   explained variance "
            f"{acc.get('explained_variance', float('nan')):.4f}"
        )
    timings = summary.get("timings") or {}
    if timings:
        typer.echo("timings  " + "  ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
