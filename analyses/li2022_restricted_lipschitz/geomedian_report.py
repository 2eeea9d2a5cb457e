"""The Fig. 1 (generalized geometric median) report: tables of the error growth with d,
the common hyper-parameters, and the figure (`geomedian.py` runs the grid)."""

from __future__ import annotations

import math
from pathlib import Path

from analyses._common import claims_markdown, seed_stats

SPECTRA = ("const", "sqrt", "linear")
PAPER_CLAIM = {
    "const": "grows with d (Fig. 1: 'losses grow with increasing problem dimension')",
    "sqrt": "almost constant (Fig. 1: 'these losses remain almost constant')",
    "linear": "almost constant (Fig. 1: 'these losses remain almost constant')",
}


# ----------------------------------------------------------------------------- summary
def summarise(rows: list[dict], dims: list[int], metric: str) -> dict:
    """mean, std over seeds per (spectrum, private, d)."""
    out: dict = {}
    for s in SPECTRA:
        for private in (True, False):
            for d in dims:
                vals = [r[metric] for r in rows if r["spectrum"] == s and r["private"] == private and r["d"] == d]
                if vals:
                    st = seed_stats(vals, single=0.0)
                    out.setdefault(f"{s}|{'private' if private else 'nonprivate'}", {})[str(d)] = {
                        "mean": st["mean"], "std": st["std"], "n_seeds": st["n"]}
    return out


def growth(summary: dict, spectrum: str, private: bool, d_lo: int, d_hi: int) -> tuple[float, float]:
    """Ratio of mean excess loss at d_hi to d_lo and its delta-method s.e. (over seeds)."""
    cell = summary[f"{spectrum}|{'private' if private else 'nonprivate'}"]
    lo, hi = cell[str(d_lo)], cell[str(d_hi)]
    ratio = hi["mean"] / lo["mean"]
    rel = math.sqrt((hi["std"] / hi["mean"]) ** 2 / hi["n_seeds"] + (lo["std"] / lo["mean"]) ** 2 / lo["n_seeds"])
    return ratio, ratio * rel


def table(summary_emp: dict, summary_pop: dict, dims: list[int], cfg: dict) -> tuple[str, list[dict]]:
    """The claim | paper | ours | reproduced? table.

    The paper's claim (§4.1) is that for A_sqrt / A_linear the excess empirical loss "does not
    grow beyond a certain problem dimension", for A_const it grows. The verdict uses the growth
    over the last decade of d (dims[-2] -> dims[-1]): A_const reproduces if it grows > 2x (and 2
    s.e. clear of 1); A_sqrt / A_linear if they grow < 1.5x. (Criterion fixed before the d = 10^4
    numbers were seen.) The growth over the whole range (dims[0] -> dims[-1]) is reported beside it.
    """
    d_lo, d_mid, d_hi = dims[0], dims[-2], dims[-1]
    cells, rows = [], []
    for s in SPECTRA:
        g_all, se_all = growth(summary_emp, s, True, d_lo, d_hi)
        g_dec, se_dec = growth(summary_emp, s, True, d_mid, d_hi)
        g_pop_all, _ = growth(summary_pop, s, True, d_lo, d_hi)
        g_pop_dec, se_pop_dec = growth(summary_pop, s, True, d_mid, d_hi)
        g_np, _ = growth(summary_emp, s, False, d_lo, d_hi)
        ok = (g_dec > 2 and g_dec - 2 * se_dec > 1) if s == "const" else g_dec < 1.5
        verdict = "yes" if ok else "no"
        cell = summary_emp[f"{s}|private"]
        values = ", ".join(f"{cell[str(d)]['mean']:.2g}" for d in dims)
        ours = (f"emp.: x{g_dec:.2f} ± {se_dec:.2f} over d = {d_mid} -> {d_hi}; x{g_all:.0f} ± {se_all:.0f} over "
                f"{d_lo} -> {d_hi} (means {values}); pop.: x{g_pop_dec:.2f} ± {se_pop_dec:.2f} / "
                f"x{g_pop_all:.0f}; non-private: x{g_np:.2f}")
        claim = f"A_{s}: excess loss vs d (eps = {cfg['epsilon']:g})"
        cells.append((claim, PAPER_CLAIM[s], ours, verdict))
        rows.append({"spectrum": s, "claim": claim, "paper": PAPER_CLAIM[s],
                     "growth_emp_last_decade": g_dec, "growth_emp_last_decade_se": se_dec,
                     "growth_emp": g_all, "growth_emp_se": se_all, "growth_pop": g_pop_all,
                     "growth_pop_last_decade": g_pop_dec, "growth_nonprivate": g_np, "reproduced": verdict})
    foot = (f"\nmean ± std over seeds {cfg['seeds']} (growth s.e. by the delta method); n = {cfg['n']}, "
            f"T = {cfg['steps']} steps of B = {cfg['batch_size']}, sigma = {cfg['sigma']:.4f} (replace-one "
            f"eps = {cfg['epsilon']:g}, delta = {cfg['delta']:g}), averaged iterate, lr and alpha chosen per "
            f"(A, d) on a validation draw. Verdict on the last decade: A_const grows > 2x; A_sqrt / A_linear "
            f"< 1.5x ('does not grow beyond a certain problem dimension', §4.1).")
    return claims_markdown(cells) + foot, rows


