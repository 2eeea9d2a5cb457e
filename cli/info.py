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
    store: Path = typer.Argument(None, help="A gradient store (collect) or spectrum store (pca)."),
    as_json: bool = typer.Option(False, "--json", help="Print everything as JSON."),
    verify: bool = typer.Option(
        False, "--verify",
        help="Read every chunk of every committed row and all metadata; exit 1 if one is missing, "
        "truncated, the wrong size, undecodable, fails its crc32c checksum (stores written before "
        "checksums have none) or holds NaN/inf.",
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar for --verify."),
    machine: bool = typer.Option(
        False, "--machine", help="Show this machine's Gram kernel for pca (measured once, cached) "
        "and the measured rates, instead of a store."),
) -> None:
    """Show a store's shape, dtype, size, layout, config and row summary.

    Exits 1 when the store is damaged: without --verify, when a chunk of a committed
    row is missing (a listing, nothing is read); with --verify, on any damage found.
    """
    if machine:
        from cli._machine import machine_info

        machine_info(as_json)
        return
    if store is None:
        raise ValueError("give a STORE to describe, or --machine")
    from gradspec.store import open_store

    opened = open_store(store)
    summary = opened.summary()
    checked = None
    if verify:
        if not hasattr(opened, "verify"):
            raise ValueError(f"--verify checks gradient and spectrum stores; {str(store)!r} is a {summary['kind']} store")
        checked = opened.verify(progress=not no_progress and not as_json)
        summary["verify"] = checked
    damaged = summary.get("status") == "damaged" or (checked is not None and not checked["ok"])
    if as_json:
        echo_json(summary)
        if damaged:
            raise typer.Exit(1)
        return
    typer.echo(f"{summary['kind']} store  {summary['path']}  [{summary.get('status', '')}]")
    if summary["kind"] == "gradients":
        r, p = summary["shape"]
        typer.echo(f"shape    {r} rows x {p:,} columns   dtype {summary['dtype']}   chunks {tuple(summary['chunks'])}")
        typer.echo(f"size     {_size(summary['size_on_disk'])} on disk   per-example rows: {summary['per_example']}")
        typer.echo(f"kind     {summary['row_kind_text']}")
        sk = summary.get("sketch")
        if sk:
            typer.echo(f"sketch   {sk['kind']} version {sk['version']}  M = {sk['M']:,} columns ({sk['exact_columns']:,} exact, "
                       f"{sk['blocks']} independent blocks)  of p = {sk['p']:,} unsketched  seed {sk['seed']}  "
                       f"columns by {sk['weighting']}")
            if sk.get("width_note"):  # why the stored M is below the asked one
                typer.echo(f"         {sk['width_note']}")
            elif sk.get("requested_M") not in (None, sk["M"]):
                typer.echo(f"         asked {sk['requested_M']:,}, stored {sk['M']:,}")
        lay = summary["layout"]
        typer.echo(f"layout   {lay['parameters']} {'column groups' if sk else 'parameters'}, p = {lay['p']:,}")
        for spec in lay["first"]:
            typer.echo(f"           {spec['name']}  {tuple(spec['shape'])}  @ {spec['offset']:,}")
        if lay["parameters"] > len(lay["first"]):
            spec = lay["last"]
            typer.echo(f"           ...  {spec['name']}  {tuple(spec['shape'])}  @ {spec['offset']:,}")
        cfg = summary["config"]
        c = cfg.get("collect", {})
        if c:
            from gradspec.privacy import accounted_sample_rate, rate_text

            typer.echo(
                f"run      task {cfg.get('task')}  mode {c.get('mode')}  steps {cfg.get('steps')}  "
                f"{rate_text(cfg.get('sample_rate', 0), accounted_sample_rate(cfg))}  noise multiplier {cfg.get('noise_multiplier', 0):.4g}  C {cfg.get('max_grad_norm')}  "
                f"lr {c.get('lr')} ({c.get('optimizer')})  seed {c.get('seed')}"
                + (f"  on {cfg['world_size']} processes" if int(cfg.get("world_size") or 1) > 1 else "")
            )
        if "final_epsilon" in cfg:
            typer.echo(f"privacy  epsilon = {cfg['final_epsilon']:.3f} at delta = {cfg.get('delta', 0):.3g}")
        rows = summary["rows"]
        if rows:
            if rows.get("grad_norm_mean") is None:
                norms = "grad norms not recorded by this source"
            else:
                clipped = ("not clipped" if c.get("max_grad_norm", cfg.get("max_grad_norm", 0)) is None
                           else _clipped(rows["frac_clipped_mean"]))
                partial = rows.get("rows_with_norms", summary["shape"][0])
                norms = (f"grad norm mean {rows['grad_norm_mean']:.3g} max {rows['grad_norm_max']:.3g}  "
                         f"{clipped}" + (f" ({partial} rows with norms)" if partial != summary["shape"][0] else ""))
            typer.echo(
                f"rows     steps {rows['steps'][0]}..{rows['steps'][1]}  loss {rows['loss_first_last'][0]:.4f} -> "
                f"{rows['loss_first_last'][1]:.4f}  {norms}"
            )
        _example_norms(summary)
        _norm_shares(cfg.get("norm_shares"))
        _precision(summary.get("dtype_report"))
        _checksums(summary.get("checksums"))
        _row_checksums(summary.get("row_checksums"))
        _missing(summary)
    else:
        _spectrum(summary)
    if checked is not None:
        _verified(checked, summary.get("checksums"))
    if damaged:
        raise typer.Exit(1)


