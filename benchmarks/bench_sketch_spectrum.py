"""The sketched spectrum against the exact one on real per-example gradients (issue 22, part 2).

Input: a per-example gradient store of real clipped gradients (e.g. MiniLM q/v from
``gradspec collect --mode per-example``) and its exact spectrum (``gradspec pca``). For each
M, the sketch plan ``gradspec collect --sketch M`` would use for these parameters (every
q/v weight is a linear layer's: Kronecker-factored Gaussian, J independent blocks) is
applied to the stored rows by ``gradspec.sketch.DenseSketch`` in float32 (the map the collector
applies to formed rows; ghost clipping's equals the float64 reference to float32 rounding,
tests/train/test_sketch_ghost.py), ``--version``: 3 (sign-masked, the default: what per-step
rows and ``--per-example --backend vmap`` get) or 2 (what ghost clipping computes per example),
written to a real sketched store, and ``gradspec.linalg.pca(method="gram")`` estimates σ and
U with its stated error; ``compare_to_exact`` then reports, per σ_i, whether the exact σ_i
lies inside the stated interval, and the subspace angles against their bounds.

The plan splits its columns as ``collect --sketch`` does by default (``--weights energy``: by
the energies of the first 32 stored rows, standing in for the warm-up batch; ``sqrt-size``:
the split before issue 37). With ``--dense``, the ideal beside it: a dense Gaussian sketch of
the same rows and width, drawn exactly in law as (U S) Z with Z r x M Gaussian (H P^T for a
Gaussian P), from the exact Gram of all r rows (one more pass over the store).

With ``--restate``, nothing is sketched: the spectra ``--work``/spectrum-M{M}.zarr of an earlier
run are re-stated with today's statement (``gradspec.sketch._bootstrap.state``: its centre and
multipliers) from the bootstrap summary their stored statement implies (λ = σ_raw², bias =
λ − σ², s.d. = the half-width of λ / the stored multiplier; the rounding term, ≤ 1e-12·λ₁, is
left out), and compared with the exact spectrum beside the stored σ and the stored statement.

Usage:
    python benchmarks/bench_sketch_spectrum.py EXACT_STORE EXACT_SPECTRUM --work DIR
        [--M 16384,65536,262144] [--blocks 8] [--k 300] [--weights energy|sqrt-size] [--dense]
        [--version 4|3|2] [--gram-cache FILE.npy] [--restate] [--out docs/bench_sketch_spectrum.txt]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gradspec


def sketch_store(exact, plan, path: Path, batch: int = 32):
    """The rows of ``exact`` sketched by ``plan`` into a new per-example store at ``path``."""
    import torch

    from gradspec.sketch import DenseSketch
    from gradspec.store import GradientStore

    store = GradientStore.create(path, layout=plan.column_layout(), per_example=True, sketch=plan.to_dict(),
                                 overwrite=True, config={"source": str(exact.path), "note": "sketched offline "
                                                         "by benchmarks/bench_sketch_spectrum.py"})
    r = exact.n_rows
    sketch = DenseSketch(plan, dtype=torch.float32)  # the collector's map: factors drawn once, float32 products
    meta_all = exact.row_meta(slice(0, r))
    pnorms = exact.param_norms(slice(0, r))
    for a in range(0, r, batch):
        z = min(a + batch, r)
        rows = torch.from_numpy(np.asarray(exact.read(slice(a, z)), dtype=np.float32))
        y = sketch(rows).numpy()
        meta = {f: np.asarray(meta_all[f][a:z]) for f in store.meta_fields}
        meta["param_norms"] = np.asarray(pnorms[a:z])
        store.write_rows(a, y, meta)
        store.commit(z)
    store.finalize()
    return GradientStore.open(path)


def plan_kinds(exact) -> dict[str, str]:
    """Per parameter, the kind `collect --sketch` gives it: `gradspec.sketch.dense_kinds` with the
    run's model (rebuilt from the store's task), so an embedding is known by its type, 2-D
    weights get Kronecker pairs and vectors dense columns; by shape alone without a task."""
    from gradspec.sketch import dense_kinds

    model = None
    if exact.config.get("task"):
        from gradspec.tasks import make_task

        run = exact.config.get("collect") or {}
        model = make_task(exact.config["task"], **(run.get("task_options") or {})).model
    return dense_kinds(exact.layout, model)


def dense_sigma(us: np.ndarray, width: int, k: int, seed: int, chunk: int = 4096) -> np.ndarray:
    """Top-k σ of a dense Gaussian sketch (U S) Z of the rows, Z r x width with N(0, 1/width)
    entries; Z Zᵀ accumulated over column chunks (never r x width at once)."""
    import torch

    r = us.shape[0]
    gen = torch.Generator().manual_seed(20_000 + seed)
    zz = torch.zeros((r, r), dtype=torch.float64)
    for a in range(0, width, chunk):
        z = torch.randn(r, min(chunk, width - a), generator=gen, dtype=torch.float64)
        zz.addmm_(z, z.T)
    us_t = torch.from_numpy(us)
    g = (us_t @ zz @ us_t.T).numpy() / width
    lam = np.linalg.eigvalsh((g + g.T) / 2)[::-1][:k]
    return np.sqrt(np.maximum(lam, 0.0))


def restate(spectrum: Path, s_exact: np.ndarray, top: int = 100) -> list[str]:
    """Lines comparing the stored σ, the stored statement and today's re-statement of one sketched
    spectrum with the exact σ (top ``top``: max and RMS relative error, σ₁..₁₀ RMS; coverage of
    every stated σ; median relative half-width of the top ``top``)."""
    from gradspec.sketch._bootstrap import multipliers_for, state, statement_text
    from gradspec.store import SpectrumStore

    rep = SpectrumStore.open(spectrum).accuracy["sketch"]
    mult = multipliers_for(int(rep.get("version", 2)))
    if rep.get("statement") == statement_text(**mult):  # its bias is already pooled: deriving it again would pool it twice
        raise ValueError(f"{spectrum} was stated with today's statement: nothing to re-state")
    raw, old = np.asarray(rep["sigma_raw"]), np.asarray(rep["sigma"])
    lo = np.asarray(rep["sigma_lower"])
    up = np.asarray([np.inf if x is None else x for x in rep["sigma_upper"]])
    if not np.isfinite(up).all():
        raise ValueError(f"{spectrum}: unbounded intervals carry no spread to re-state from")
    lam = raw**2
    boot = {"lam": lam, "bias": lam - old**2, "sd": (up**2 - old**2) / float(rep["z"]), "J": rep["J"],
            "replicates": rep["replicates"], "qs": np.zeros(0, dtype=np.int64), "sine_rms": np.zeros(0)}
    new = state(boot, **mult)
    t = s_exact[: lam.size]
    out = [f"  {spectrum.name}: stored statement z = {rep['z']:g}, re-stated z = {mult['multiplier']:g} (pooled bias)"]
    for name, sig, a, b in (("stored sigma", raw, None, None), ("stored statement", old, lo, up),
                            ("re-stated", np.asarray(new["sigma"]), np.asarray(new["sigma_lower"]),
                             np.asarray([np.inf if x is None else x for x in new["sigma_upper"]]))):
        e = np.abs(sig - t) / t
        line = (f"    {name:17s} top-{top} max {e[:top].max():.2%} RMS {np.sqrt(np.mean(e[:top] ** 2)):.2%}"
                f"  sigma_1..10 RMS {np.sqrt(np.mean(e[:10] ** 2)):.2%}")
        if a is not None:
            line += (f"  inside {int(np.sum((a <= t) & (t <= b)))}/{t.size}, median half-width "
                     f"{np.median(((b - a) / 2 / sig)[:top]):.2%}")
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("exact_store", type=Path)
    ap.add_argument("exact_spectrum", type=Path)
    ap.add_argument("--work", type=Path, required=True, help="scratch directory for the sketched stores")
    ap.add_argument("--M", default="16384,65536,262144")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=300)
    ap.add_argument("--keep", action="store_true", help="keep the sketched stores")
    ap.add_argument("--batch", type=int, default=32, help="rows sketched at a time (float64: 8·p bytes a row)")
    ap.add_argument("--weights", choices=("energy", "sqrt-size"), default="energy",
                    help="the plan's column split (energy: by the first 32 rows; collect's default)")
    ap.add_argument("--dense", action="store_true", help="also a dense Gaussian sketch of the same width")
    ap.add_argument("--version", type=int, choices=(2, 3, 4), default=4, help="the plan's rules")
    ap.add_argument("--gram-cache", type=Path, default=None,
                    help="--dense: keep U S of the exact Gram here (.npy), reused when it exists")
    ap.add_argument("--restate", action="store_true",
                    help="re-state the spectra of an earlier run in --work with today's statement; sketch nothing")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.restate:
        from _emit import emit  # benchmarks/_emit.py (this script's folder is on sys.path)

        from gradspec.store import SpectrumStore

        s_exact = np.asarray(SpectrumStore.open(args.exact_spectrum).sigma, dtype=np.float64)
        lines = [f"# re-stated with today's statement ({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC): "
                 f"{args.work}/spectrum-M*.zarr against {args.exact_spectrum}"]
        for m in (int(x) for x in args.M.split(",")):
            lines += restate(args.work / f"spectrum-M{m}.zarr", s_exact)
        emit(lines, args.out)
        return 0
    from gradspec.linalg import pca
    from gradspec.sketch import compare_to_exact, energy_weights, format_table, make_plan
    from gradspec.store import GradientStore, SpectrumStore

    exact = GradientStore.open(args.exact_store)
    kinds = plan_kinds(exact)
    weights = None
    if args.weights == "energy":
        import torch
        from bench_sketch_calibration import WARMUP, energies  # this script's folder is on sys.path

        first = torch.from_numpy(np.asarray(exact.read(slice(0, WARMUP)), dtype=np.float64))
        weights = energy_weights(exact.layout, energies(exact.layout, first))
    s_exact = np.asarray(SpectrumStore.open(args.exact_spectrum).sigma, dtype=np.float64)
    us = None
    if args.dense:
        from gradspec.linalg import GradientOperator

        t0 = time.perf_counter()
        if args.gram_cache is not None and args.gram_cache.is_file():
            us = np.load(args.gram_cache)
        else:
            lam, w = np.linalg.eigh(GradientOperator(args.exact_store).gram())  # float32 products, float64 sums
            us = w[:, ::-1] * np.sqrt(np.maximum(lam[::-1], 0.0))
            if args.gram_cache is not None:
                np.save(args.gram_cache, us)
        print(f"exact Gram of {exact.n_rows} rows and its eigh: {time.perf_counter() - t0:.0f} s", flush=True)
    lines = [f"# bench_sketch_spectrum: sketched vs exact spectrum of {exact.n_rows} real per-example gradients, "
             f"p = {exact.p:,}",
             "# command: python benchmarks/bench_sketch_spectrum.py " + " ".join(sys.argv[1:] if argv is None else argv),
             f"# date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
             f"{os.cpu_count()} cores; store dtype {exact.dtype}; source config: "
             f"{ {k: (exact.config.get('collect') or {}).get(k) for k in ('task', 'task_options', 'params', 'steps', 'batch_size', 'lr', 'target_epsilon')} }",
             f"# the version-{args.version} plan of `gradspec collect --sketch M` for these parameters (columns by "
             f"{args.weights}), applied to the stored rows by DenseSketch (float32); pca --method gram on the "
             "sketched store", ""]
    summary = []
    for m in (int(x) for x in args.M.split(",")):
        plan = make_plan(exact.layout, kinds, m, seed=args.seed, blocks=args.blocks, weights=weights,
                         version=args.version)
        path = args.work / f"sketch-M{m}.zarr"
        t0 = time.perf_counter()
        sk = sketch_store(exact, plan, path, batch=args.batch)
        t_sketch = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = pca(source=path, k=args.k, method="gram", out=args.work / f"spectrum-M{m}.zarr", overwrite=True)
        t_pca = time.perf_counter() - t0
        cmp = compare_to_exact(args.work / f"spectrum-M{m}.zarr", args.exact_spectrum)
        rows = cmp["rows"]
        rel = np.array([abs(r["sigma_sketch"] - r["sigma_exact"]) / r["sigma_exact"] for r in rows])
        half = np.array([np.inf if r["upper"] is None else (r["upper"] - r["lower"]) / 2 / r["sigma_sketch"]
                         for r in rows])
        top = min(100, rel.size)
        s_sk = np.array([r["sigma_sketch"] for r in rows])
        rms10 = float(np.sqrt(np.mean(((s_sk[:10] - s_exact[:10]) / s_exact[:10]) ** 2)))
        dense = (np.nan, np.nan)
        if us is not None:
            sd = dense_sigma(us, plan.M, top, args.seed)
            dense = (float(np.max(np.abs(sd - s_exact[:top]) / s_exact[:top])),
                     float(np.sqrt(np.mean(((sd[:10] - s_exact[:10]) / s_exact[:10]) ** 2))))
        summary.append((m, plan.M, sk.nbytes_on_disk(), cmp["coverage"], cmp["worst_ratio"], rel[:top].max(),
                        float(np.median(half[:top])), cmp.get("angles_hold"), t_sketch, t_pca, rms10, *dense))
        lines += [f"## M = {m:,} (stored {plan.M:,} columns, {args.blocks} blocks; sketching {t_sketch:.0f} s, "
                  f"pca {t_pca:.0f} s)", format_table(cmp, every=10), ""]
        print("\n".join(lines[-3:]), flush=True)
        del res
        if not args.keep:
            shutil.rmtree(path, ignore_errors=True)
    lines += ["## summary (top-100: max relative error of sigma, median stated relative half-width; RMS relative "
              "error of sigma_1..10; the same for a dense Gaussian sketch of the same width, and the ratios)",
              f"{'M':>8} {'stored':>8} {'store MB':>9} {'coverage':>9} {'worst':>7} {'max rel err':>12} "
              f"{'half-width':>11} {'angles ok':>10} {'sketch s':>9} {'pca s':>7} {'rms 1..10':>10} "
              f"{'dense max':>10} {'dense rms':>10} {'max/dense':>10} {'rms/dense':>10}"]
    for m, stored, nbytes, cov, worst, err, half, ang, ts, tp, rms10, dmax, drms in summary:
        mb = (nbytes or 0) / 1e6
        lines.append(f"{m:>8} {stored:>8} {mb:>9.1f} {cov:>9.3f} {worst:>7.2f} {err:>12.4f} {half:>11.4f} "
                     f"{str(ang):>10} {ts:>9.0f} {tp:>7.0f} {rms10:>10.4f} {dmax:>10.4f} {drms:>10.4f} "
                     f"{err / dmax:>10.2f} {rms10 / drms:>10.2f}")
    lines.append(f"# peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB")
    from _emit import emit  # benchmarks/_emit.py (this script's folder is on sys.path)

    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
