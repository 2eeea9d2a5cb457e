"""Ghost clipping against a batch-of-one loop (float64) and the materialised engine; its
refusals; the DP invariants of its clipped sum; the trainer with ``backend="ghost"``."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from gradspec.collect import CollectConfig, collect
from gradspec.privacy import clip_factors
from gradspec.store import GradientStore
from gradspec.train import GhostClipping, PerExampleGradients, TrainConfig, select_parameters

from ..collect._tiny import tiny_task
from .test_per_example import Case, _ce, make_case, reference


class _MLP(nn.Module):
    """Linear layers on (B, d) inputs, biases selected."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(7, 9), nn.Linear(9, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def _mlp(dtype=torch.float64, seed=0) -> Case:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    batch = {"x": torch.randn(6, 7, generator=gen, dtype=dtype), "labels": torch.randint(0, 3, (6,), generator=gen)}
    return Case(_MLP().to(dtype), lambda call, b: call(b["x"]), ["*"], batch)


class _Seq(nn.Module):
    """Linear layers on (B, T, d): fc1 and fc2 take the materialised norm (T (d_in + d_out) >
    d_in d_out), fc3 the ghost norm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(3, 5), nn.Linear(5, 40), nn.Linear(40, 40)
        self.head = nn.Linear(40, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))
        return self.head(torch.tanh(h).mean(1))


def _seq(dtype=torch.float64, seed=0) -> Case:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    batch = {"x": torch.randn(6, 9, 3, generator=gen, dtype=dtype), "labels": torch.randint(0, 3, (6,), generator=gen)}
    return Case(_Seq().to(dtype), lambda call, b: call(b["x"]), ["*"], batch)


def _case(name: str, dtype=torch.float64) -> Case:
    if name == "mlp":
        return _mlp(dtype)
    if name == "seq":
        return _seq(dtype)
    base, _, sel = name.partition(":")
    case = make_case(base, dtype)
    if sel == "all":  # every BERT parameter: embeddings (shared position ids), LayerNorms, biases, pooler
        case.patterns = ["*"]
    return case


CASES = ["bert", "bert:all", "embed_ln", "mlp", "seq"]


def _ghost(case: Case, **kw) -> GhostClipping:
    names = select_parameters(case.model, case.patterns)
    return GhostClipping(case.model, case.forward, case.loss, names, **kw)


def _median_clip(norms: Tensor) -> float:
    """A clipping norm that clips some examples and leaves others."""
    c = float(norms.double().median())
    assert (norms > c).any() and (norms < c).any()
    return c


@pytest.mark.parametrize("name", CASES)
def test_norms_and_clipped_sum_match_batch_of_one_loop_float64(name):
    case = _case(name)
    ghost = _ghost(case)
    rows, losses = reference(case, ghost.names)
    want_norms = rows.norm(dim=1)
    c = _median_clip(want_norms)
    res = ghost(case.batch, c)
    want_sum = (clip_factors(want_norms, c)[:, None] * rows).sum(0)
    torch.testing.assert_close(res.norms, want_norms, rtol=1e-10, atol=0)
    torch.testing.assert_close(res.total, want_sum, rtol=1e-10, atol=1e-12 * float(want_sum.norm()))
    torch.testing.assert_close(res.losses, losses, rtol=1e-12, atol=0)
    plain = ghost(case.batch, None)  # no clipping: the batch gradient
    torch.testing.assert_close(plain.total, rows.sum(0), rtol=1e-10, atol=1e-12 * float(rows.sum(0).norm()))


@pytest.mark.parametrize("name", CASES)
def test_float32_matches_float64_reference(name):
    ref_case = _case(name)
    rows, _ = reference(ref_case, select_parameters(ref_case.model, ref_case.patterns))
    case = _case(name, torch.float32)  # same seed: the same weights and batch, in float32
    case.batch = {k: (v.float() if v.is_floating_point() else v) for k, v in ref_case.batch.items()}
    norms = rows.norm(dim=1)
    c = _median_clip(norms)
    res = _ghost(case)(case.batch, c)
    want = (clip_factors(norms, c)[:, None] * rows).sum(0)
    assert float((res.norms.double() - norms).abs().max() / norms.max()) < 1e-5
    assert float((res.total.double() - want).norm() / want.norm()) < 1e-5


@pytest.mark.parametrize("name", ["bert:all", "embed_ln"])
def test_equals_materialised_engine_and_its_trainer_clipping(name):
    """The vmap engine's rows, clipped with the trainer's formula (eps = 0), summed."""
    case = _case(name)
    ghost = _ghost(case)
    pe = PerExampleGradients(case.model, case.forward, case.loss, ghost.names, dtype=None)
    rows, losses = pe(case.batch)
    norms = rows.norm(dim=1)
    c = _median_clip(norms)
    res = ghost(case.batch, c)
    torch.testing.assert_close(res.norms, norms, rtol=1e-10, atol=0)
    torch.testing.assert_close(res.total, (clip_factors(norms, c)[:, None] * rows).sum(0), rtol=1e-10, atol=1e-14)


def test_microbatches_equal_one_pass():
    case = _case("bert:all")
    norms = _ghost(case)(case.batch, None).norms
    c = _median_clip(norms)
    one = _ghost(case)(case.batch, c)
    parts = _ghost(case, microbatch=2)(case.batch, c)
    torch.testing.assert_close(parts.total, one.total, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(parts.norms, one.norms, rtol=1e-12, atol=0)


def test_model_state_is_left_as_it_was():
    case = _case("bert")
    case.model.train()
    flags = {n: p.requires_grad for n, p in case.model.named_parameters()}
    marker = torch.ones_like(case.model.get_parameter("classifier.weight"))
    case.model.get_parameter("classifier.weight").grad = marker
    _ghost(case)(case.batch, 1.0)
    assert case.model.training and all(m.training for m in case.model.modules())
    assert flags == {n: p.requires_grad for n, p in case.model.named_parameters()}
    assert case.model.get_parameter("classifier.weight").grad is marker
    assert all(p.grad is None for n, p in case.model.named_parameters() if n != "classifier.weight")


def test_empty_batch():
    case = _case("mlp")
    res = _ghost(case)({k: v[:0] for k, v in case.batch.items()}, 1.0)
    assert res.total.shape == (_ghost(case).p,) and not res.total.any() and res.norms.numel() == 0


# ---------------------------------------------------------------------- DP invariants
def _adversarial_mlp() -> Case:
    """The MLP with one example whose loss, and gradient, is weighted 1e4 times the others'."""
    case = _mlp()
    case.batch["w"] = torch.ones(6, dtype=torch.float64)
    case.batch["w"][2] = 1e4
    case.loss = lambda out, b: _ce(out, b) * b["w"]
    return case