def _example_norms(summary: dict) -> None:
    """The one line of a per-example store's own pre-clip norms and clip factors."""
    if summary.get("example_norms_error"):
        typer.echo(f"norms    per example: {summary['example_norms_error']}")
        return
    n = summary.get("example_norms")
    if n:
        typer.echo(f"norms    per example: pre-clip median {n['pre_clip_norm_median']:.3g} max "
                   f"{n['pre_clip_norm_max']:.3g}, clipped {n['frac_clipped']:.1%} of {n['rows']:,} rows "
                   f"(smallest clip factor {n['clip_factor_min']:.3g})")
    elif summary.get("per_example") and summary["shape"][0]:
        typer.echo("norms    per example: not kept (written before gradspec kept each row's own norm)")


def _norm_shares(shares: dict | None) -> None:
    """The run's largest parameter groups by share of the warm-up batch's clipped norm
    (`gradspec.train._norm_shares`; runs from before it have none)."""
    if not shares or not shares.get("groups"):
        return
    p = max(int(shares["p"]), 1)
    top = "; ".join(f"{g['group']} {g['share']:.1%} ({g['parameters'] / p:.2%} of p)" for g in shares["groups"][:3])
    typer.echo(f"shares   of the clipped norm, {shares['examples']} warm-up examples: {top}")


def _precision(rep: dict | None) -> None:
    if not rep or not rep.get("rows"):
        return
    from gradspec.store import precision_material

    flag = "  (material: see the warning when it was written)" if precision_material(rep) else ""
    typer.echo(
        f"dtype    {rep['dtype']}: {rep['underflowed_share']:.2%} of nonzero entries flushed to 0, "
        f"{rep['subnormal_share']:.2%} subnormal; relative error {rep['rel_error']:.2e} "
        f"(worst row {rep['max_row_rel_error']:.2e}){flag}"
    )


def _checksums(c: dict | None) -> None:
    """Whether the store's chunks carry checksums (stores written before them do not)."""
    if not c or not c["arrays"]:
        return
    if not c["unchecked"]:
        typer.echo(f"checksum {c['codec']} on every chunk ({c['arrays']} arrays): a changed byte is found "
                   "by reading it (--verify reads them all)")
        return
    cannot = ("a changed byte in a chunk cannot be detected (--verify finds missing, wrong-sized and "
              "undecodable chunks and NaN/inf only); collect or compute it again to get checksums")
    if not c["checksummed"]:
        typer.echo(f"checksum none: written before gradspec checksummed its chunks; {cannot}")
        return
    names = ", ".join(c["unchecked"][:3]) + (f" and {len(c['unchecked']) - 3} more" if len(c["unchecked"]) > 3 else "")
    typer.echo(f"checksum {c['codec']} on {len(c['checksummed'])} of {c['arrays']} arrays; none on {names} "
               f"(written before gradspec checksummed chunks): there {cannot}")


def _row_checksums(bound: bool | None) -> None:
    """Whether each gradient chunk is bound to the store's own rows (``_rowsums``)."""
    if bound:
        typer.echo("rowsums  each row's crc32c per column chunk and metadata array: a chunk copied from another "
                   "store, or moved within this one, is found by reading it")
    elif bound is not None:
        typer.echo("rowsums  none: written before gradspec recorded its rows' checksums; a chunk copied in "
                   "from another store of the same chunking cannot be told from its own")


def _missing(summary: dict) -> None:
    missing = summary.get("missing_chunks") or []
    _damage([f"{m['array']}/{m['chunk']} (rows {m['rows'][0]}..{m['rows'][1]}"
             + ("" if m.get("problem", "missing") == "missing" else f": {m['problem']}") + ")" for m in missing],
            summary.get("all_chunks_written", True),
            "of committed rows are missing or the wrong size", "they would read as zeros or fail. Restore them, "
            "or truncate the store before them", "of committed rows read as zeros", summary.get("meta_error"))


def _damage(shown_all: list[str], damaged: bool, what: str, remedy: str, legacy: str,
            error: str | None) -> None:
    """The DAMAGED / absent line of a store's missing chunks (gradient or spectrum), and its error."""
    if shown_all:
        shown = ", ".join(shown_all[:3])
        more = f" and {len(shown_all) - 3} more" if len(shown_all) > 3 else ""
        if damaged:
            typer.echo(f"DAMAGED  {len(shown_all)} chunk(s) {what}: {shown}{more}; {remedy}")
        else:
            typer.echo(f"absent   {len(shown_all)} chunk(s) {legacy}: {shown}{more}; this store predates "
                       "gradspec writing all-zero chunks, so they may be zero or lost")
    if error:
        typer.echo(f"         {error}")


