"""The stated error of pca on a sketched store (issue 22): the true σ of H lie inside the
stated intervals, the true subspace angles below the stated bounds, the intervals shrink like
1/√M, and an unsketched store's pca is as before.

Cases (``sketch_cases``): flat, power-law k^-0.6 and k^-1 and exactly low-rank spectra of a
synthetic H (σ_1 = 1), sketched by a dense Gaussian J-block S; every case goes through a real
GradientStore and ``pca(method="gram")``. The reference σ and U are numpy's float64 SVD of H.
``WORST`` collects the worst ratio of true error to stated error (≤ 1: the statement held);
the sweeps measured at most 0.83 (σ) and 0.54 (angles) with the first-order multiplier at
1.25, before it was raised to 1.5 (gradspec/sketch/_error.py).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from gradspec.linalg import pca
from gradspec.linalg._sketch import SketchGram
from gradspec.sketch import (
    compare_to_exact,
    format_table,
    principal_sines,
    sketch_error,
    sketch_selection,
)
from gradspec.store import SpectrumStore
from tests.sketch.sketch_cases import SketchCase, write_sketched

R, P, K = 100, 10_000, 40
KINDS = ("flat", "power06", "power1", "lowrank")
#: Through a real store and pca: every spectrum with an explicit dense S at M = 2^12, J = 4,
#: and J = 2 and 8 with exact columns; M = 2^14 with S·V drawn directly (the same distribution).
CASES = [
    *(SketchCase(kind, R, P, 2**12, 4, seed=0) for kind in KINDS),
    SketchCase("power1", R, P, 2**12, 2, seed=1, n_exact=37),
    SketchCase("power06", R, P, 2**10, 8, seed=2, n_exact=100),
    SketchCase("lowrank", R, P, 2**14, 2, seed=3, explicit=False),
]
#: Worst ratio of true error to stated error seen by any test of this module (for the report).
WORST: dict[str, float] = {"sigma": 0.0, "angle": 0.0}


@functools.cache
def _truth(case: SketchCase) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    h = case.matrix()
    u, s, _ = np.linalg.svd(h, full_matrices=False)
    y, attr = case.sketch(h)
    return s, u, y, attr


def _run(case: SketchCase, tmp_path, **kw):
    s, u, y, attr = _truth(case)
    write_sketched(tmp_path / "g.zarr", y, attr, cols_per_chunk=700)
    k = min(K, int((s > 1e-8).sum()))
    return s, u, pca(source=tmp_path / "g.zarr", k=k, method="gram", kernel="numpy-syrk", **kw)


def _check_holds(s: np.ndarray, u: np.ndarray, rep: dict, uh: np.ndarray) -> tuple[float, float]:
    """Assert that every true σ_i lies in its interval and every true angle below its bound;
    -> (worst σ ratio, worst angle ratio), a ratio being true error / stated error."""
    k = rep["k"]
    sh = np.asarray(rep["sigma"])
    lo = np.asarray(rep["sigma_lower"])
    up = np.array([np.inf if x is None else x for x in rep["sigma_upper"]])
    t = s[:k]
    outside = np.flatnonzero((t < lo) | (t > up))
    assert outside.size == 0, f"sigma_{outside[0] + 1} = {t[outside[0]]} outside [{lo[outside[0]]}, {up[outside[0]]}]"
    side = np.where(t < sh, sh - lo, up - sh)
    ratio = float(np.max(np.abs(t - sh) / side))
    worst_angle = 0.0
    assert rep["angles"], "no subspace bound stated"
    for a in rep["angles"]:
        true = principal_sines(u[:, : a["k"]], uh[:, : a["k"]])
        assert true <= a["bound"] + 1e-12, f"k={a['k']}: sin of the true angle {true} > stated {a['bound']}"
        if not a["vacuous"]:
            worst_angle = max(worst_angle, true / max(a["bound"], 1e-300))
    WORST["sigma"] = max(WORST["sigma"], ratio)
    WORST["angle"] = max(WORST["angle"], worst_angle)
    return ratio, worst_angle


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_true_spectrum_inside_the_stated_error(case, tmp_path):
    s, u, res = _run(case, tmp_path, verify="none")
    rep = res.accuracy()["sketch"]
    assert rep["M"] == case.n_exact + case.M and rep["J"] == case.J and rep["p"] == case.p
    assert rep["k"] == res.k and rep["right_vectors"] == "sketch space"
    assert res.params["right_vectors"] == "sketch space"
    # the report's σ are pca's (the same Gram), to its float32 products
    np.testing.assert_allclose(rep["sigma"], res.sigma, rtol=1e-4)
    _check_holds(s, u, rep, res.U)
    if case.kind == "lowrank":  # the rank-r_H subspace is the range of H, exactly
        at_rank = [a for a in rep["angles"] if a["exact_rank"]]
        assert at_rank and at_rank[0]["bound"] < 1e-2  # float32 products' rounding only


def test_intervals_shrink_like_one_over_root_m(tmp_path):
    """The top σ of a decaying spectrum: half-width ~ 1/√M (16× the columns: ~4× narrower)."""
    widths = []
    for M in (2**10, 2**14):
        case = SketchCase("power1", R, 3000, M, 4, seed=5, explicit=False)
        s, u, y, attr = _truth.__wrapped__(case)
        rep = sketch_error(*_block_grams(y, attr), k=10)
        widths.append(np.median(rep["relative_half_width"][:5]))
    assert 2.5 < widths[0] / widths[1] < 6.5, widths
    # and its size: z·(1/√(2M))-ish at the top, well under 10% at M = 2^14
    assert widths[1] < 0.05


def _block_grams(y: np.ndarray, attr: dict) -> tuple[list[np.ndarray], np.ndarray | None]:
    grams = [y[:, a:b] @ y[:, a:b].T for [[a, b]] in attr["blocks"]]
    ex = attr["exact"]
    return grams, (y[:, ex[0][0]:ex[0][1]] @ y[:, ex[0][0]:ex[0][1]].T if ex else None)


def _sweep(kind: str, seeds: range, r: int, p: int) -> None:
    for seed in seeds:
        for J in (2, 4, 8):
            for M in (2**10, 2**12, 2**14):
                case = SketchCase(kind, r, p, M, J, seed=100 + seed, explicit=False)
                s, u, y, attr = _truth.__wrapped__(case)  # not kept: many cases
                grams, ex = _block_grams(y, attr)
                k = min(30, int((s > 1e-8).sum()))
                rep = sketch_error(grams, ex, k=k)
                uh = np.linalg.eigh(np.sum(grams, axis=0))[1][:, ::-1]
                _check_holds(s, u, rep, uh)


@pytest.mark.parametrize("kind", KINDS)
def test_coverage_over_seeds_and_block_counts(kind):
    """The statement itself (block Grams, no store): J ∈ {2, 4, 8} × M ∈ {2^10, 2^12, 2^14},
    r = 80 (the slow sweep below adds seeds at r = 200)."""
    _sweep(kind, range(1), 80, 3000)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_coverage_sweep_large(kind):
    """As above with r = 200 and 6 more seeds."""
    _sweep(kind, range(1, 7), 200, 8000)


def test_sketch_gram_splits_panels_at_block_boundaries(tmp_path):
    """Blocks of 333 columns, chunks of 700 (panels straddle blocks): each block Gram is Y_j·Y_jᵀ."""
    case = SketchCase("power1", 30, 2000, 999, 3, seed=4, n_exact=17)
    h = case.matrix()
    y, attr = case.sketch(h)
    write_sketched(tmp_path / "g.zarr", y, attr, cols_per_chunk=700)
    from gradspec.linalg import GradientOperator

    op = GradientOperator(tmp_path / "g.zarr", precision="float64", kernel="numpy-syrk", block_cols=700)
    op.panel_cols = 256
    plan = sketch_selection(attr, [(0, y.shape[1])], y.shape[1])
    consumer = SketchGram(op, plan)
    g = op.fused([consumer])[0]
    grams, exact = consumer.blocks()
    y32 = y.astype(np.float32).astype(np.float64)
    want, want_exact = _block_grams(y32, attr)
    for got, ref in zip(grams, want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(exact, want_exact, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, y32 @ y32.T, rtol=1e-10, atol=1e-12)


def test_plan_maps_blocks_and_refuses_a_bad_attribute():
    attr = {"kind": "x", "version": 1, "seed": 0, "M": 10, "p": 100,
            "blocks": [[[2, 4], [6, 8]], [[4, 6], [8, 10]]], "exact": [[0, 2]]}
    plan = sketch_selection(attr, [(0, 10)], 10)
    assert plan.whole and plan.J == 2 and plan.exact_cols == 2
    assert plan.segments == ((0, 2, 2), (2, 4, 0), (4, 6, 1), (6, 8, 0), (8, 10, 1))
    part = sketch_selection(attr, [(2, 4), (6, 8)], 10)  # block 0 alone: no error stated
    assert not part.whole and part.blocks_selected == 1
    assert sketch_selection(attr, [(0, 2)], 10) is None  # exact columns only: a plain H
    with pytest.raises(ValueError, match="J >= 2"):
        sketch_selection({**attr, "blocks": [[[2, 10]]]}, [(0, 10)], 10)
    with pytest.raises(ValueError, match="overlap"):
        sketch_selection({**attr, "exact": [[0, 3]]}, [(0, 10)], 10)
    with pytest.raises(ValueError, match="version"):
        sketch_selection({**attr, "version": 5}, [(0, 10)], 10)


def test_spectrum_store_report_cli_line_and_compare_to_exact(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    case = SketchCase("power1", 60, 4000, 2**11, 4, seed=6, n_exact=10)
    h = case.matrix()
    y, attr = case.sketch(h)
    write_sketched(tmp_path / "sk.zarr", y, attr)
    write_sketched(tmp_path / "ex.zarr", h, None, cols_per_chunk=1000)
    out = CliRunner().invoke(app, ["pca", str(tmp_path / "sk.zarr"), "--k", "12", "--out",
                                   str(tmp_path / "sk-spec.zarr"), "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "sketch: M=2058 J=4 p=4000: sigma_1 within ±" in out.output and "sketch space" in out.output
    assert "method=gram (a sketched store" in out.output
    saved = SpectrumStore.open(tmp_path / "sk-spec.zarr")
    rep = saved.accuracy["sketch"]
    assert len(rep["sigma_lower"]) == saved.k == 12 and rep["statement"]
    assert saved.params["right_vectors"] == "sketch space" and saved.params["sketch"]["J"] == 4
    pca(source=tmp_path / "ex.zarr", k=12, method="gram", out=tmp_path / "ex-spec.zarr")
    cmp = compare_to_exact(tmp_path / "sk-spec.zarr", tmp_path / "ex-spec.zarr")
    assert cmp["coverage"] == 1.0 and cmp["worst_ratio"] <= 1.0 and cmp["angles_hold"]
    assert "coverage 1.000" in format_table(cmp)


def test_other_methods_refuse_and_unsketched_stores_are_unchanged(tmp_path):
    case = SketchCase("power1", 40, 3000, 2**10, 2, seed=7)
    h = case.matrix()
    y, attr = case.sketch(h)
    write_sketched(tmp_path / "sk.zarr", y, attr)
    with pytest.raises(ValueError, match="use --method gram"):
        pca(source=tmp_path / "sk.zarr", k=5, method="krylov")
    m = attr["M"] // case.J  # block 0 alone: a spectrum at another scale, refused
    with pytest.raises(ValueError, match="1 of the 2 sketch blocks"):
        pca(source=tmp_path / "sk.zarr", k=5, method="gram", col_ranges=[(0, m)])
    write_sketched(tmp_path / "plain.zarr", y, None)
    plain = pca(source=tmp_path / "plain.zarr", k=5, method="gram")
    sk = pca(source=tmp_path / "sk.zarr", k=5, method="gram")
    assert "sketch" not in plain.accuracy() and "right_vectors" not in plain.params
    assert "sketch" not in plain.params
    # the same numbers: the block Grams sum to the Gram
    np.testing.assert_allclose(sk.sigma, plain.sigma, rtol=1e-6)
    assert principal_sines(plain.U, sk.U) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flat", "power06", "power1", "lowrank"])
def test_explicit_sketch_at_large_m(kind, tmp_path):
    """M = 2^14 with the explicit dense S (r·p·M flops), r = 200, p = 30,000, J = 4 and 8."""
    for J in (4, 8):
        case = SketchCase(kind, 200, 30_000, 2**14, J, seed=11, n_exact=64)
        s, u, res = _run(case, tmp_path / f"J{J}", verify="none")
        _check_holds(s, u, res.accuracy()["sketch"], res.U)
