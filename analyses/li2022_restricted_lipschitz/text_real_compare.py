"""Fig. 2a and 2b across the real-text tasks: how the spectrum and the top-k gap move with n
(issue 23).

Run: ``python -m analyses.li2022_restricted_lipschitz.text_real_compare RUN_DIR [RUN_DIR ...]
--out DIR``, where each ``RUN_DIR`` is a ``text_real`` run whose ``fig2a`` stage is done
(``gram.npy`` and ``collect/``). Writes ``fig2a_by_n.png`` (the spectra on one log–log plot,
each divided by its ‖H‖_F so the slopes compare) and ``fig2a_by_n.md`` / ``.json``: per run
the private n, r, the power-law exponent over ranks 1..r/2 with its 95% CI and R², the share
of ‖H‖_F² in the top 10/100/1000 directions and the collection's held-out accuracy.

Runs whose ``report`` stage is done (``results.json`` with retraining arms) also go into
``fig2b_by_n.md`` / ``.json``: per run and rank k, full DP-SGD, top-k, the paired gap
full − top-k with twice its standard error over seeds, the share of DP-SGD's gain over the
untrained model that top-k recovers, random-k and complement-k, and non-private — the
question being whether the gap closes as n grows at fixed ε.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from analyses._common import json_safe
from analyses.li2022_restricted_lipschitz.text_appendix import _fit
from analyses.li2022_restricted_lipschitz.text_real_report import (
    acc_text,
    gain_share,
    paired_text,
    two_standard_errors,
)
from analyses.li2022_restricted_lipschitz.text_scale import final_eval

ENERGY_RANKS = (10, 100, 1000)


def _private_n(run: Path) -> int:
    """The private training examples of the run's collection, as its gradient store records."""
    from gradspec.store import GradientStore

    splits = (GradientStore.open(run / "collect" / "gradients.zarr").config.get("task_config") or {}).get("splits") or {}
    if "n_train" not in splits:
        raise SystemExit(f"{run}: the gradient store records no task split (n_train): not a gradspec collect run?")
    return int(splits["n_train"])