def _verified(rep: dict, checksums: dict | None) -> None:
    bad = rep["damaged"]
    nonfinite = rep["non_finite"]
    ranges = rep.get("out_of_range") or {}
    verdict = "ok" if rep["ok"] else (
        f"{len(bad)} damaged chunk(s), {sum(v['count'] for v in nonfinite.values())} non-finite value(s)"
        + (f", {sum(v['count'] for v in ranges.values())} out-of-range norm(s)" if ranges else "")
    )
    if checksums and checksums["arrays"] and not checksums["unchecked"]:
        crc = "checksums checked"
    elif checksums and checksums["checksummed"]:
        crc = f"checksums checked on {rep.get('checksummed_chunks', 0):,} (some arrays have none)"
    else:
        crc = "no checksums (a changed byte cannot be detected)"
    typer.echo(f"verify   {rep['chunks']:,} chunks of committed rows read ({_size(rep['bytes'])}), {crc}: {verdict}")
    for d in bad[:20]:
        typer.echo(f"           {d['array']}/{d['chunk']}  rows {d['rows'][0]}..{d['rows'][1]}  {d['problem']}")
    if len(bad) > 20:
        typer.echo(f"           ... and {len(bad) - 20} more")
    for name, v in nonfinite.items():
        rows = ", ".join(str(r) for r in v["rows"][:10])
        typer.echo(f"           {name}: {v['count']:,} NaN/inf values, in rows {rows}{' ...' if len(v['rows']) > 10 else ''}")
    for name, v in ranges.items():
        rows = ", ".join(str(r) for r in v["rows"][:10])
        typer.echo(f"           {name}: {v['count']:,} negative norm(s) or clip factor(s) outside (0, 1], "
                   f"in rows {rows}{' ...' if len(v['rows']) > 10 else ''}")
    if rep.get("unchecked"):
        typer.echo(f"           not checked (still being written by an unfinished run): {', '.join(rep['unchecked'])}")
    if rep.get("absent_zero_chunks"):
        typer.echo(f"           {rep['absent_zero_chunks']} metadata chunk(s) absent: all-zero in a store that "
                   "predates gradspec writing them, or lost")


def _clipped(frac: float | None) -> str:
    """The mean share of examples clipped per step, or what is wrong with it: a mean outside
    [0, 1] is no fraction (was: "clipped 99950%" for a store whose frac_clipped held row
    numbers)."""
    if frac is None or frac != frac:
        return "clipped share not recorded"
    if not 0.0 <= frac <= 1.0:
        return f"clipped share unknown (meta/frac_clipped averages {frac:.4g}, not a fraction in [0, 1])"
    return f"clipped {frac:.0%}"


def _spectrum(summary: dict) -> None:
    r, p = summary["shape"]
    src = summary.get("source") or {}
    params = summary.get("params") or {}
    acc = summary.get("accuracy") or {}
    if summary.get("writer"):
        typer.echo(f"writer   {summary['writer']}")
    typer.echo(f"shape    H is {r} x {p:,}   k = {summary['k']}   size {_size(summary.get('size_on_disk'))} on disk")
    typer.echo(f"method   {summary['method']}  ({params.get('reason', '')})")
    typer.echo(f"source   {src.get('path')}  rows {src.get('rows') or 'all'}  params {src.get('params') or 'all'}"
               f"  centered {src.get('center', False)}")
    if "sigma_top" in summary:
        top = ", ".join(f"{v:.4g}" for v in summary.get("sigma_top", []))
        typer.echo(f"sigma    {top}, ...  sigma_k = {summary.get('sigma_last', float('nan')):.4g}")
    if acc:
        typer.echo(
            f"accuracy max residual {acc.get('max_residual', float('nan')):.2e}   reconstruction error "
            f"{acc.get('reconstruction_error', float('nan')):.4f}   explained variance "
            f"{acc.get('explained_variance', float('nan')):.4f}"
        )
        if str(acc.get("check", "")).startswith("replay") and acc.get("residual_h_check"):
            typer.echo(f"         residual {acc['residual_h_check']}")  # a replay's: a bound, or measured
    timings = summary.get("timings") or {}
    if timings:
        typer.echo("timings  " + "  ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    _checksums(summary.get("checksums"))
    if summary.get("chunk_manifest") is not None:
        typer.echo("manifest each chunk's crc32c recorded when pca finished: a chunk copied from another store, "
                   "or moved within this one, is found by reading it" if summary["chunk_manifest"] else
                   "manifest none: written before gradspec recorded its chunks' checksums; a chunk copied in "
                   "from another spectrum of the same shape cannot be told from its own")
    _spectrum_damage(summary)


def _spectrum_damage(summary: dict) -> None:
    bad = summary.get("damaged_chunks") or []
    _damage([f"{d['array']}/{d['chunk']} ({d['problem']})" for d in bad], summary.get("status") == "damaged",
            "are missing or the wrong size", "they would read as zeros or fail. Restore them, or run "
            "`gradspec pca` again with --overwrite", "read as zeros", summary.get("read_error"))
