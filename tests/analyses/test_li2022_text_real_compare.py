"""The Fig. 2a comparison across real-text runs (``text_real_compare.py``): the exponent and
energy shares of a spectrum with a known power law, n read from the run's store, and the
refusal of a run without its Gram."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyses.li2022_restricted_lipschitz import text_real_compare as cmp
from gradspec.store import GradientStore, ParamLayout


def _run(tmp_path, name: str, c: float, n_train: int, r: int = 200) -> tuple:
    """A run directory whose Gram H·Hᵀ has singular values σ_k = 3 k^-c exactly."""
    run = tmp_path / name
    (run / "collect").mkdir(parents=True)
    sigma = 3.0 * np.arange(1, r + 1, dtype=np.float64) ** -c
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((r, r)))
    np.save(run / "gram.npy", (q * sigma**2) @ q.T)
    GradientStore.create(run / "collect" / "gradients.zarr", layout=ParamLayout.from_shapes([("w", (4,))]),
                         config={"task_config": {"splits": {"n_train": n_train}}})
    (run / "collect" / "metrics.jsonl").write_text(
        json.dumps({"step": 10, "loss": 0.5}) + "\n" + json.dumps({"step": 10, "eval_loss": 0.4, "eval_accuracy": 0.8}) + "\n")
    return run, sigma


def test_exponent_energy_and_n_of_each_run(tmp_path) -> None:
    small, s_small = _run(tmp_path, "small", 0.45, 900)
    large, _ = _run(tmp_path, "large", 0.6, 2000)
    rows = cmp.compare([large, small], tmp_path / "out")
    by = {row["run"]: row for row in rows}
    assert by["small"]["n"] == 900 and by["large"]["n"] == 2000
    assert by["small"]["fit"]["c"] == pytest.approx(0.45, abs=1e-9)
    assert by["large"]["fit"]["c"] == pytest.approx(0.6, abs=1e-9)
    assert by["small"]["fit"]["r2"] == pytest.approx(1.0, abs=1e-12)
    share = (s_small[:10] ** 2).sum() / (s_small**2).sum()
    assert by["small"]["energy_top_k"][10] == pytest.approx(share, rel=1e-10)
    assert 1000 not in by["small"]["energy_top_k"]  # r = 200 < 1000: no such share
    assert by["small"]["collect"]["eval_accuracy"] == 0.8
    md = (tmp_path / "out" / "fig2a_by_n.md").read_text().splitlines()
    assert len({line.count("|") for line in md}) == 1  # every row has the header's columns
    assert md[2].startswith("| small | 900 |") and md[3].startswith("| large | 2,000 |")  # by n
    assert (tmp_path / "out" / "fig2a_by_n.png").stat().st_size > 0
    saved = json.loads((tmp_path / "out" / "fig2a_by_n.json").read_text())
    assert {s["run"] for s in saved} == {"small", "large"}


def test_a_run_without_its_gram_is_refused_in_one_line(tmp_path) -> None:
    (tmp_path / "bare").mkdir()
    with pytest.raises(SystemExit, match=r"bare: no gram.npy; run its pca and fig2a stages first"):
        cmp.spectrum_row(tmp_path / "bare")


def _report(run, dpsgd: list[float], top: list[float], untrained: float = 0.5) -> None:
    """A text_real results.json with a DP-SGD arm, a top-100 arm and the untrained model (made up)."""
    from analyses.li2022_restricted_lipschitz.text_report import mean_std

    gaps = [d - t for d, t in zip(dpsgd, top, strict=True)]
    arms = {"dpsgd": {"accuracy": mean_std(dpsgd)}, "topk-k100": {"accuracy": mean_std(top)},
            "untrained": {"accuracy": mean_std([untrained])}}
    (run / "results.json").write_text(json.dumps({
        "scale": {"ranks": [10, 100], "retrain_steps": 50, "retrain_batch": 8, "epsilon": 8.0},
        "retrain": {"arms": arms, "paired": {"topk-k100": {"dpsgd": mean_std(gaps)}}}}))


def test_fig2b_gap_by_n_from_each_runs_report(tmp_path) -> None:
    small, _ = _run(tmp_path, "small", 0.45, 900)
    large, _ = _run(tmp_path, "large", 0.6, 2000)
    _report(small, dpsgd=[0.80, 0.82, 0.78], top=[0.70, 0.74, 0.72])
    _report(large, dpsgd=[0.90], top=[0.88])
    cmp.compare([large, small], tmp_path / "out")
    rows = {r["run"]: r for r in json.loads((tmp_path / "out" / "fig2b_by_n.json").read_text())}
    assert set(rows) == {"small", "large"}  # k = 10 has no top-k arm: no row
    s = rows["small"]
    assert s["k"] == 100 and s["n"] == 900 and s["gap_seeds"] == 3
    assert s["gap"] == pytest.approx(0.08)
    assert s["gap_two_se"] == pytest.approx(2 * np.std([0.10, 0.08, 0.06], ddof=1) / np.sqrt(3))
    assert s["gain_share"] == pytest.approx((0.72 - 0.5) / (0.80 - 0.5))
    assert rows["large"]["gap_two_se"] is None and rows["large"]["gap_text"] == "+0.020 (one seed)"
    md = (tmp_path / "out" / "fig2b_by_n.md").read_text().splitlines()
    assert len({line.count("|") for line in md}) == 1
    assert md[2].startswith("| small | 900 | 50 × 8 | 100 |") and "not run" in md[2]  # no random arm


def test_fig2b_skips_runs_without_a_report_and_refuses_a_broken_one(tmp_path) -> None:
    run, _ = _run(tmp_path, "plain", 0.5, 900)
    cmp.compare([run], tmp_path / "out")
    assert not (tmp_path / "out" / "fig2b_by_n.md").exists()
    (run / "results.json").write_text('{"scale": {}}')
    with pytest.raises(SystemExit, match=r"not a text_real report \(KeyError"):
        cmp.compare([run], tmp_path / "out")
