"""The registry, the public surface, retrain/sweep outputs and the spectrum-store projector."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

import gradspec.optim as optim
from gradspec.optim import make_algorithm, retrain, spectrum_basis, sweep
from tests.store.test_chunk_manifest import restamp

from ._cases import LOWRANK, config, lowrank_task


def test_every_name_in_all_imports():
    for name in optim.__all__:
        assert hasattr(optim, name), name


def test_registry_names_valid_choices():
    with pytest.raises(ValueError, match="dp-sgd, subspace, complement, pdp-sgd"):
        make_algorithm("sgd")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['k'\].*valid options"):
        make_algorithm("pdp-sgd", k=3)
    with pytest.raises(ValueError, match="needs a rank"):
        make_algorithm("rpdp-sgd")
    assert make_algorithm("rpdp-sgd", rank=2).name == "rpdp-sgd"
    assert make_algorithm("dp-sgd").name == "dp-sgd"


def test_retrain_writes_its_result_and_refuses_target_epsilon_with_extra_privacy(tmp_path):
    res = retrain(config=config(optimizer="adam"), algorithm="dp-adam", out=tmp_path / "a",
                  task=lowrank_task())
    saved = json.loads((tmp_path / "a" / "retrain.json").read_text())
    assert saved["algorithm"] == "dp-adam" and saved["epsilon"] == pytest.approx(res.epsilon)
    assert json.loads((tmp_path / "a" / "config.json").read_text())["optimizer"] == "sgd"
    with pytest.raises(ValueError, match="target epsilon"):
        retrain(config=config(noise_multiplier=None, target_epsilon=2.0), algorithm="noisy-adagrad",
                options={"rank": 2, "projector": "random"}, out=tmp_path / "b")


def test_sweep_writes_one_run_per_point_and_a_summary(tmp_path):
    rows = sweep(config=config(steps=4), algorithms=["dp-sgd", ("rpdp-sgd", {"seed": 1})],
                 ranks=[2, 5], seeds=[0, 1], noise_multipliers=[0.5], out=tmp_path,
                 task_factory=lambda seed: lowrank_task(seed=seed))
    assert len(rows) == 2 + 4
    assert {(r["algorithm"], r["rank"]) for r in rows} == {("dp-sgd", None), ("rpdp-sgd", 2),
                                                           ("rpdp-sgd", 5)}
    assert (tmp_path / "rpdp-sgd-k5-seed1-nm0.5" / "metrics.jsonl").is_file()
    with open(tmp_path / "summary.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 6 and "eval_loss" in table[0]
    assert len(json.loads((tmp_path / "summary.json").read_text())) == 6
    again = sweep(config=config(steps=4), algorithms=["dp-sgd"], seeds=[0, 1],
                  noise_multipliers=[0.5], out=tmp_path)  # finished runs are reused
    assert [r["eval_loss"] for r in again] == [r["eval_loss"] for r in rows[:2]]
    with open(tmp_path / "summary.csv") as f:  # the folder's summary still lists every run in it
        table = list(csv.DictReader(f))
    assert len(again) == 2 and len(table) == 6
    assert sorted(r["out"] for r in table) == sorted(str(r["out"]) for r in rows)


def test_spectrum_store_projector(tmp_path):
    import gradspec
    from gradspec.collect import collect
    from gradspec.store._spectrum import SpectrumStore

    p, k = LOWRANK["d"], 4
    SpectrumStore.create(tmp_path / "running.zarr", r=10, p=p, k=k, method="gram")
    with pytest.raises(ValueError, match="not complete"):
        spectrum_basis(tmp_path / "running.zarr", 2)
    collect(config(steps=12, noise_multiplier=0.0), out=tmp_path / "grads", task=lowrank_task())
    result = gradspec.pca(source=tmp_path / "grads" / "gradients.zarr", k=k, out=tmp_path / "s.zarr")
    v = spectrum_basis(tmp_path / "s.zarr", 3)
    assert v.shape == (p, 3) and v.dtype == torch.float64
    store = SpectrumStore.open(tmp_path / "s.zarr")
    np.testing.assert_allclose(v.numpy(), store.read_v()[:, :3], atol=1e-7)
    assert result.sigma[0] > 0
    with pytest.raises(ValueError, match="exceeds"):
        spectrum_basis(tmp_path / "s.zarr", store.k + 1)
    hooks = make_algorithm("subspace", projector="spectrum", spectrum=tmp_path / "s.zarr", rank=3)
    res = retrain(config=config(steps=3), algorithm=hooks, out=tmp_path / "run", task=lowrank_task())
    assert res.rank == 3 and res.algorithm == "subspace"
    assert res.hooks["projector"]["parameters"] == ["weight"]
    q, _ = torch.linalg.qr(v)
    torch.testing.assert_close(hooks.projector.basis.double().abs(), q.abs(), atol=1e-6, rtol=0)
    # a large basis (threshold lowered to this size) keeps the store's float32, read block by block
    import gradspec.optim._orthonormal as orthonormal
    import gradspec.optim._projectors as projectors
    import gradspec.optim._registry as registry

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "LARGE_BASIS", 2)
        mp.setattr(projectors, "LARGE_BASIS", 2)
        mp.setattr(orthonormal, "LARGE_BASIS", 2)
        v32 = spectrum_basis(tmp_path / "s.zarr", 3)
        assert v32.dtype == torch.float32 and v32.shape == (p, 3)
        np.testing.assert_array_equal(v32.numpy(), store.read_v()[:, :3])
        big = make_algorithm("subspace", projector="spectrum", spectrum=tmp_path / "s.zarr", rank=3)
        assert big.projector.describe()["dtype"] == "float32"
        torch.testing.assert_close(big.projector._source.double().abs(), q.abs(), atol=1e-5, rtol=0)


def test_sweep_figures_and_cli(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import typer
    from typer.testing import CliRunner

    from cli.retrain import retrain_command

    app = typer.Typer()
    app.command()(retrain_command)
    app.command("noop")(lambda: None)  # keep typer in multi-command mode
    out = tmp_path / "sweep"
    args = ["retrain-command", "--out", str(out), "--task", "lowrank", "-t", "n=120", "-t", "d=16",
            "-t", "n_eval=60", "--steps", "6", "--batch-size", "24", "--eval-every", "3",
            "--sweep", "-a", "dp-sgd", "-a", "rpdp-sgd", "--ranks", "2,4", "--noise-multipliers", "0.8,2",
            "--accounting", "rdp", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "retrain_curves.png").is_file() and (out / "metric_vs_epsilon.png").is_file()
    assert len(json.loads((out / "summary.json").read_text())) == 6
    bad = CliRunner().invoke(app, ["retrain-command", "-a", "sgd", "--out", str(tmp_path / "x")])
    assert bad.exit_code != 0 and "choose one of" in bad.output


@pytest.mark.parametrize("large", [False, True], ids=["float64-qr", "float32-in-place"])
def test_a_spectrum_whose_v_repeats_a_column_is_refused_not_reorthonormalised(tmp_path, large):
    """Issue 25: V with column 1 overwritten by column 0 ran `retrain --projector` (exit 0) on a
    subspace whose third direction was rounding noise; decay refused it. Now retrain does too."""
    import zarr

    import gradspec
    import gradspec.optim._orthonormal as orthonormal
    import gradspec.optim._projectors as projectors
    import gradspec.optim._registry as registry
    from gradspec.collect import collect

    collect(config(steps=12, noise_multiplier=0.0), out=tmp_path / "grads", task=lowrank_task())
    gradspec.pca(source=tmp_path / "grads" / "gradients.zarr", k=4, out=tmp_path / "s.zarr")
    make_algorithm("subspace", projector="spectrum", spectrum=tmp_path / "s.zarr", rank=3)  # intact: fine
    v = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")["V"]
    damaged = v[:]
    damaged[:, 1] = damaged[:, 0]
    v[:] = damaged
    restamp(tmp_path / "s.zarr")  # as a writer that stored this V: what the directions' checks see
    with pytest.MonkeyPatch.context() as mp:
        if large:
            for module in (projectors, registry, orthonormal):
                mp.setattr(module, "LARGE_BASIS", 2)
        with pytest.raises(ValueError, match="not orthonormal .* damaged"):
            make_algorithm("subspace", projector="spectrum", spectrum=tmp_path / "s.zarr", rank=3)


@pytest.mark.parametrize("large", [False, True], ids=["float64-qr", "float32-in-place"])
def test_a_direction_pca_keeps_is_repaired_not_called_damage(tmp_path, large):
    """pca keeps a direction whose ‖v‖ is within V_UNIT_ATOL of 1 (steep spectra in float32
    products: a tiny BERT's σ_3 = σ_1/313 came out at ‖v_3‖ = 1 − 6.8e-4); retrain called such
    a store damaged, because it checked |VᵀV − I| ≤ 1e-3 on the squared norms. Now it repairs it."""
    import zarr

    import gradspec
    import gradspec.optim._orthonormal as orthonormal
    import gradspec.optim._projectors as projectors
    import gradspec.optim._registry as registry
    from gradspec.collect import collect
    from gradspec.store import V_UNIT_ATOL

    collect(config(steps=12, noise_multiplier=0.0), out=tmp_path / "grads", task=lowrank_task())
    gradspec.pca(source=tmp_path / "grads" / "gradients.zarr", k=4, out=tmp_path / "s.zarr")
    v = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")["V"]
    short = v[:]
    short[:, 2] *= 1 - 0.9 * V_UNIT_ATOL  # what pca keeps
    v[:] = short
    restamp(tmp_path / "s.zarr")  # as a writer that stored this V
    with pytest.MonkeyPatch.context() as mp:
        if large:
            for module in (projectors, registry, orthonormal):
                mp.setattr(module, "LARGE_BASIS", 2)
        algo = make_algorithm("subspace", projector="spectrum", spectrum=tmp_path / "s.zarr", rank=3)
        basis = algo.projector._source.double()  # the repaired basis, before a run moves it
        assert torch.allclose(basis.T @ basis, torch.eye(3, dtype=torch.float64), atol=1e-5)
        # beyond what pca keeps, it is still damage
        short[:, 2] *= 1 - 2 * V_UNIT_ATOL
        v[:] = short
        restamp(tmp_path / "s.zarr")
        with pytest.raises(ValueError, match="not orthonormal .* damaged"):
            make_algorithm("subspace", projector="spectrum", spectrum=tmp_path / "s.zarr", rank=3)
