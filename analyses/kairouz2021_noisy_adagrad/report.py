"""The Kairouz et al. 2021 report: the excess risk over seeds per method and d, the claims judged
from it, the printed tables and the figure (`run.py` runs the grid and calls these)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from analyses._common import claims_markdown, seed_stats
from analyses.kairouz2021_noisy_adagrad.config import METHODS, Scale


def summarise(found: dict[str, Any], scale: Scale, seeds: list[int]) -> dict[str, Any]:
    """Mean, std and standard error over seeds of each metric, per method and d."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for method, by_d in found["runs"].items():
        for d, rows in by_d.items():
            entry = {}
            for metric in ("excess_risk", "heldout_risk", "theta_out_of_span_norm", "theta_norm", "opt_risk",
                           "heldout_risk_opt"):
                vals = [float(r[metric]) for r in rows]
                stats = seed_stats(vals, single=0.0)
                entry[metric] = {"mean": stats["mean"], "std": stats["std"], "se": stats["se"], "values": vals}
            entry["lr"] = found["chosen_lr"][method][d]
            entry["sigma"] = rows[0]["sigma"]
            entry["epsilon"] = [r["epsilon"] for r in rows]
            table.setdefault(method, {})[str(d)] = entry
    return table


def _fmt(e: dict[str, float]) -> str:
    return f"{e['mean']:.4f} ± {e['std']:.4f}"


def claims(table: dict[str, Any], scale: Scale, seeds: list[int]) -> list[dict[str, str]]:
    """The claim | paper | ours | reproduced? rows, judged by stated rules (2 s.e. separations)."""
    lo, hi = str(min(scale.dims)), str(max(scale.dims))
    s = len(seeds)

    def ex(m: str, d: str) -> dict[str, float]:
        return table[m][d]["excess_risk"]

    def grows(m: str) -> tuple[bool, str]:
        a, b = ex(m, lo), ex(m, hi)
        gap = b["mean"] - a["mean"]
        se = math.hypot(a["se"], b["se"])
        ratio = b["mean"] / a["mean"] if a["mean"] > 0 else float("inf")
        return gap > 2 * se, f"d={lo}: {_fmt(a)}; d={hi}: {_fmt(b)} (×{ratio:.1f}; diff {gap:.4f} ± {se:.4f} s.e.)"

    def flat(m: str) -> tuple[str, str]:
        vals = [ex(m, str(d)) for d in scale.dims]
        spread = max(v["mean"] for v in vals) - min(v["mean"] for v in vals)
        dgd = ex("dp-gd", hi)["mean"]
        text = "; ".join(f"d={d}: {_fmt(v)}" for d, v in zip(scale.dims, vals, strict=True))
        # dimension free against the ambient method: at the largest d well below DP-GD's, and its
        # growth across d much smaller
        below = ex(m, hi)["mean"] + 2 * ex(m, hi)["se"] < dgd and spread < 0.25 * (dgd - ex("dp-gd", lo)["mean"])
        # and independent of d by the 2-s.e. rule of every other claim here (review, 2026-12-04:
        # the first test alone read "yes" for growths of x2.6-3.2 at 2.5-2.9 s.e.)
        grew, growth = grows(m)
        grew_late, _ = grows_between(m, str(scale.dims[1]), hi) if len(scale.dims) > 2 else (grew, "")
        if not below:
            return "no", text
        if not grew:
            return "yes", text
        where = (f"; flat within 2 s.e. from d={scale.dims[1]} to {hi}" if not grew_late else "")
        return "partly", (f"{text}; far below ambient DP-GD ({_fmt(ex('dp-gd', hi))} at d={hi}) but grows from "
                          f"d={lo} to {hi} ({growth.split('(')[-1]}{where}")

    def grows_between(m: str, d0: str, d1: str) -> tuple[bool, str]:
        a, b = ex(m, d0), ex(m, d1)
        return b["mean"] - a["mean"] > 2 * math.hypot(a["se"], b["se"]), ""

    rows = []
    ok, text = grows("dp-gd")
    slopes = []
    for d0, d1 in zip(scale.dims, scale.dims[1:], strict=False):
        e0, e1 = ex("dp-gd", str(d0))["mean"], ex("dp-gd", str(d1))["mean"]
        if e0 > 0 and e1 > 0:
            slopes.append(f"{d0}->{d1}: {math.log(e1 / e0) / math.log(d1 / d0):.2f}")
    text += "; log-log slope " + ", ".join(slopes) + " (√d: 0.5)"
    rows.append({"claim": "ambient DP-GD's excess risk grows with d on a constrained problem",
                 "paper": "§4.2: constrained lower bound Omega(sqrt(p)/(eps n)) [BST14]; without a low-rank "
                          "preconditioner 'we recover the traditional upper bound Θ~(sqrt(p)/(eps n))'",
                 "ours": text, "reproduced": "yes" if ok else "no"})
    for m, what in (("noisy-adagrad", "noisy full-matrix AdaGrad, public subspace"),
                    ("noisy-adagrad-diag", "noisy diagonal AdaGrad, public subspace"),
                    ("pdp-gd", "PDP-GD, public subspace")):
        verdict_flat, text = flat(m)
        paper = ("Cor. 4.2: rank-k gradient subspace, gamma = O(1/(eps n)) -> excess risk "
                 "O(sqrt(log(1/delta))/(eps n)), independent of p" if m.startswith("noisy") else
                 "§4.1/[ZWB20]: (P)DP-SGD reaches the dimension-free rate in T = eps^2 n^2")
        rows.append({"claim": f"{what}: excess risk independent of d", "paper": paper, "ours": text,
                     "reproduced": verdict_flat})
    a, p = ex("noisy-adagrad", hi), ex("pdp-gd", hi)
    se = math.hypot(a["se"], p["se"])
    verdict = ("noisy AdaGrad better" if a["mean"] + 2 * se < p["mean"] else
               "noisy AdaGrad worse" if p["mean"] + 2 * se < a["mean"] else "tie within 2 s.e.")
    rows.append({"claim": "noisy AdaGrad (subspace) vs PDP-SGD at equal eps and T: a gain only if gradient "
                          "norms decay (alpha > 0); here alpha = 0 (at the constrained optimum "
                          "||grad F|| = mu R > 0), so no gain is predicted",
                 "paper": "§4.1: reaches the excess risk 'in fewer iterations than DP-SGD and PDP-SGD' when "
                          "alpha > 0 (T = (eps n)^(2/(1+2 alpha)) vs eps^2 n^2); same rate otherwise",
                 "ours": f"d={hi}: noisy AdaGrad {_fmt(a)} vs PDP-GD {_fmt(p)}: {verdict} (T={scale.steps}, "
                         f"AdaGrad's sigma {table['noisy-adagrad'][hi]['sigma']:.2f} vs "
                         f"{table['pdp-gd'][hi]['sigma']:.2f})",
                 "reproduced": "n/a (no gain predicted here; no gain seen)" if verdict != "noisy AdaGrad better"
                               else "n/a (no gain predicted here; a gain seen)"})
    if "noisy-adagrad-ambient" in table and len(table["noisy-adagrad-ambient"]) > 1:
        ds = sorted(table["noisy-adagrad-ambient"], key=int)
        a0, a1 = table["noisy-adagrad-ambient"][ds[0]]["excess_risk"], table["noisy-adagrad-ambient"][ds[-1]]["excess_risk"]
        s0 = table["noisy-adagrad"][ds[-1]]["excess_risk"]
        ok = a1["mean"] - s0["mean"] > 2 * math.hypot(a1["se"], s0["se"])
        rows.append({"claim": "without the subspace projection, noisy AdaGrad pays for d",
                     "paper": "§3.3 obs. (1): projecting H_t bounds ||B_t|| on a k- not p-dimensional "
                              "space (Lemmas C.2, B.4)",
                     "ours": f"ambient d={ds[0]}: {_fmt(a0)}; d={ds[-1]}: {_fmt(a1)} vs subspace at "
                             f"d={ds[-1]}: {_fmt(s0)}",
                     "reproduced": "yes" if ok else "no"})
    r_, pd_ = ex("rpdp-gd", hi), ex("pdp-gd", hi)
    ok = r_["mean"] - pd_["mean"] > 2 * math.hypot(r_["se"], pd_["se"])
    rows.append({"claim": "control: a random rank-k subspace does not help (the public subspace is what matters)",
                 "paper": "Thm 3.1: the gamma = ||V V^T - V~ V~^T|| term (gamma ~ 1 for a random subspace)",
                 "ours": f"d={hi}: RPDP-GD {_fmt(r_)} vs PDP-GD {_fmt(pd_)}",
                 "reproduced": "yes" if ok else "no"})
    g = [ex("gd", str(d)) for d in scale.dims]
    rows.append({"claim": "control: non-private projected GD reaches the float64 optimum (same T)",
                 "paper": "—",
                 "ours": "; ".join(f"d={d}: {_fmt(v)}" for d, v in zip(scale.dims, g, strict=True)),
                 "reproduced": "n/a (control)"})
    for row in rows:
        row["ours"] += f" [n={scale.n}, r={scale.rank}, eps={scale.epsilon}, {s} seeds, mean ± std]"
    return rows