@pytest.mark.parametrize("name", ["adversarial", "bert:all"])
def test_removing_one_example_moves_the_clipped_sum_by_at_most_c(name):
    """Sensitivity (add/remove adjacency): S(D) - S(D without i) = c_i g_i, of norm
    min(||g_i||, C) <= C; measured for every i, including an example with a huge gradient."""
    case = _adversarial_mlp() if name == "adversarial" else _case(name)
    ghost = _ghost(case)
    b = case.batch["labels"].shape[0]
    norms = ghost(case.batch, None).norms
    c = float(norms.double().median()) if name != "adversarial" else 0.5
    full = ghost(case.batch, c).total
    for i in range(b):
        keep = [j for j in range(b) if j != i]
        rest = ghost({k: v[keep] for k, v in case.batch.items()}, c).total
        moved = float((full - rest).norm())
        assert moved <= c * (1 + 1e-9)
        assert moved == pytest.approx(min(float(norms[i]), c), rel=1e-9)
    assert float(norms.max()) > 100 * c if name == "adversarial" else True


def test_replacing_one_example_moves_the_clipped_sum_by_at_most_2c():
    """Replace-one adjacency: c_i g_i - c'_i g'_i has norm <= 2C; an adversary that flips
    the label of the large-gradient example gets close to it."""
    case = _adversarial_mlp()
    ghost = _ghost(case)
    c = 0.5
    full = ghost(case.batch, c).total
    worst = 0.0
    for label in range(3):
        other = {k: v.clone() for k, v in case.batch.items()}
        other["x"][2] *= -1
        other["w"][2] = 3e4
        other["labels"][2] = label
        worst = max(worst, float((full - ghost(other, c).total).norm()))
    assert c < worst <= 2 * c * (1 + 1e-9)


# ---------------------------------------------------------------------- refusals
def test_refuses_unsupported_layer_naming_its_type():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).double()
    with pytest.raises(ValueError, match="layer type BatchNorm1d.*'1'.*vmap"):
        GhostClipping(model, lambda call, b: call(b["x"]), _ce, ["0.weight", "1.weight"])


