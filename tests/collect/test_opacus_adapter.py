"""Recording from Opacus: rows equal a batch-of-one reference; accounting still advances."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gradspec.collect import CollectConfig, GradientRecorder, PoissonSampler, collect, record_opacus
from gradspec.collect._rows import DIVISOR_ACTUAL, ROW_EXAMPLE, ROW_MEAN
from gradspec.store import META_FIELDS, GradientStore

from ._tiny import tiny_task

pytest.importorskip("opacus")
from opacus import PrivacyEngine  # noqa: E402
from opacus.utils.batch_memory_manager import BatchMemoryManager  # noqa: E402

C = 0.5  # small enough that most examples are clipped, so clipping is exercised
N, D, K = 48, 5, 3


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, K))


def make_loader(batch_size: int) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D, generator=g)
    y = torch.randint(0, K, (N,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def _make_private(model: nn.Module, loader: DataLoader, **kw):
    engine = PrivacyEngine()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.2)
    parts = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader,
        noise_multiplier=1.0, max_grad_norm=C, noise_generator=torch.Generator().manual_seed(2), **kw,
    )
    return engine, parts


def private(batch_size=8, **kw):
    return _make_private(make_model(), make_loader(batch_size), **kw)


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


def test_per_step_rows_are_the_mean_clipped_gradient_over_the_batch(tmp_path):
    """Row = clipped sum / the examples the (Poisson) batch had, as in collect; not / expected_batch_size."""
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
                refs.append((steps, clipped_rows(ref, x, y).mean(0), len(x), loss.item()))
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
    assert len({b for _, _, b, _ in refs} - {optimizer.expected_batch_size}) > 0  # Poisson: sizes differ
    np.testing.assert_allclose(rows, torch.stack([r for _, r, _, _ in refs]).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(meta["step"], [s for s, _, _, _ in refs])
    np.testing.assert_array_equal(meta["batch_size"], [b for _, _, b, _ in refs])
    np.testing.assert_allclose(meta["loss"], [v for _, _, _, v in refs], rtol=1e-6)
    assert 0 < meta["frac_clipped"].mean() <= 1 and (meta["norm_max"] >= meta["norm_mean"]).all()
    cfg = store.config
    assert cfg["source"] == "opacus" and cfg["accountant"] == engine.accountant.mechanism()
    assert cfg["final_epsilon"] == pytest.approx(engine.get_epsilon(1e-5))
    assert cfg["steps"] == steps and cfg["delta"] == 1e-5 and cfg["max_grad_norm"] == C
    assert cfg["row"] == ROW_MEAN and cfg["row_divisor"] == DIVISOR_ACTUAL
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
    assert store.config["row"] == ROW_EXAMPLE and store.config["row_divisor"] is None


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
                    refs.append((clipped_rows(ref, x_all, y_all).mean(0), len(pending), len(x_all)))
                    pending, real = [], real + 1
    assert max(n for _, n, _ in refs) > 1  # some real steps took several physical batches
    assert accounted_steps(engine) == real == len(loader)
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert store.n_rows == real
    np.testing.assert_allclose(store.read(), torch.stack([r for r, _, _ in refs]).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(store.row_meta()["step"], np.arange(real))
    np.testing.assert_array_equal(store.row_meta()["batch_size"], [b for _, _, b in refs])  # over all virtual steps


def test_ghost_clipping_per_step_rows(tmp_path):
    engine, (model, optimizer, criterion, loader) = private(grad_sample_mode="ghost", criterion=nn.CrossEntropyLoss())
    refs = []
    with GradientRecorder(out=tmp_path, model=model) as recorder:
        recorder.attach_opacus(optimizer, delta=1e-5)
        for step, (x, y) in enumerate(loader):
            if step == 3:
                break
            ref = snapshot(model)
            loss = criterion(model(x), y)
            recorder.observe_loss(loss)  # a DPTensorFastGradientClipping: its per-example losses
            loss.backward()
            refs.append((clipped_rows(ref, x, y).mean(0), len(x), loss.item()))
            optimizer.step()
            optimizer.zero_grad()
    store = GradientStore.open(tmp_path / "gradients.zarr")
    meta = store.row_meta()
    assert {b for _, b, _ in refs} != {optimizer.expected_batch_size}  # Poisson: sizes differ
    np.testing.assert_allclose(store.read(), torch.stack([r for r, _, _ in refs]).numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(meta["batch_size"], [b for _, b, _ in refs])
    np.testing.assert_allclose(meta["loss"], [v for _, _, v in refs], rtol=1e-6)
    assert np.isfinite(meta["norm_mean"]).all()  # norms read from the ghost norms
    assert accounted_steps(engine) == 3 and store.config["opacus"]["grad_sample_mode"] == "ghost"
    with (
        pytest.raises(ValueError, match="ghost clipping never forms per-example"),
        GradientRecorder(out=tmp_path / "pe", model=model, per_example=True) as recorder,
    ):
        recorder.attach_opacus(optimizer)


@pytest.mark.parametrize(
    ("batch_size", "seed", "b"),
    [(16, 0, 10), (1, 2, 3), (1, 4, 0)],
    ids=["poisson-10-of-16", "poisson-3-of-1", "empty-batch"],
)
def test_rows_equal_what_collect_stores_for_the_same_weights_and_batch(tmp_path, batch_size, seed, b):
    """One row convention: an Opacus step's row is the row gradspec's own trainer stores for it."""
    task = tiny_task()
    config = CollectConfig(task="tiny", steps=1, batch_size=batch_size, noise_multiplier=0.0, max_grad_norm=C,
                           sampling="poisson", mode="batch", optimizer="sgd", lr=0.1, seed=seed)
    want = GradientStore.open(collect(config, out=tmp_path / "collect", task=task).store)
    n = len(task.train)
    idx = PoissonSampler(n, batch_size / n, seed=seed + 1).next()  # collect's first batch
    assert len(idx) == b and b != batch_size  # the actual size is not the expected one
    model = tiny_task().model  # same seed: the weights collect computed its row at
    loader = DataLoader(TensorDataset(task.train.tensors["tokens"], task.train.tensors["labels"]), batch_size=batch_size)
    engine = PrivacyEngine()
    model, optimizer, _ = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data_loader=loader,
        noise_multiplier=0.0, max_grad_norm=C,
    )
    batch = task.train.batch(idx)
    with GradientRecorder(out=tmp_path / "opacus", model=model) as recorder:
        recorder.attach_opacus(optimizer)
        losses = nn.functional.cross_entropy(model(batch["tokens"]), batch["labels"], reduction="none")
        recorder.observe_loss(losses)
        losses.mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    got = GradientStore.open(tmp_path / "opacus" / "gradients.zarr")
    assert accounted_steps(engine) == 1  # an empty batch is still a step
    assert got.n_rows == want.n_rows == min(b, 1)  # an empty batch has no row, in both
    assert got.layout == want.layout
    np.testing.assert_allclose(got.read(), want.read(), rtol=1e-5, atol=1e-7)
    mw, mg = want.row_meta(), got.row_meta()
    assert set(mg) == set(mw) == set(META_FIELDS)
    for k in mw:
        assert mg[k].dtype == mw[k].dtype, k
        np.testing.assert_allclose(mg[k], mw[k], rtol=1e-5, err_msg=k)
    if b:
        assert mw["frac_clipped"][0] > 0 and mw["batch_size"][0] == b
    assert got.config["row"] == ROW_MEAN


class Positions(nn.Module):
    """A learned position embedding added to every example: its ids have batch size 1 (GPT-2's wpe)."""

    def __init__(self, first: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        if first:
            self.pos = nn.Embedding(4, D)
        self.fc = nn.Linear(D, K)
        if not first:
            self.pos = nn.Embedding(4, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, D)
        positions = torch.arange(x.shape[1])[None]  # (1, T), shared by the batch
        return self.fc(x + self.pos(positions)).mean(1)


@pytest.mark.parametrize(
    ("first", "trained"),
    [(True, None), (False, None), (True, "pos.*")],
    ids=["pos-first", "pos-last", "pos-only"],
)
def test_a_parameter_opacus_sums_over_the_batch_is_refused(tmp_path, first, trained):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(N, 4, D, generator=g), torch.randint(0, K, (N,), generator=g)
    module = Positions(first)
    if trained:
        module.fc.requires_grad_(False)
    _, (model, optimizer, loader) = _make_private(module, DataLoader(TensorDataset(x, y), batch_size=8))
    with GradientRecorder(out=tmp_path, model=model) as recorder:
        recorder.attach_opacus(optimizer)
        x, y = next(iter(loader))
        losses = nn.functional.cross_entropy(model(x), y, reduction="none")
        recorder.observe_loss(losses)  # per-example: the batch size, to check the rows against
        losses.mean().backward()
        with pytest.raises(ValueError, match=r"'pos\.weight'.*sums this parameter's gradient over the batch") as err:
            optimizer.step()
    message = str(err.value)
    assert "\n" not in message and "DP guarantee" in message and "freeze" in message
    assert GradientStore.open(tmp_path / "gradients.zarr").n_rows == 0


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
    _, (model, optimizer, loader) = private()
    x, y = next(iter(loader))
    with GradientRecorder(out=tmp_path / "d", model=model) as recorder:
        recorder.attach_opacus(optimizer)
        losses = nn.functional.cross_entropy(model(x), y, reduction="none")
        recorder.observe_loss(torch.cat([losses, losses]).detach())  # not one loss per example
        losses.mean().backward()
        with pytest.raises(ValueError, match=rf"have {2 * len(x)} values, the per-example gradients {len(x)} rows"):
            optimizer.step()


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_the_first_batchs_norm_shares_equal_a_batch_of_one_reference(tmp_path, mode):
    """The recorder keeps each layer's share of the first physical batch's clipped norm (what
    gradspec.train.clipped_norm_shares measures in gradspec's own trainer), over every
    parameter Opacus clips; checked against batch-of-one rows clipped like Opacus."""
    kw = {"grad_sample_mode": "ghost", "criterion": nn.CrossEntropyLoss()} if mode == "ghost" else {}
    engine, parts = private(**kw)
    model, optimizer, loader = parts[0], parts[1], parts[-1]
    criterion = parts[2] if mode == "ghost" else nn.functional.cross_entropy
    first = None
    with GradientRecorder(out=tmp_path, model=model, params=["2.*"]) as recorder:  # records layer 2 only
        recorder.attach_opacus(optimizer)
        for step, (x, y) in enumerate(loader):
            if step == 2:
                break
            if first is None and len(x):
                first = clipped_rows(snapshot(model), x, y)
            loss = criterion(model(x), y)
            recorder.observe_loss(loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    shares = GradientStore.open(tmp_path / "gradients.zarr").config["norm_shares"]
    sq = first.double() ** 2
    want = {"0": float(sq[:, : D * 8 + 8].sum()), "2": float(sq[:, D * 8 + 8 :].sum())}
    total = sum(want.values())
    got = {g["group"]: g["share"] for g in shares["groups"]}
    assert shares["examples"] == len(first) and shares["p"] == D * 8 + 8 + 8 * K + K
    assert got == pytest.approx({g: v / total for g, v in want.items()}, rel=1e-4)
