"""Recording from Opacus: rows equal a batch-of-one reference; accounting still advances."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gradspec.collect import GradientRecorder, record_opacus
from gradspec.store import GradientStore

pytest.importorskip("opacus")
from opacus import PrivacyEngine  # noqa: E402
from opacus.utils.batch_memory_manager import BatchMemoryManager  # noqa: E402

C = 0.5  # small enough that most examples are clipped, so clipping is exercised
N, D, K = 48, 5, 3


@pytest.fixture(autouse=True)
def _quiet_opacus():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module="opacus")
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
        warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook.*")
        yield


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, K))


def make_loader(batch_size: int) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D, generator=g)
    y = torch.randint(0, K, (N,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def private(batch_size=8, **kw):
    engine = PrivacyEngine()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    parts = engine.make_private(
        module=model, optimizer=optimizer, data_loader=make_loader(batch_size),
        noise_multiplier=1.0, max_grad_norm=C, noise_generator=torch.Generator().manual_seed(2), **kw,
    )
    return engine, parts


def snapshot(model: nn.Module) -> nn.Module:
    """A plain copy (no Opacus hooks) of the wrapped model at its current weights."""
    ref = make_model()
    ref.load_state_dict({k.removeprefix("_module."): v.detach().clone() for k, v in model.state_dict().items()})
    return ref


def clipped_rows(ref: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each example differentiated alone (batch of one) with autograd, clipped to C like Opacus."""
    params = list(ref.parameters())
    rows = []
    for i in range(len(x)):
        loss = nn.functional.cross_entropy(ref(x[i : i + 1]), y[i : i + 1])
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, params)])
        rows.append(g * min(1.0, C / (float(g.norm()) + 1e-6)))
    return torch.stack(rows) if rows else torch.zeros(0, sum(p.numel() for p in params))


def accounted_steps(engine) -> int:
    return sum(entry[-1] for entry in engine.accountant.history)


