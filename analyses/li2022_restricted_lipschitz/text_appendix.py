"""Li et al. 2022 text experiment, stage ``appendix``: Fig. 2a, App. B (Figs. 3–5) and the
Theorem 3.3/3.5 bounds on the measured Ĝ_k, all from H·Hᵀ (``gram.npy``, written by stage
``pca`` of `text.py`): a row subset's spectrum is a principal sub-block, the paper's orthogonal
iteration runs on a factor A with A·Aᵀ = H·Hᵀ, and principal angles need only H_a·H_bᵀ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from analyses.li2022_restricted_lipschitz.text_scale import Scale


def _fit(sigma: np.ndarray, k_max: int, scale: str = "singular") -> dict[str, Any]:
    """Power-law fit of σ_k (or of σ_k² with ``scale="eigen"``: exponent 2c) over ranks 1..k_max."""
    from gradspec.spectrum import fit_spectrum

    f = fit_spectrum(sigma, k_range=(1, int(k_max)), scale=scale)
    return {"c": float(f.c), "a": float(f.a), "r2": float(f.r2), "ci": [float(x) for x in f.ci], "stderr": float(f.stderr),
            "k_range": [1, int(k_max)], "object": f}


def _angles(g_ab: np.ndarray, ua, sa, ub, sb, ks) -> dict[str, Any]:
    from gradspec.spectrum import gram_subspace_cosines

    out = {}
    for k in ks:
        if k > min(ua.shape[1], ub.shape[1]):
            continue
        cos = gram_subspace_cosines(g_ab, ua[:, :k], sa[:k], ub[:, :k], sb[:k])
        ang = np.degrees(np.arccos(cos))
        out[str(k)] = {"max_angle_deg": float(ang.max()), "median_angle_deg": float(np.median(ang)),
                       "mean_cos2": float(np.mean(cos**2))}
    return out


def run_appendix(scale: Scale, out: Path, figures: Path) -> dict[str, Any]:
    """Fig. 2a and App. B (Figs. 3–5) from H·Hᵀ; G_k and the Theorem 3.3/3.5 bounds."""
    from gradspec.linalg import GradientOperator, orthogonal_iteration
    from gradspec.plot import plot_spectrum, save_figure
    from gradspec.spectrum import gram_eigh

    g = np.load(out / "gram.npy")
    r = g.shape[0]
    sigma, u = gram_eigh(g)
    frob2 = float(np.trace(g))
    half = max(2, r // 2)
    res: dict[str, Any] = {"r": r}
    fig2a = _fit(sigma, half)
    res["fig2a"] = {"sigma": sigma, "fit_top_half": {k: v for k, v in fig2a.items() if k != "object"},
                    "fit_all": {k: v for k, v in _fit(sigma, r).items() if k != "object"},
                    "energy_top_k": {str(k): float((sigma[:k] ** 2).sum() / frob2)
                                     for k in (1, 10, 20, 100, 1000) if k <= r}}
    fig = plot_spectrum({f"H ({r} steps)": sigma}, fits={f"H ({r} steps)": fig2a["object"]},
                        title="Fig. 2a: singular values of the average clipped gradients")
    save_figure(fig, figures, "fig2a_spectrum", formats=("png",))

    # Fig. 3: orthogonal iteration after T iterations vs exact, on the factor A (A·Aᵀ = H·Hᵀ)
    kb = min(scale.appb_k, r // 4)  # the paper: top 500 of r = 4000; a block near r converges trivially
    snaps: dict[int, Any] = {}
    iters = sorted(scale.iters)

    def keep(state: Any) -> None:
        if state.iteration in iters:
            snaps[state.iteration] = (np.sqrt(np.maximum(state.theta[:kb], 0.0)), state.u[:, :kb].copy(),
                                      float(state.resid[:kb].max()))

    orthogonal_iteration(GradientOperator(u * sigma), k=kb, iters=iters[-1], oversample=10, seed=0,
                         on_iteration=keep)
    fig3 = {"k": kb, "exact_fit": {k: v for k, v in _fit(sigma[:kb], kb).items() if k != "object"}}
    spectra, fits = {"exact": sigma[:kb]}, {"exact": _fit(sigma[:kb], kb, "eigen")["object"]}
    for t in iters:
        s_t, u_t, resid = snaps[t]
        f = _fit(s_t, kb)
        fig3[f"T={t}"] = {"fit": {k: v for k, v in f.items() if k != "object"},
                          "max_rel_sigma_error": float(np.max(np.abs(s_t - sigma[:kb]) / sigma[:kb])),
                          "max_ritz_residual": resid,
                          "angles_vs_exact": _angles(g, u_t, s_t, u, sigma, scale.angle_ks)}
        spectra[f"T={t}"], fits[f"T={t}"] = s_t, _fit(s_t, kb, "eigen")["object"]
    for t_a, t_b in zip(iters[:-1], iters[1:], strict=True):
        s_a, u_a, _ = snaps[t_a]
        s_b, u_b, _ = snaps[t_b]
        fig3[f"angles_T={t_a}_vs_T={t_b}"] = _angles(g, u_a, s_a, u_b, s_b, scale.angle_ks)
    res["fig3"] = fig3
    fig = plot_spectrum(spectra, fits=fits, scale="eigen", title="Fig. 3: orthogonal iterations T vs exact")
    save_figure(fig, figures, "fig3_iterations", formats=("png",))

    # Figs. 4 and 5: row subsets, each from its principal sub-block of H·Hᵀ
    def subset(a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        idx = np.arange(a, min(b, r))
        s_, u_ = gram_eigh(g[np.ix_(idx, idx)])
        return idx, s_, u_

    a0, b0 = scale.rows_small
    a1, b1 = scale.rows_late
    if b0 >= r:  # a stopped collection: keep the paper's proportions (r/2 rows first, offset r·3/13)
        b0 = r * 10 // 13
    if b1 > r:
        a1, b1 = r - (b0 - a0), r
    i_small, s_small, u_small = subset(a0, b0)
    i_late, s_late, u_late = subset(a1, b1)
    kf = min(scale.appb_k, len(i_small) // 2)
    comps = {
        "fig4": (f"rows {a0}:{b0} (r={b0 - a0})", s_small, u_small, i_small,
                 f"all rows (r={r})", sigma, u, np.arange(r)),
        "fig5": (f"rows {a0}:{b0}", s_small, u_small, i_small, f"rows {a1}:{b1}", s_late, u_late, i_late),
    }
    for name, (la, sa, ua, ia, lb, sb, ub, ib) in comps.items():
        fa, fb = _fit(sa, kf), _fit(sb, kf)
        res[name] = {"a": la, "b": lb, "k_fit": kf,
                     "fit_a": {k: v for k, v in fa.items() if k != "object"},
                     "fit_b": {k: v for k, v in fb.items() if k != "object"},
                     "angles": _angles(g[np.ix_(ia, ib)], ua, sa, ub, sb, scale.angle_ks)}
        fig = plot_spectrum({la: sa[:kf], lb: sb[:kf]},
                            fits={la: _fit(sa, kf, "eigen")["object"], lb: _fit(sb, kf, "eigen")["object"]},
                            scale="eigen", title=f"{'Fig. 4' if name == 'fig4' else 'Fig. 5'}: {la} vs {lb}")
        save_figure(fig, figures, f"{name}_rows", formats=("png",))
    return res


def run_bounds(scale: Scale, out: Path, figures: Path, p: int, n: int, delta: float) -> dict[str, Any]:
    """Ĝ_k (Definition 3.1) and Theorems 3.3/3.5 at their best k (constants 1, D = 1).

    Two measurements: ``in_sample``, the rows against the top-k subspace of all rows
    (Ĝ_r = 0: every row lies in the span of all rows, so the bound's best k is r, an
    artefact), and ``heldout``, the last quarter of the steps against the subspace of
    the first three quarters, which the bound's hypothesis (a subspace that serves
    gradients it was not computed from) is about.
    """
    from gradspec.plot import plot_lipschitz, save_figure
    from gradspec.spectrum import (
        gram_eigh,
        heldout_projections_from_gram,
        rank_grid,
        restricted_lipschitz,
        restricted_lipschitz_bound,
        row_projections_from_gram,
    )

    g = np.load(out / "gram.npy")
    r = g.shape[0]
    sigma, u = gram_eigh(g)
    r_fit = r * 3 // 4
    curves = {
        f"in sample (rows 0:{r})": restricted_lipschitz(
            row_projections_from_gram(g, rank_grid(r), sigma=sigma, u=u),
            source={"rows": f"0:{r}", "subspace": f"top-k of rows 0:{r}"}),
        f"held out (rows {r_fit}:{r} vs subspace of 0:{r_fit})": restricted_lipschitz(
            heldout_projections_from_gram(g, np.arange(r_fit), np.arange(r_fit, r), rank_grid(r_fit)),
            source={"rows": f"{r_fit}:{r}", "subspace": f"top-k of rows 0:{r_fit}"}),
    }
    res: dict[str, Any] = {"settings": {"n": n, "epsilon": scale.epsilon, "delta": delta,
                                        "diameter": 1.0, "dim": p, "tail": "hold"}}
    for (label, G), key in zip(curves.items(), ("in_sample", "heldout"), strict=True):
        entry: dict[str, Any] = {"label": label, "ks": G.ks, "G_max": G.max, "G_p50": G.quantiles.get("p50")}
        for theorem, population in (("3.3", False), ("3.5", True)):
            b = restricted_lipschitz_bound(ks=G.ks, G=G.max, n=n, epsilon=scale.epsilon, delta=delta,
                                           diameter=1.0, dim=p, population=population, tail="hold")
            entry[theorem] = {"k_star": int(b.k_star), "bound": float(b.bound),
                              "dimension_dependent": float(b.dimension_dependent),
                              "ratio_to_dimension_dependent": float(b.bound / b.dimension_dependent),
                              "hypotheses": b.hypotheses, "k": b.k, "total": b.total}
        res[key] = entry
    fig = plot_lipschitz(curves, title="Ĝ_k = max_i ‖(I − P_k) g_i‖")
    save_figure(fig, figures, "G_k", formats=("png",))
    return res
