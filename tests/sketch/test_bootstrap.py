"""The block bootstrap's stated error (issue 37 §2) on fast synthetic cases: dense Gaussian J-block
sketches of rows with a known decaying spectrum. Its 95% per-σ intervals must cover the true σ
(the calibration of docs/sketch_calibration.md, here on a case small enough for the default suite),
and the same replicates with a too-small multiplier must not: the coverage test can fail."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.sketch._bootstrap import (
    MULTIPLIER,
    STATEMENT,
    block_bootstrap,
    block_error,
    principal_sines,
    state,
)

R, K, J = 120, 30, 8


def _case(seed: int, m: int, n_exact: int = 0) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray, np.ndarray]:
    """(block Grams, exact Gram, true σ, true U): rows with σ_i ∝ i^-0.6, a dense Gaussian sketch of
    m columns in J blocks (the law of H P^T: (U S) Z / sqrt(m)), and n_exact exactly kept columns."""
    rng = np.random.default_rng(seed)
    u = np.linalg.qr(rng.standard_normal((R, R)))[0]
    s = np.arange(1, R + 1) ** -0.6
    us = u * s
    z = rng.standard_normal((R, m)) / np.sqrt(m)
    y = us @ z
    width = m // J
    grams = [y[:, j * width : (j + 1) * width] @ y[:, j * width : (j + 1) * width].T for j in range(J)]
    exact = None
    if n_exact:  # an exactly stored part: the truth adds its Gram
        e = rng.standard_normal((R, n_exact)) * 0.05
        exact = e @ e.T
        lam, vec = np.linalg.eigh(us @ us.T + exact)
        s, u = np.sqrt(np.maximum(lam[::-1], 0)), vec[:, ::-1]
    return grams, exact, s, u


@pytest.fixture(scope="module")
def boots():
    """24 seeded cases (M = 512 and 2048, with and without exact columns): each one's bootstrap
    summary, true σ and true U, and the top eigenvectors of its Gram."""
    out = []
    for seed in range(24):
        grams, exact, s, u = _case(seed, 512 if seed % 2 else 2048, n_exact=40 if seed % 3 == 0 else 0)
        boot = block_bootstrap(grams, exact, k=K, angle_ks=(1, 10))
        w = np.linalg.eigh(np.sum(grams, axis=0) + (0 if exact is None else exact))[1][:, ::-1]
        out.append((boot, s[:K], u, w))
    return out


def _coverage(boots, **kw) -> tuple[float, float]:
    sig, lo, up = [], [], []
    for boot, _, _, _ in boots:
        rep = state(boot, **kw)
        sig.append(rep["sigma"])
        lo.append(rep["sigma_lower"])
        up.append([np.inf if x is None else x for x in rep["sigma_upper"]])
    sig, lo, up = (np.asarray(v) for v in (sig, lo, up))
    truth = np.stack([b[1] for b in boots])
    cover = float(np.mean((lo <= truth) & (truth <= up)))
    err = np.sqrt(np.mean((sig - truth) ** 2 / truth**2, axis=0))
    half = np.median((up - lo) / 2 / truth, axis=0)
    return cover, float(np.median(half / err))


def test_intervals_cover_and_are_not_trivially_wide(boots):
    """≥ 93% of 720 true σ inside their 95% intervals (measured: 98.3%), every interval finite, and
    the median half-width within 3.5× the RMS actual error (measured: 2.5×; not trivially wide), above 1×."""
    cover, ratio = _coverage(boots)
    assert cover >= 0.93, cover
    assert 1.0 <= ratio <= 3.5, ratio
    for boot, _, _, _ in boots:
        assert all(x is not None for x in state(boot)["sigma_upper"])


def test_a_too_narrow_interval_fails_the_coverage_test(boots):
    """The control: the same replicates at a third of the multiplier (about ±1 s.d.) cover well
    under 93% (measured: 65%), so the test above can fail."""
    cover, _ = _coverage(boots, multiplier=MULTIPLIER / 3)
    assert cover < 0.85, cover


def test_angle_bounds_hold_and_say_something(boots):
    """Every stated bound holds (true sin <= bound), and most are informative: of the bounds whose
    true sin is below 0.5, at least 75% are below 1 (measured: 41 of 50)."""
    small = informative = 0
    for boot, _, u, w in boots:
        for a in state(boot)["angles"]:
            q = a["k"]
            true = principal_sines(u[:, :q], w[:, :q])
            assert true <= a["bound"], (q, true, a)
            if true < 0.5:
                small += 1
                informative += int(a["bound"] < 1)
    assert small >= 40 and informative >= 0.75 * small, (informative, small)


def test_no_noise_gives_exact_intervals_and_huge_noise_unbounded():
    """Identical blocks (no spread): the intervals are the estimate itself. Blocks that disagree by
    more than the σ themselves: every upper bound is reported unbounded (None), not a number."""
    rng = np.random.default_rng(0)
    y = rng.standard_normal((20, 8))
    g = y @ y.T / 4
    rep = block_error([g] * 4, k=5)
    assert np.allclose(rep["sigma_lower"], rep["sigma"]) and np.allclose(rep["sigma_upper"], rep["sigma"], rtol=1e-9)
    wild = [g * 50 * (j + 1) * (j % 2) + np.eye(20) * 1e-3 for j in range(4)]
    rep = block_error(wild, k=5)
    assert all(x is None for x in rep["sigma_upper"]) and all(x is None for x in rep["relative_half_width"])


def test_statement_is_deterministic_and_says_what_it_is():
    grams, exact, _, _ = _case(0, 512)
    a, b = block_error(grams, exact, k=10), block_error(grams, exact, k=10)
    assert a == b
    assert a["method"] == "block-bootstrap" and a["statement"] == STATEMENT
    assert "NOT YET CALIBRATED" not in STATEMENT and "calibrated" in STATEMENT


@pytest.mark.parametrize("version", [2, 3, 4])
def test_each_plan_version_is_stated_at_its_calibrated_multiplier(version):
    """pca's report section states a store's error at its plan version's multiplier (version 4:
    2.25 for σ and 1.75 for angles, the smallest quarter steps covering ≥ 95% of its fit cases in
    docs/sketch_calibration.md; 2 and 3: 2.75 and 3.0), and says which: the half-widths and the
    angle bounds scale with them and the statement names them."""
    from gradspec.sketch._bootstrap import ANGLE_MULTIPLIERS, MULTIPLIERS, statement_text
    from gradspec.sketch._error import error_report
    from gradspec.sketch._selection import SketchSelection

    grams, exact, _, _ = _case(3, 1024)
    plan = SketchSelection(kind="kronecker", seed=0, M=1024, p=5000, J=J, segments=(), exact_cols=0, version=version)
    rep = error_report(plan, grams, exact, k=10, rounding=1e-12)
    c, ca = MULTIPLIERS[version], ANGLE_MULTIPLIERS[version]
    assert rep["z"] == c and rep["version"] == version
    assert f"lambda +- {c:g}*replicate s.d." in rep["statement"] and f"angle bound {ca:g}*RMS" in rep["statement"]
    assert rep["statement"] == statement_text(c, ca)
    wide = block_error(grams, exact, k=10, multiplier=MULTIPLIER)
    lam, lo = np.square(rep["sigma"]), np.square(rep["sigma_lower"])
    wlo = np.square(wide["sigma_lower"])
    assert np.allclose((lam - lo) * MULTIPLIER, (lam - wlo) * c, rtol=1e-9)
    boot = block_bootstrap(grams, exact, k=10, angle_ks=(1, 10))
    want = [min(1.0, ca * x + 10e-12) for x in boot["sine_rms"]]
    assert [a["bound"] for a in rep["angles"]] == pytest.approx(want, rel=1e-12)
    assert MULTIPLIERS[4] < MULTIPLIERS[2] == MULTIPLIER


def test_version_4_angle_bounds_are_a_calibrated_95_percent_statement(boots):
    """Version 4's angle multiplier (1.75, a 95% statement like the σ intervals): ≥ 93% of the 72
    bounds hold (measured: 70) and ≥ 90% of those whose true sin is below 0.5 are below 1 (measured:
    49 of 50; 41 at the widest multiplier, 3.0). The control: at 1.0 about half hold (measured 37)."""
    from gradspec.sketch._bootstrap import ANGLE_MULTIPLIERS

    def count(c):
        n = hold = small = informative = 0
        for boot, _, u, w in boots:
            for a in state(boot, angle_multiplier=c)["angles"]:
                true = principal_sines(u[:, : a["k"]], w[:, : a["k"]])
                n += 1
                hold += int(true <= a["bound"])
                small += int(true < 0.5)
                informative += int(true < 0.5 and true <= a["bound"] < 1)
        return n, hold, small, informative

    n, hold, small, informative = count(ANGLE_MULTIPLIERS[4])
    assert n == 72 and hold >= 0.93 * n and informative >= 0.9 * small, (n, hold, small, informative)
    n, hold, _, _ = count(1.0)
    assert hold < 0.75 * n, hold


def test_a_statement_outside_its_calibration_says_so():
    """J = 8 blocks and k >= 4 sigma pooled are what the multipliers were fitted on; outside it
    (found by review: J = 2 covered 74-94% of the top 5, k = 1 covered sigma_1 85-90%) the
    statement carries a caveat, which `gradspec pca` prints."""
    from gradspec.sketch._bootstrap import caveats

    grams, exact, _, _ = _case(0, 2048)
    inside = state(block_bootstrap(grams, exact, k=K, angle_ks=(1,)))
    assert inside["caveats"] == []
    assert any("J = 8" in c for c in caveats(2, K)) and any("k = 1" in c for c in caveats(8, 1))
    merged = [grams[0] + grams[1] + grams[2] + grams[3], grams[4] + grams[5] + grams[6] + grams[7]]
    two = state(block_bootstrap(merged, exact, k=2, angle_ks=(1,)))
    assert len(two["caveats"]) == 2
