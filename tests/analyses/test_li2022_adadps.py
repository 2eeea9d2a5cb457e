"""The AdaDPS reproduction (analyses/li2022_adadps): the quick mode end to end, and its helpers."""

from __future__ import annotations

import json
import math

import pytest

from analyses.li2022_adadps import run as adadps
from analyses.li2022_adadps.experiments import experiments


@pytest.mark.slow
def test_quick_mode_writes_a_complete_results_file(tmp_path):
    assert adadps.main(["--quick", "--out", str(tmp_path), "--seeds", "3"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True and results["seeds"] == [0, 1, 2]
    assert set(results["experiments"]) == {"sparse", "digits", "bow"}
    for name, exp in results["experiments"].items():
        assert exp["noise_multiplier"] > 0
        labels = set(exp["methods"])
        assert {"DP-SGD", "DP-Adam", "SGD", "Adam"} <= labels
        assert any(label.startswith("AdaDPS") for label in labels)
        for label, m in exp["methods"].items():
            assert m["score"]["n"] + m["score"]["diverged"] == 3, (name, label)
            assert len(m["runs"]) == 3 and m["grid"]
            if m["private"]:
                # every private method of an experiment runs at the same epsilon
                assert m["epsilon"] == exp["methods"]["DP-SGD"]["epsilon"] and math.isfinite(m["epsilon"][0])
            else:
                assert not math.isfinite(m["epsilon"][0])  # non-private controls
            if m["score"]["n"]:
                assert math.isfinite(m["score"]["mean"])
    table = results["table"]
    assert len(table) == 5 and all(set(r) == {"claim", "paper", "ours", "reproduced"} for r in table)
    assert (tmp_path / "table.md").read_text().startswith("| claim | paper |")
    for fig in results["figures"]:
        assert (tmp_path / fig.split("/")[-1]).stat().st_size > 1000
    eps = results["experiments"]["sparse"]["epsilon_at_paper_delta"]
    assert eps["delta"] == 1e-3 and eps["rdp"] >= eps["pld"] > 0


def test_validation_split_is_carved_from_train_only():
    from gradspec.tasks import make_task

    task = make_task("sparselinear", seed=0, n=100, n_eval=30, n_public=5, d=20)
    tuned = adadps._validation_task(task, seed=0)
    train, val = set(tuned.train.ids.tolist()), set(tuned.eval.ids.tolist())
    assert len(val) == 20 and len(train) == 80 and not train & val
    assert train | val == set(task.train.ids.tolist())  # never the held-out (reported) split
    assert not (train | val) & set(task.eval.ids.tolist())


def test_merge_refuses_runs_of_other_configurations(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    base = {"paper": "x", "quick": False, "seeds": [0, 1, 2]}
    bow = {"noise_multiplier": 1.0, "methods": {"DP-SGD": {"score": 1}}}
    (a / "results.json").write_text(json.dumps({**base, "experiments": {"bow": bow}}))
    (b / "results.json").write_text(json.dumps({**base, "seeds": [0, 1], "experiments": {"sparse": {}}}))
    with pytest.raises(ValueError, match="merge runs of one configuration"):
        adadps.merge_results([a, b])
    (b / "results.json").write_text(json.dumps({**base, "experiments": {"bow": bow}}))
    with pytest.raises(ValueError, match="the same methods"):
        adadps.merge_results([a, b])
    other = {"noise_multiplier": 2.0, "methods": {"AdaDPS": {"score": 2}}}
    (b / "results.json").write_text(json.dumps({**base, "experiments": {"bow": other}}))
    with pytest.raises(ValueError, match="other settings"):
        adadps.merge_results([a, b])
    # methods of one experiment run in parallel processes are combined
    (b / "results.json").write_text(json.dumps(
        {**base, "experiments": {"bow": {**bow, "methods": {"AdaDPS": {"score": 2}}}, "sparse": {}}}))
    merged = adadps.merge_results([b, a])
    assert list(merged["experiments"]) == ["bow", "sparse"]
    assert set(merged["experiments"]["bow"]["methods"]) == {"DP-SGD", "AdaDPS"}


def test_finished_runs_are_reused_only_with_the_same_settings(tmp_path):
    from gradspec.optim import retrain

    exp = {e.name: e for e in experiments(True)}["sparse"]
    method = exp.methods[3]  # DP-SGD
    config = adadps._config(exp, method, seed=0, lr=0.05, clip=0.5, n_train=1000, sigma=0.7)
    config = type(config).from_dict({**config.to_dict(), "steps": 3, "eval_every": 0})
    assert adadps._finished(tmp_path, config, method) is None
    retrain(config=config, algorithm=method.algorithm, out=tmp_path)
    assert adadps._finished(tmp_path, config, method).steps == 3
    other = type(config).from_dict({**config.to_dict(), "lr": 0.1})
    assert adadps._finished(tmp_path, other, method) is None
    assert adadps._finished(tmp_path, config, exp.methods[4]) is None  # DP-Adam
    (tmp_path / "retrain.json").write_text('{"algorithm": "dp-sgd"')  # cut short by a crash
    with pytest.raises(ValueError, match="not a readable retrain result") as err:
        adadps._finished(tmp_path, config, method)
    assert "\n" not in str(err.value)