def per_d_table(summaries: dict, dims: list[int]) -> str:
    """Excess losses (mean ± std over seeds) for every A, d, privacy level and iterate."""
    lines = ["| A | privacy | iterate | " + " | ".join(f"d = {d}: emp. / pop." for d in dims) + " |",
             "|---|---|---|" + "---|" * len(dims)]
    for s in SPECTRA:
        for priv in ("private", "nonprivate"):
            for it, (ke, kp) in (("averaged", ("emp", "pop")), ("last", ("emp_last", "pop_last"))):
                cells = []
                for d in dims:
                    e, p = summaries[ke][f"{s}|{priv}"][str(d)], summaries[kp][f"{s}|{priv}"][str(d)]
                    cells.append(f"{e['mean']:.2e} ± {e['std']:.0e} / {p['mean']:.2e} ± {p['std']:.0e}")
                lines.append(f"| A_{s} | {'eps = 2' if priv == 'private' else 'non-private'} | {it} | "
                             + " | ".join(cells) + " |")
    return "\n".join(lines)


def common_hyperparameters(validation: list[dict], dims: list[int]) -> tuple[str, dict]:
    """Supplement (validation draw only, one seed): one (lr, alpha) per A for every d -- the grid
    point best at the largest d -- instead of a choice per (A, d), as "the same hyperparameters"
    of the paper's caption may mean. Returns a markdown table and the numbers."""
    out: dict = {}
    lines = [f"| A | (lr, alpha) best at d = {dims[-1]} | " + " | ".join(f"d = {d}" for d in dims)
             + " | growth first -> last d | growth over last decade |", "|---|---|" + "---|" * (len(dims) + 2)]
    for s in SPECTRA:
        grid: dict = {}
        for r in validation:
            if r["spectrum"] == s and r["private"]:
                grid.setdefault((r["lr"], r["alpha"]), {})[r["d"]] = r["excess_emp_avg"]
        full = {k: v for k, v in grid.items() if all(d in v for d in dims)}
        if not full:
            continue
        best = min(full, key=lambda k: full[k][dims[-1]])
        vals = full[best]
        out[s] = {"lr": best[0], "alpha": best[1], "excess": {str(d): vals[d] for d in dims}}
        lines.append(f"| A_{s} | ({best[0]:g}, {best[1]:g}) | " + " | ".join(f"{vals[d]:.3g}" for d in dims)
                     + f" | x{vals[dims[-1]] / vals[dims[0]]:.1f} | x{vals[dims[-1]] / vals[dims[-2]]:.2f} |")
    return "\n".join(lines), out


def render(results: dict, out: Path) -> dict:
    """Summaries, tables and the figure from the per-run rows of a results dict (also used to
    re-render a saved results.json with ``--from-results``)."""
    cfg, rows = results["config"], results["runs"]
    dims = sorted({r["d"] for r in rows})
    summaries = {"emp": summarise(rows, dims, "excess_emp_avg"),
                 "pop": summarise(rows, dims, "excess_pop_avg"),
                 "emp_last": summarise(rows, dims, "excess_emp_last"),
                 "pop_last": summarise(rows, dims, "excess_pop_last")}
    text, table_rows = table(summaries["emp"], summaries["pop"], dims, cfg)
    plot(summaries, dims, out / "fig1_excess_loss_vs_d.png")
    chosen = sorted({(r["spectrum"], r["private"], r["d"], r["lr"], r["alpha"]) for r in rows})
    common_text, common = common_hyperparameters(results["validation"], dims)
    text += ("\n\nSupplement, validation draw only (one seed, empirical excess loss of the averaged "
             "iterate): one (lr, alpha) per A for all d, the grid point best at the largest d:\n\n" + common_text)
    return {**results, "summary": summaries, "table": table_rows, "common_hyperparameters": common,
            "chosen": [dict(zip(("spectrum", "private", "d", "lr", "alpha"), c, strict=True)) for c in chosen],
            "table_markdown": text + "\n\nExcess losses, mean ± std over seeds:\n\n" + per_d_table(summaries, dims)}


def plot(summaries: dict[str, dict], dims: list[int], path: Path) -> None:
    from matplotlib.figure import Figure

    from gradspec.plot import plot_lines_errorbars, save_figure

    fig = Figure(figsize=(10, 3.8))
    for k, (metric, title) in enumerate((("emp", "(a) excess empirical loss"),
                                         ("pop", "(b) excess population loss"))):
        ax = fig.add_subplot(1, 2, k + 1)
        series = {}
        for color, s in zip(("C0", "C1", "C2"), SPECTRA, strict=True):
            for private, style in ((True, "-"), (False, ":")):
                cell = summaries[metric][f"{s}|{'private' if private else 'nonprivate'}"]
                label = f"A_{s}" + ("" if private else " (non-private)")
                series[label] = {"x": dims, "mean": [cell[str(d)]["mean"] for d in dims],
                                 "std": [cell[str(d)]["std"] for d in dims], "linestyle": style,
                                 "color": color}
        plot_lines_errorbars(series, ax=ax, xlabel="dimension d", ylabel="excess loss", title=title,
                             logx=True, logy=True)
    fig.tight_layout()
    save_figure(fig, path.parent, path.stem, formats=("png",), dpi=110)