def test_per_step_rows_equal_clipped_sum_over_expected_batch_size(tmp_path):
    engine, (model, optimizer, loader) = private()
    refs, steps = [], 0
    with GradientRecorder(out=tmp_path, model=model) as recorder:
        recording = recorder.attach_opacus(optimizer, delta=1e-5)
        for x, y in loader:
            ref = snapshot(model)
            loss = nn.functional.cross_entropy(model(x), y)
            recorder.observe_loss(loss)
            loss.backward()
            if len(x):
                refs.append((steps, clipped_rows(ref, x, y).sum(0) / optimizer.expected_batch_size, len(x), loss.item()))
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    assert recording.steps == steps == len(loader)
    assert accounted_steps(engine) == steps  # the accountant's hook still runs
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert store.status == "complete" and not store.per_example
    assert store.layout.names == ["0.weight", "0.bias", "2.weight", "2.bias"]  # names of the user's module
    rows, meta = store.read(), store.row_meta()
    assert rows.shape[0] == len(refs) > 0
    np.testing.assert_allclose(rows, torch.stack([r for _, r, _, _ in refs]).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(meta["step"], [s for s, _, _, _ in refs])
    np.testing.assert_array_equal(meta["batch_size"], [b for _, _, b, _ in refs])
    np.testing.assert_allclose(meta["loss"], [v for _, _, _, v in refs], rtol=1e-6)
    assert 0 < meta["frac_clipped"].mean() <= 1 and (meta["norm_max"] >= meta["norm_mean"]).all()
    cfg = store.config
    assert cfg["source"] == "opacus" and cfg["accountant"] == engine.accountant.mechanism()
    assert cfg["final_epsilon"] == pytest.approx(engine.get_epsilon(1e-5))
    assert cfg["steps"] == steps and cfg["delta"] == 1e-5 and cfg["max_grad_norm"] == C
    # the optimizer is restored at close
    assert "clip_and_accumulate" not in optimizer.__dict__ and optimizer.step_hook is not None


def test_per_example_rows_are_clipped_batch_of_one_gradients(tmp_path):
    engine, (model, optimizer, loader) = private()
    refs = []
    with GradientRecorder(out=tmp_path, model=model, per_example=True) as recorder:
        record_opacus(optimizer, recorder=recorder)
        for step, (x, y) in enumerate(loader):
            if step == 3:
                break
            ref = snapshot(model)
            losses = nn.functional.cross_entropy(model(x), y, reduction="none")
            recorder.observe_loss(losses)
            losses.mean().backward()
            refs.append((clipped_rows(ref, x, y), losses.detach()))
            optimizer.step()
            optimizer.zero_grad()
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert store.per_example and store.n_rows == sum(len(r) for r, _ in refs)
    np.testing.assert_allclose(store.read(), torch.cat([r for r, _ in refs]).numpy(), rtol=1e-5, atol=1e-7)
    meta = store.row_meta()
    np.testing.assert_allclose(meta["loss"], torch.cat([v for _, v in refs]).numpy(), rtol=1e-6)
    assert (meta["example_index"] == -1).all()
    assert accounted_steps(engine) == 3


def test_virtual_steps_record_one_row_per_real_step(tmp_path):
    engine, (model, optimizer, loader) = private(batch_size=16)
    refs, pending, real = [], [], 0
    with GradientRecorder(out=tmp_path, model=model) as recorder:
        recorder.attach_opacus(optimizer)
        with BatchMemoryManager(data_loader=loader, max_physical_batch_size=5, optimizer=optimizer) as memory:
            for x, y in memory:
                if not pending:
                    ref = snapshot(model)  # weights do not change within a real step
                pending.append((x, y))
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
                if not optimizer._is_last_step_skipped:
                    x_all = torch.cat([a for a, _ in pending])
                    y_all = torch.cat([b for _, b in pending])
                    refs.append((clipped_rows(ref, x_all, y_all).sum(0) / optimizer.expected_batch_size, len(pending)))
                    pending, real = [], real + 1
    assert max(n for _, n in refs) > 1  # some real steps took several physical batches
    assert accounted_steps(engine) == real == len(loader)
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert store.n_rows == real
    np.testing.assert_allclose(store.read(), torch.stack([r for r, _ in refs]).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(store.row_meta()["step"], np.arange(real))


def test_ghost_clipping_per_step_rows(tmp_path):
    engine, (model, optimizer, criterion, loader) = private(grad_sample_mode="ghost", criterion=nn.CrossEntropyLoss())
    refs = []
    with GradientRecorder(out=tmp_path, model=model) as recorder:
        recorder.attach_opacus(optimizer, delta=1e-5)
        for step, (x, y) in enumerate(loader):
            if step == 3:
                break
            ref = snapshot(model)
            criterion(model(x), y).backward()
            refs.append(clipped_rows(ref, x, y).sum(0) / optimizer.expected_batch_size)
            optimizer.step()
            optimizer.zero_grad()
    store = GradientStore.open(tmp_path / "gradients.zarr")
    np.testing.assert_allclose(store.read(), torch.stack(refs).numpy(), rtol=1e-5, atol=1e-7)
    assert np.isfinite(store.row_meta()["norm_mean"]).all()  # norms read from the ghost norms
    assert accounted_steps(engine) == 3 and store.config["opacus"]["grad_sample_mode"] == "ghost"
    with (
        pytest.raises(ValueError, match="ghost clipping never forms per-example"),
        GradientRecorder(out=tmp_path / "pe", model=model, per_example=True) as recorder,
    ):
        recorder.attach_opacus(optimizer)


def test_make_private_with_epsilon_and_pca(tmp_path):
    import gradspec

    engine = PrivacyEngine(accountant="rdp")
    model = make_model()
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.2), data_loader=make_loader(8),
        target_epsilon=4.0, target_delta=1e-5, epochs=2, max_grad_norm=C, epsilon_tolerance=0.5,
    )
    with GradientRecorder(out=tmp_path, model=model, params="2.*") as recorder:
        recorder.attach_opacus(optimizer, delta=1e-5)
        for epoch in range(2):
            recorder.epoch = epoch
            for x, y in loader:
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert store.layout.names == ["2.weight", "2.bias"] and store.p == 8 * K + K
    assert store.config["accountant"] == "rdp" and 3.5 <= store.config["final_epsilon"] <= 4.0
    assert accounted_steps(engine) == 2 * len(loader) == store.config["steps"]
    assert set(store.row_meta()["epoch"]) == {0, 1}
    result = gradspec.pca(source=store, k=3)
    assert result.sigma.shape == (3,) and result.sigma[0] > result.sigma[2] > 0


def test_bad_input(tmp_path):
    model = make_model()
    with (
        GradientRecorder(out=tmp_path / "a", model=model) as recorder,
        pytest.raises(ValueError, match="DPOptimizer"),
    ):
        recorder.attach_opacus(torch.optim.SGD(model.parameters(), lr=0.1))
    _, (_, optimizer, _) = private()
    with (
        GradientRecorder(out=tmp_path / "b", model=make_model()) as recorder,
        pytest.raises(ValueError, match="is not trained by the DPOptimizer"),
    ):
        recorder.attach_opacus(optimizer)
    _, (model, optimizer, _) = private()
    with (
        GradientRecorder(out=tmp_path / "c", model=model) as recorder,
        pytest.raises(ValueError, match="no Opacus accountant"),
    ):
        optimizer.attach_step_hook(None)
        recorder.attach_opacus(optimizer, delta=1e-5)