def test_refuses_tied_weights():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    with pytest.raises(ValueError, match="tied weights"):
        GhostClipping(model, lambda call, b: call(b["t"]).mean(1), _ce, ["0.weight"])


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(torch.tanh(self.fc(x)))


class _Functional(nn.Module):
    """fc's weight also used by a functional call the module hooks never see."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + nn.functional.linear(x.tanh(), self.fc.weight)


class _InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).tanh_()


class _SharedInput(nn.Module):
    """A linear layer on an input shared by the whole batch (batch size 1), broadcast."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("bias_in", torch.randn(1, 4))

    def forward(self, x):
        return x + self.fc(self.bias_in)


@pytest.mark.parametrize(
    ("module", "match"),
    [(_Twice, "ran twice"), (_Functional, "used outside its layer"), (_InPlace, "in place"),
     (_SharedInput, "not one per example")],
    ids=["weight-sharing", "functional-use", "in-place", "shared-input"],
)
def test_refuses_what_it_would_get_wrong(module, match):
    torch.manual_seed(0)
    model = module().double()
    batch = {"x": torch.randn(5, 4, dtype=torch.float64), "labels": torch.randint(0, 4, (5,))}
    ghost = GhostClipping(model, lambda call, b: call(b["x"]), _ce, ["fc.weight", "fc.bias"])
    with pytest.raises(ValueError, match=match):
        ghost(batch, 1.0)


def test_probe_batch_refuses_at_construction():
    model = _Functional().double()
    batch = {"x": torch.randn(3, 4, dtype=torch.float64), "labels": torch.tensor([0, 1, 2])}
    with pytest.raises(ValueError, match="used outside its layer"):
        GhostClipping(model, lambda call, b: call(b["x"]), _ce, ["fc.weight"], probe_batch=batch)


def test_ghost_is_not_a_row_engine_and_stores_no_rows():
    case = _case("mlp")
    with pytest.raises(ValueError, match="no per-example rows"):
        PerExampleGradients(case.model, case.forward, case.loss, ["fc1.weight"], backend="ghost")
    with pytest.raises(ValueError, match="--mode batch"):
        TrainConfig(backend="ghost", mode="per-example")


# ---------------------------------------------------------------------- the trainer
def _rows(path):
    return GradientStore.open(path).read()


@pytest.mark.parametrize("clip", [0.05, 100.0], ids=["clipping", "not-clipping"])
def test_trainer_ghost_stores_the_rows_of_the_materialised_path(tmp_path, clip):
    """Same seed, same batches, same noise: rows and the trained weights agree to float32
    rounding (the noise added by the trainer is the same draw)."""
    base = dict(task="tiny", steps=6, batch_size=16, noise_multiplier=1.0, lr=0.05, optimizer="sgd",
                eval_every=0, log_every=3, checkpoint_every=3, microbatch=5, max_grad_norm=clip)
    runs = {}
    for backend in ("vmap", "ghost"):
        task = tiny_task()
        collect(CollectConfig(**base, backend=backend), out=tmp_path / backend, task=task)
        runs[backend] = (_rows(tmp_path / backend / "gradients.zarr"), task.model.state_dict())
    (rv, sv), (rg, sg) = runs["vmap"], runs["ghost"]
    assert rv.shape == rg.shape == (6, rv.shape[1])
    np.testing.assert_allclose(rg, rv, rtol=2e-5, atol=2e-6 * float(np.abs(rv).max()))
    for k in sv:
        torch.testing.assert_close(sg[k], sv[k], rtol=1e-5, atol=1e-6)


def test_trainer_refuses_hooks_that_need_rows(tmp_path):
    from gradspec.optim import AdaDPS
    from gradspec.train import train

    with pytest.raises(ValueError, match="adadps.*ghost"):
        train(TrainConfig(task="tiny", steps=2, batch_size=8, backend="ghost"), out=tmp_path / "r",
              task=tiny_task(), hooks=AdaDPS(rule="fixed", side_information=torch.ones(1)))