def spectrum_row(run: Path, n: int | None = None) -> dict[str, Any]:
    """The comparison's numbers for one run; ``n`` (the private examples) is read from the
    run's gradient store when not given."""
    from gradspec.spectrum import gram_eigh

    gram_path = run / "gram.npy"
    if not gram_path.is_file():
        raise SystemExit(f"{run}: no gram.npy; run its pca and fig2a stages first")
    g = np.load(gram_path)
    r = g.shape[0]
    sigma, _ = gram_eigh(g)
    frob = float(np.sqrt(np.trace(g)))
    fit = _fit(sigma / frob, max(2, r // 2))
    return {"run": run.name, "n": _private_n(run) if n is None else n, "r": r,
            "fit": {k: v for k, v in fit.items() if k != "object"}, "fit_object": fit["object"],
            "sigma_over_frob": sigma / frob,
            "energy_top_k": {k: float((sigma[:k] ** 2).sum() / frob**2) for k in ENERGY_RANKS if k <= r},
            "collect": final_eval(run / "collect")}


def table_markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| run | private n | r | σ_k ∝ k^-c: c (95% CI), ranks 1..r/2 | R² | "
            + " | ".join(f"top-{k} share of ‖H‖_F²" for k in ENERGY_RANKS) + " | collection held-out |")
    lines = [head, "|" + "---|" * (6 + len(ENERGY_RANKS))]
    for row in sorted(rows, key=lambda x: x["n"]):
        f, e = row["fit"], row["energy_top_k"]
        acc = row["collect"].get("eval_accuracy")
        lines.append(f"| {row['run']} | {row['n']:,} | {row['r']:,} | {f['c']:.3f} ({f['ci'][0]:.3f}–{f['ci'][1]:.3f}) "
                     f"| {f['r2']:.3f} | " + " | ".join(f"{e[k]:.2f}" if k in e else "—" for k in ENERGY_RANKS)
                     + f" | {'—' if acc is None else f'{acc:.3f}'} |")
    return "\n".join(lines)


def fig2b_rows(run: Path, n: int) -> list[dict[str, Any]]:
    """One row per rank k with a top-k arm in the run's ``results.json``; [] when the run has
    no report (or no retraining in it) yet."""
    path = run / "results.json"
    if not path.is_file():
        return []
    try:
        results = json.loads(path.read_text())
        arms, paired, scale = results["retrain"]["arms"], results["retrain"]["paired"], results["scale"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"{path}: not a text_real report ({type(exc).__name__}: {exc}); rerun its report stage") from None
    rows = []
    for k in scale["ranks"]:
        key = f"topk-k{k}"
        if key not in arms:
            continue
        gap = (paired.get(key) or {}).get("dpsgd") or {"n": 0}
        rows.append({"run": run.name, "n": n, "steps": scale["retrain_steps"], "batch": scale["retrain_batch"],
                     "epsilon": scale.get("epsilon"), "k": k, "gap": gap.get("mean"), "gap_two_se": two_standard_errors(gap),
                     "gap_seeds": gap["n"], "gain_share": gain_share(arms, key),
                     "text": {name: acc_text(arms, name) for name in
                              ("dpsgd", key, f"random-k{k}", f"complement-k{k}", "nonprivate", "untrained")},
                     "gap_text": paired_text(gap)[0]})
    return rows


def fig2b_markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| run | private n | steps × batch | k | full DP-SGD | top-k | full − top-k (paired) | "
            "top-k's share of DP-SGD's gain | random-k | complement-k | non-private |")
    lines = [head, "|" + "---|" * 11]
    for row in sorted(rows, key=lambda x: (x["k"], x["n"])):
        t, k = row["text"], row["k"]
        share = "—" if row["gain_share"] is None else f"{row['gain_share']:.0%}"
        lines.append(f"| {row['run']} | {row['n']:,} | {row['steps']:,} × {row['batch']} | {k} | {t['dpsgd']} | "
                     f"{t[f'topk-k{k}']} | {row['gap_text']} | {share} | {t[f'random-k{k}']} | "
                     f"{t[f'complement-k{k}']} | {t['nonprivate']} |")
    return "\n".join(lines)


def compare(runs: list[Path], out: Path) -> list[dict[str, Any]]:
    """The table and the figure for ``runs``, written under ``out``."""
    from gradspec.plot import plot_spectrum, save_figure

    rows = [spectrum_row(run) for run in runs]
    label = {row["run"]: f"{row['run']} (n = {row['n']:,})" for row in rows}
    fig = plot_spectrum({label[r["run"]]: r["sigma_over_frob"] for r in rows},
                        fits={label[r["run"]]: r["fit_object"] for r in rows},
                        title="Fig. 2a by private n: σ_k / ‖H‖_F of the\naverage clipped gradients")
    fig.axes[0].set_ylabel("σ_k / ‖H‖_F")
    out.mkdir(parents=True, exist_ok=True)
    save_figure(fig, out, "fig2a_by_n", formats=("png",))
    md = table_markdown(rows)
    (out / "fig2a_by_n.md").write_text(md + "\n")
    keep = [{k: v for k, v in row.items() if k not in ("fit_object", "sigma_over_frob")} for row in rows]
    (out / "fig2a_by_n.json").write_text(json.dumps(json_safe(keep), indent=2))
    print(md)
    fig2b = [row for run, r in zip(runs, rows, strict=True) for row in fig2b_rows(run, r["n"])]
    if fig2b:
        md2 = fig2b_markdown(fig2b)
        (out / "fig2b_by_n.md").write_text(md2 + "\n")
        (out / "fig2b_by_n.json").write_text(json.dumps(json_safe(fig2b), indent=2))
        print(md2)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analyses.li2022_restricted_lipschitz.text_real_compare",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="text_real run directories (fig2a stage done)")
    ap.add_argument("--out", type=Path, required=True, help="where the figure and the table go")
    args = ap.parse_args(argv)
    compare(args.runs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
