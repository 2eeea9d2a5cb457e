"""Zhou et al. (2021) PDP-SGD reproduction: the diagnostics hook, the statistics, the quick run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from analyses.zhou2021_pdp_sgd import aggregate
from analyses.zhou2021_pdp_sgd import run as zhou
from analyses.zhou2021_pdp_sgd.diagnostics import DiagnosedPDPSGD
from gradspec.optim import PDPSGD, PublicProjector, retrain
from gradspec.tasks import make_task
from gradspec.train import TrainConfig

SMALL = {"n_train": 60, "n_eval": 50, "n_public": 20}


def _config(seed: int = 3) -> TrainConfig:
    return TrainConfig(task="cnn", task_options=SMALL, steps=4, batch_size=20, noise_multiplier=2.0,
                       optimizer="sgd", lr=0.2, momentum=0.0, eval_every=0, log_every=100,
                       checkpoint_every=100, seed=seed, microbatch=None, delta=1e-5)


def test_diagnostics_do_not_change_training_and_are_sane(tmp_path) -> None:
    params = []
    hooks_used = []
    for i, diagnose in enumerate((False, True)):
        task = make_task("cnn", seed=3, **SMALL)
        projector = PublicProjector(5, public_size=15, period=2, seed=3)
        hooks = (DiagnosedPDPSGD(projector, every=2, last_step=3, seed=3) if diagnose
                 else PDPSGD(projector))
        retrain(config=_config(), algorithm=hooks, task=task, out=tmp_path / str(i), train_metrics=False)
        params.append(torch.cat([p.detach().flatten() for p in task.model.parameters()]))
        hooks_used.append(hooks)
    # the measurements read private data but never reach the model
    assert torch.equal(params[0], params[1])
    records = hooks_used[1].records
    assert [r["step"] for r in records] == [0, 2, 3]
    for r in records:
        assert r["private_size"] == 60 and r["public_size"] == 15 and r["k"] == 5
        assert len(r["angles_public"]) == 5
        assert all(0 <= a <= math.pi / 2 + 1e-12 for a in r["angles_public"])
        assert 0 <= r["energy_random"] <= r["energy_public"] <= r["energy_private_topk"] + 1e-9 <= 1 + 1e-9
        assert 0 < r["eigengap_private_relative"] < 1 and r["deviation"] > 0
        assert r["sin_max_public"] <= r["davis_kahan_bound"] + 1e-9  # Davis-Kahan holds


def _row(seed: int, acc: float) -> dict:
    return {"seed": seed, "eval_accuracy": acc, "eval_accuracy_se": 0.02, "train_accuracy": acc}


def test_paired_difference_standard_error_and_verdict() -> None:
    a = [_row(s, v) for s, v in enumerate((0.70, 0.72, 0.74))]
    b = [_row(s, v) for s, v in enumerate((0.50, 0.51, 0.55))]
    d = aggregate.paired(a, b, "eval_accuracy")
    assert d["per_seed"] == pytest.approx([0.20, 0.21, 0.19])
    assert d["mean"] == pytest.approx(0.20)
    assert d["se"] == pytest.approx(math.sqrt(0.01**2 / 3 + 2 * 0.02**2 / 3))
    assert d["verdict"] == "higher"
    close = aggregate.paired(a, [_row(s, v - 0.01) for s, v in enumerate((0.70, 0.72, 0.74))], "eval_accuracy")
    assert close["verdict"] == "no difference"


def test_plan_scales_the_papers_schedule() -> None:
    scale = zhou.SCALES["full"]
    assert zhou.n_train(scale) == 1797 - 400 - 150
    assert zhou.start_epoch(18.0, scale) == 0.0
    assert zhou.start_epoch(4.0, scale) == pytest.approx(14 / 30 * scale.epochs)
    specs = zhou.plan(scale, [0, 1, 2])
    names = [s["name"] for s in specs]
    assert len(names) == len(set(names))
    main = [s for s in specs if s["group"] == "main"]
    assert len(main) == len(scale.sigmas) * 3 * 3
    assert sum(bool(s.get("diagnose")) for s in specs) == 3


@pytest.mark.slow
def test_quick_run_writes_results(tmp_path) -> None:
    zhou.main(["--quick", "--out", str(tmp_path), "--seeds", "0", "1", "2"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["seeds"] == [0, 1, 2]
    assert {"grid", "sweep_k", "sweep_m", "sweep_s", "controls", "diagnostics"} <= set(res["aggregate"])
    assert len(res["aggregate"]["grid"]) == 2
    for e in res["aggregate"]["grid"]:
        assert 0 < e["epsilon"] < 1
        for m in ("dp-sgd", "pdp-sgd", "rpdp-sgd"):
            s = e[m]["eval_accuracy"]
            assert s["n"] == 3 and 0 <= s["mean"] <= 1 and math.isfinite(s["std"])
    claims = [r["claim"] for r in res["table"]]
    assert any(c.startswith("PDP-SGD − DP-SGD") for c in claims)
    assert any(c.startswith("RPDP-SGD") for c in claims)
    assert any("sweep over k" in c for c in claims)
    assert res["aggregate"]["diagnostics"]["per_step"]
    assert (tmp_path / "table.md").read_text().startswith("| claim |")
    for fig in res["figures"]:
        assert (tmp_path / fig).stat().st_size > 1000