@pytest.mark.parametrize("algorithm", ["dp-sgd", "subspace", "pdp-sgd", "noisy-adagrad", "dp-adam"])
def test_retrain_sum_only_optimizers_run_on_ghost_as_on_vmap(tmp_path, algorithm):
    """The optimizers that read only the clipped sum (and public rows of their own) train the
    same weights with either engine."""
    from gradspec.optim import retrain
    from gradspec.tasks import make_task

    lowrank = dict(n=120, n_eval=60, d=16, r=3)
    options = {"rank": 2} if algorithm in ("subspace", "pdp-sgd", "noisy-adagrad") else {}
    if algorithm == "subspace":
        options["projector"] = "random"
    weights = {}
    for backend in ("vmap", "ghost"):
        config = CollectConfig(task="lowrank", task_options=lowrank, steps=6, batch_size=24, noise_multiplier=1.0,
                               optimizer="sgd", lr=0.3, eval_every=0, log_every=3, checkpoint_every=3,
                               accounting="rdp", microbatch=None, max_grad_norm=0.05, backend=backend)
        task = make_task("lowrank", seed=0, **lowrank)
        retrain(config=config, algorithm=algorithm, options=options, out=tmp_path / backend, task=task,
                train_metrics=False)
        weights[backend] = task.model.weight.detach().clone()
    assert weights["vmap"].abs().max() > 0
    torch.testing.assert_close(weights["ghost"], weights["vmap"], rtol=1e-5, atol=1e-6)


class _WithBatchNorm(nn.Module):
    """Tiny with a BatchNorm1d, a layer the ghost backend has no rule for."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.bn, self.fc = nn.Embedding(20, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.fc(self.bn(self.emb(tokens).mean(1)))


def test_auto_is_the_default_and_takes_ghost_where_it_applies_and_vmap_elsewhere(tmp_path, caplog):
    from gradspec.tasks import make_task

    assert TrainConfig().backend == "auto" and CollectConfig().backend == "auto"
    base = dict(steps=2, batch_size=8, noise_multiplier=1.0, eval_every=0, checkpoint_every=2)
    with_bn = tiny_task()
    with_bn.model = _WithBatchNorm()
    runs = {
        "ghost": (CollectConfig(task="tiny", **base), tiny_task()),  # Embedding, LayerNorm, Linear
        "ghost-cnn": (CollectConfig(task="cnn", task_options={"n_train": 32, "n_eval": 8}, **base),
                      make_task("cnn", n_train=32, n_eval=8)),  # Conv2d, Linear
        "vmap": (CollectConfig(task="tiny", **base), with_bn),  # BatchNorm1d
        "vmap-pe": (CollectConfig(task="tiny", mode="per-example", **base), tiny_task()),  # rows are stored
    }
    for name, (config, task) in runs.items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gradspec.train"):
            res = collect(config, out=tmp_path / name, task=task)
        stored = GradientStore.open(res.store).config
        want = name.partition("-")[0]
        assert stored["collect"]["backend"] == "auto" and stored["per_example_engine"] == want
        assert stored.get("ghost_check") is (True if want == "ghost" else None)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("per-example backend")]
        assert len(lines) == 1 and lines[0].startswith(f"per-example backend: {want} (auto: ")
        if name == "vmap":
            assert "BatchNorm1d" in lines[0]


@pytest.mark.slow
def test_minilm_float32_ghost_is_within_float32_rounding_of_a_float64_reference():
    """The offline default model (pretrained MiniLM, q/v weights, padded real batch): float64
    ghost equals float64 materialised rows; float32 ghost is within 1e-5 of them."""
    import copy

    from gradspec.tasks import make_task

    task = make_task("text")
    model = task.model.eval()
    names = select_parameters(model, task.params)
    batch = task.train.batch(torch.arange(8))
    m64 = copy.deepcopy(model).double()
    rows, _ = PerExampleGradients(m64, task.forward, task.loss, names, dtype=None)(batch)
    norms = rows.norm(dim=1)
    c = _median_clip(norms)
    want = (clip_factors(norms, c)[:, None] * rows).sum(0)
    got64 = GhostClipping(m64, task.forward, task.loss, names)(batch, c)
    torch.testing.assert_close(got64.norms, norms, rtol=1e-10, atol=0)
    assert float((got64.total - want).norm() / want.norm()) < 1e-10
    got32 = GhostClipping(model, task.forward, task.loss, names)(batch, c)
    assert float(((got32.norms.double() - norms).abs() / norms).max()) < 1e-5
    assert float((got32.total.double() - want).norm() / want.norm()) < 1e-5
