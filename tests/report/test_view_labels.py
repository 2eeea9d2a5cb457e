"""Labels of the page that said something else than their numbers (found by review): strided pca
rows shown as a contiguous range, and the sketch's per-σ 95% called a joint confidence with a
Bonferroni z."""

from __future__ import annotations

from gradspec.report._view import _rows_text, _sketch_confidence


def test_strided_rows_keep_their_step():
    assert _rows_text({"start": 0, "stop": 59, "step": 2}, 30) == "0:59:2"
    assert _rows_text({"start": 5, "stop": 9, "step": 1}, 4) == "5:9"
    assert _rows_text({"n_indices": 7, "first": 3, "last": 40}, 7) == "7 rows in 3..40"
    assert _rows_text(None, 12) == "0:12"


def test_the_sketch_confidence_says_per_sigma_or_joint_as_its_statement_does():
    boot = _sketch_confidence({"method": "block-bootstrap", "confidence": 0.95, "z": 2.25})
    assert boot["label"] == "confidence per σ" and "not joint" in boot["note"] and "Bonferroni" not in boot["note"]
    jack = _sketch_confidence({"method": "jackknife", "confidence": 0.95, "z": 2.36})
    assert jack["label"] == "confidence per σ"
    old = _sketch_confidence({"confidence": 0.95, "z": 3.1})  # issue 22's perturbation statement
    assert old["label"] == "joint confidence" and "Bonferroni" in old["note"]


def test_a_retraining_runs_folder_shows_its_own_privacy(tmp_path):
    """A `gradspec retrain --out` folder: δ and the noise multiplier from its retrain.json, and a
    finished run's ε is not 'spent so far' (found by review: both read "—", with notes of a
    collect run, and the card said "so far")."""
    import json

    from gradspec.report._read import read_run
    from gradspec.report._view import _glance, _privacy

    from .conftest import TRAIN, ok

    out = tmp_path / "rt"
    ok("retrain", "-a", "dp-sgd", "--steps", 4, "--epsilon", 2, "--out", out, *TRAIN)
    rec = json.loads((out / "retrain.json").read_text())
    c = read_run(out)
    rows = {r["label"]: r["value"] for r in _privacy(c)}
    assert rows["δ"].value == rec["delta"] and rows["noise multiplier"].value == rec["noise_multiplier"]
    assert _glance(c, None)[0]["label"] == "privacy spent"
