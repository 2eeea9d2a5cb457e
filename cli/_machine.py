"""`gradspec info --machine`: the Gram kernel `gradspec pca` uses on this machine and why."""

from __future__ import annotations

import typer

from cli._common import echo_json


def machine_info(as_json: bool) -> None:
    """`gradspec info --machine`: the Gram kernel pca uses here, and the rates it was chosen by."""
    from gradspec.linalg import machine_kernels

    info = machine_kernels()
    if as_json:
        echo_json(info)
        return
    key = info["key"]
    typer.echo(f"machine  {key['cpu']}, {key['cores']} cores, torch {key['torch']} "
               f"({key['torch_threads']} threads), numpy {key['numpy']} ({key['numpy_blas']})")
    typer.echo(f"kernels  {info['source']} {info.get('measured_at', '')} on a "
               f"{info['panel'][0]}x{info['panel'][1]} panel; cache {info['cache']}")
    if info.get("why"):
        typer.echo(f"again    {info['why']}")
    typer.echo(f"measured {info['how']}")
    for dtype, rates in info["rates"].items():
        chosen = info["choice"][dtype]
        ranked = sorted(rates.items(), key=lambda kv: -kv[1])
        typer.echo(f"{dtype}  chosen {chosen}: " + "  ".join(f"{n} {v:.1f}" for n, v in ranked)
                   + " GFLOP/s (r²w counted)")
