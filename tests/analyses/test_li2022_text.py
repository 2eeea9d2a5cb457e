"""Li et al. 2022 text reproduction: the quick mode end to end (slow), and its summaries (fast)."""

from __future__ import annotations

import json
import math

import pytest

from analyses.li2022_restricted_lipschitz import text, text_report
from analyses.li2022_restricted_lipschitz.text_scale import mean_std


def test_mean_std_and_arms() -> None:
    groups = {
        "dpsgd": [{"rank": None, "seed": s, "eval_accuracy": a, "eval_accuracy_se": 0.02,
                   "eval_examples": 500} for s, a in enumerate([0.7, 0.8, 0.9])],
        "topk-k10": [{"rank": 10, "seed": 0, "eval_accuracy": 0.6, "eval_accuracy_se": 0.02,
                      "eval_examples": 500}],
        "topk-k100": [{"rank": 100, "seed": 0, "eval_accuracy": 0.75, "eval_accuracy_se": 0.02,
                       "eval_examples": 500}],
    }
    arms = text_report.summarize_retrain(groups)
    assert arms["dpsgd"]["accuracy"]["mean"] == pytest.approx(0.8)
    assert arms["dpsgd"]["accuracy"]["std"] == pytest.approx(0.1)
    assert arms["dpsgd"]["seeds"] == [0, 1, 2]
    assert set(arms) == {"dpsgd", "topk-k10", "topk-k100"}
    assert arms["topk-k10"]["accuracy"]["std"] is None  # one seed: no std
    assert mean_std([float("nan"), 1.0])["n"] == 1


