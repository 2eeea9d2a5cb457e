"""The Kairouz et al. 2021 experiment: its noise calibration (fast) and its --quick run (slow)."""

from __future__ import annotations

import json
import math

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from analyses.kairouz2021_noisy_adagrad import report
from analyses.kairouz2021_noisy_adagrad import run as exp


def _gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) of a Gaussian mechanism of privacy parameter mu = sensitivity / std
    (Balle & Wang 2018, Thm 8; exact), independent of dp-accounting."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("scale", [exp.QUICK, exp.FULL], ids=["quick", "full"])
def test_each_method_gets_noise_for_the_same_epsilon(scale):
    sig = exp.noise_levels(scale)
    t = scale.steps
    # T full-batch Gaussians of multiplier s compose to one of mu = sqrt(T) / s (exactly);
    # noisy AdaGrad releases 2T of them
    for kind, releases in (("gradient", t), ("gradient+preconditioner", 2 * t)):
        mu = math.sqrt(releases) / sig[kind]
        eps = brentq(lambda e, mu=mu: _gaussian_delta(e, mu) - sig["delta"], 1e-6, 100)
        assert eps <= scale.epsilon + 1e-3 and eps > scale.epsilon - 2e-2, (kind, eps)
    assert sig["gradient+preconditioner"] == pytest.approx(math.sqrt(2) * sig["gradient"], rel=2e-3)


def test_claims_are_judged_from_the_table():
    scale = exp.QUICK

    def entry(mean, se=0.001):
        return {"excess_risk": {"mean": mean, "std": se * 1.7, "se": se}, "sigma": 1.0, "lr": 1.0}

    table = {m: {str(d): entry(0.001) for d in scale.dims} for m in exp.METHODS}
    table["dp-gd"][str(scale.dims[-1])] = entry(0.1)
    table["rpdp-gd"] = {str(d): entry(0.18) for d in scale.dims}
    rows = {r["claim"]: r["reproduced"] for r in report.claims(table, scale, [0, 1, 2])}
    assert rows["ambient DP-GD's excess risk grows with d on a constrained problem"] == "yes"
    assert rows["noisy full-matrix AdaGrad, public subspace: excess risk independent of d"] == "yes"
    table["noisy-adagrad"][str(scale.dims[-1])] = entry(0.09)
    rows = {r["claim"]: r["reproduced"] for r in report.claims(table, scale, [0, 1, 2])}
    assert rows["noisy full-matrix AdaGrad, public subspace: excess risk independent of d"] == "no"
    gain = next(r for r in report.claims(table, scale, [0, 1, 2]) if r["claim"].startswith("noisy AdaGrad (subspace) vs"))
    assert "noisy AdaGrad worse" in gain["ours"] and gain["reproduced"].startswith("n/a")


@pytest.mark.slow
def test_quick_run_writes_a_sane_results_file(tmp_path):
    assert exp.main(["--quick", "--out", str(tmp_path), "--seeds", "0", "1", "2"]) == 0
    found = json.loads((tmp_path / "results.json").read_text())
    assert found["mode"] == "quick" and found["seeds"] == [0, 1, 2]
    assert (tmp_path / "excess_risk_vs_d.png").stat().st_size > 0
    claims = {r["claim"] for r in found["claims"]}
    assert any(c.startswith("ambient DP-GD") for c in claims) and len(found["claims"]) >= 6
    for method, by_d in found["table"].items():
        for d, e in by_d.items():
            assert len(e["excess_risk"]["values"]) == 3
            assert all(math.isfinite(v) and v > -1e-6 for v in e["excess_risk"]["values"]), (method, d)
            if method != "gd":
                assert all(abs(eps - found["scale"]["epsilon"]) < 1e-2 for eps in e["epsilon"])
    for run in found["runs"]:
        assert run["opt_gap_certificate"] < 1e-8
    # the non-private control reaches the float64 optimum; the random subspace does not
    assert max(e["excess_risk"]["mean"] for e in found["table"]["gd"].values()) < 1e-3
    top = str(max(int(d) for d in found["table"]["rpdp-gd"]))
    assert found["table"]["rpdp-gd"][top]["excess_risk"]["mean"] > 0.05