def print_tables(table: dict[str, Any], rows: list[dict[str, str]], scale: Scale) -> str:
    lines = ["excess empirical risk L(theta) - L(theta*) (mean ± std over seeds), lr chosen on validation",
             "| method | " + " | ".join(f"d={d}" for d in scale.dims) + " |",
             "|---|" + "---|" * len(scale.dims)]
    for method in METHODS:
        cells = []
        for d in scale.dims:
            e = table.get(method, {}).get(str(d))
            cells.append("—" if e is None else f"{_fmt(e['excess_risk'])} (lr {e['lr']:g}, σ {e['sigma']:.2f})")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "norm of theta outside the data span (the noise that fills the ball)",
              "| method | " + " | ".join(f"d={d}" for d in scale.dims) + " |", "|---|" + "---|" * len(scale.dims)]
    for method in METHODS:
        cells = []
        for d in scale.dims:
            e = table.get(method, {}).get(str(d))
            cells.append("—" if e is None else _fmt(e["theta_out_of_span_norm"]))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", claims_markdown(rows)]
    text = "\n".join(lines)
    print(text)
    return text


def figure(table: dict[str, Any], scale: Scale, out: Path) -> Path:
    from gradspec.plot import plot_lines_errorbars, save_figure

    series = {m: {"x": [int(d) for d in by_d], "mean": [by_d[d]["excess_risk"]["mean"] for d in by_d],
                  "std": [by_d[d]["excess_risk"]["std"] for d in by_d]} for m, by_d in table.items() if m != "gd"}
    top = max(e["excess_risk"]["mean"] for e in table["gd"].values())
    fig = plot_lines_errorbars(series, xlabel="dimension d", ylabel="excess empirical risk (mean ± std, 3 seeds)",
                               logx=True, logy=True, mark_nonpositive=True,
                               title=f"ball-constrained logistic regression, n={scale.n}, rank {scale.rank}, "
                                     f"eps={scale.epsilon}, T={scale.steps}\n(non-private GD control: <= {top:.1e}, "
                                     "not drawn)")
    return save_figure(fig, out, "excess_risk_vs_d", formats=("png",), dpi=110)[0]