@pytest.mark.slow
def test_quick_mode_end_to_end(tmp_path) -> None:
    assert "long" not in text.DEFAULT_STAGES  # the full mode stays near an hour; long is asked for
    assert text.main(["--quick", "--out", str(tmp_path), "--seeds", "0,1,2", "--stages", ",".join(text.STAGES)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["seeds"] == [0, 1, 2]
    assert res["collect"]["committed_rows"] == text.QUICK.collect_steps
    app = res["appendix"]
    r = app["r"]
    assert r == text.QUICK.collect_steps and len(app["fig2a"]["sigma"]) == r
    sig = app["fig2a"]["sigma"]
    assert all(a >= b for a, b in zip(sig, sig[1:], strict=False))
    # exact spectrum vs orthogonal iteration: T = 50 has converged to the exact values
    f3 = app["fig3"]
    assert f3["T=50"]["max_rel_sigma_error"] < 1e-6 and f3["k"] == text.QUICK.collect_steps // 4
    assert f3["T=2"]["max_rel_sigma_error"] >= f3["T=50"]["max_rel_sigma_error"]
    for fig in ("fig4", "fig5"):
        for k, a in app[fig]["angles"].items():
            assert 0.0 <= a["max_angle_deg"] <= 90.0 and 0.0 <= a["mean_cos2"] <= 1.0, (fig, k)
    for key in ("in_sample", "heldout"):
        b = res["bounds"][key]
        for th in ("3.3", "3.5"):
            assert b[th]["k_star"] >= 1 and math.isfinite(b[th]["bound"]) and b[th]["bound"] > 0
        assert b["G_max"][0] >= b["G_max"][-1] >= 0
    assert res["bounds"]["in_sample"]["G_max"][-1] < 1e-6 * res["bounds"]["in_sample"]["G_max"][0]
    arms = res["retrain"]["arms"]
    for arm in ("dpsgd", "nonprivate", *(f"{g}-k{k}" for g in ("topk", "random")
                                                      for k in text.QUICK.ranks)):
        acc = arms[arm]["accuracy"]
        assert acc["n"] == 3 and 0.0 <= acc["mean"] <= 1.0, arm
    assert arms["untrained"]["accuracy"]["n"] == 1  # one task (task seed 0): evaluated once
    runs = res["retrain"]["runs"]
    # every arm trains on the collection's task; the seeds change only batches and noise
    assert {row["task_seed"] for arm, rows in runs.items() if "untrained" not in arm for row in rows} == {0}
    # the subspace from the private data's own gradients is a diagnostic, not a DP guarantee
    assert all(row["dp_guarantee"] is False for k in text.QUICK.ranks for row in runs[f"topk-k{k}"])
    assert all(row["dp_guarantee"] is True for row in runs["dpsgd"])
    # App. B.2: other random heads, and a head fitted on the public split with its own subspace
    kb = text.QUICK.b2_k
    for h in text.QUICK.head_seeds:
        assert {f"b2-head{h}/dpsgd", f"b2-head{h}/topk-k{kb}", f"b2-head{h}/untrained"} <= set(arms)
        assert runs[f"b2-head{h}/dpsgd"][0]["task_options"]["head_seed"] == h
    for arm in ("dpsgd", f"topk-k{kb}", f"random-k{kb}"):
        rows = runs[f"b2-public-head/{arm}"]
        assert len(rows) == 3 and all(r["task_options"]["head"] == "public" for r in rows)
    assert runs["b2-public-head/untrained"][0]["head"]["init"] == "fitted on the public split"
    assert res["b2_public_head_collect"]["steps"] == text.QUICK.collect_steps
    assert any(row[0].startswith("App. B.2") for row in res["table"])
    # Fig. 2b again at the longer schedule, in its own runs
    long = res["retrain_long"]
    assert long["arms"]["dpsgd"]["accuracy"]["n"] == 3
    assert {r["steps"] for rows in long["runs"].values() for r in rows if "steps" in r} == {text.QUICK.long_retrain_steps}
    assert any(f"{text.QUICK.long_retrain_steps} steps" in row[0] for row in res["table"])
    claims = [row[0] for row in res["table"]]
    assert any("Fig. 2a" in c for c in claims) and any("Fig. 2b" in c for c in claims)
    assert any("Theorems 3.3/3.5" in c for c in claims) and any("Fig. 5" in c for c in claims)
    assert (tmp_path / "table.md").read_text().startswith("| claim |")
    for png in ("fig2a_spectrum", "fig3_iterations", "fig4_rows", "fig5_rows", "G_k"):
        assert (tmp_path / "figures" / f"{png}.png").stat().st_size > 1000


def test_paired_differences_match_seeds() -> None:
    groups = {
        "topk-k100": [{"rank": 100, "seed": s, "eval_accuracy": a} for s, a in ((0, 0.7), (1, 0.6), (2, 0.5))],
        "dpsgd": [{"rank": None, "seed": s, "eval_accuracy": a} for s, a in ((0, 0.75), (1, 0.55))],
        "untrained": [{"seed": None, "eval_accuracy": 0.5}],  # one model: it pairs with every seed
        "b2-public-head/topk-k100": [{"rank": 100, "seed": 0, "eval_accuracy": 0.8}],
        "b2-public-head/dpsgd": [{"rank": None, "seed": 0, "eval_accuracy": 0.9}],
    }
    d = text_report.paired_differences(groups)
    assert set(d) == {"topk-k100"}  # the B.2 arms are paired among themselves only
    d = d["topk-k100"]
    assert d["dpsgd"]["seeds"] == [0, 1]
    assert d["dpsgd"]["values"] == pytest.approx([0.05, -0.05])
    assert d["dpsgd"]["mean"] == pytest.approx(0.0)
    assert d["random-k100"]["n"] == 0
    assert d["untrained"]["seeds"] == [0, 1, 2]
    assert d["untrained"]["values"] == pytest.approx([-0.2, -0.1, 0.0])
    pub = text_report.paired_differences(groups, "b2-public-head/")["b2-public-head/topk-k100"]
    assert pub["dpsgd"]["values"] == pytest.approx([0.1])


def test_arms_of_finished_runs() -> None:
    fixed = {"algorithm": "subspace", "rank": 100, "hooks": {"projector": {"kind": "fixed"}}}
    rand = {"algorithm": "subspace", "rank": 10, "hooks": {"projector": {"kind": "random"}}}
    dp = {"algorithm": "dp-sgd", "rank": None}
    assert text_report._arm("topk", fixed) == "topk-k100" and text_report._arm("random", rand) == "random-k10"
    assert text_report._arm("nonprivate", dp) == "nonprivate" and text_report._arm("dpsgd", dp) == "dpsgd"
    assert text_report._arm("b2-head2", fixed) == "b2-head2/topk-k100"
    assert text_report._arm("b2-public-head", rand) == "b2-public-head/random-k10"
    assert text_report._arm("b2-public-head", dp) == "b2-public-head/dpsgd"
