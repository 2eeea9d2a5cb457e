"""Per-example gradients against a batch-of-one reference loop (float64), both backends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from gradspec._enums import PerExampleBackend
from gradspec.train import (
    PerExampleGradients,
    attention_is_causal,
    attention_mask_4d,
    layout_for,
    select_parameters,
)

BACKENDS = [PerExampleBackend.VMAP, PerExampleBackend.HOOKS]


def _ce(out: Tensor, batch: dict[str, Tensor]) -> Tensor:
    return nn.functional.cross_entropy(out, batch["labels"], reduction="none")


# ---------------------------------------------------------------------- cases
@dataclass
class Case:
    model: nn.Module
    forward: Callable
    patterns: list[str]
    batch: dict[str, Tensor]
    loss: Callable = _ce


def _bert(gen: torch.Generator, dtype: torch.dtype) -> Case:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        vocab_size=100, max_position_embeddings=64, attn_implementation="eager",
    )
    model = BertForSequenceClassification(config).to(dtype)
    b, t = 5, 12
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 7:] = 0
    mask[3, 4:] = 0
    batch = {
        "input_ids": torch.randint(0, 100, (b, t), generator=gen),
        "attention_mask": mask,
        "labels": torch.randint(0, 2, (b,), generator=gen),
    }

    causal = attention_is_causal(model)  # False: BERT is an encoder

    def forward(call, batch):  # a 4D mask: transformers' 2D-mask path branches on values
        mask4 = attention_mask_4d(batch["attention_mask"], dtype, causal=causal)
        return call(input_ids=batch["input_ids"], attention_mask=mask4).logits

    return Case(model, forward, ["*.query.weight", "*.value.weight"], batch)


def _cnn(gen: torch.Generator, dtype: torch.dtype) -> Case:
    """The CNN of PDP-SGD (Zhou et al. 2021) on 28x28 images."""
    model = nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Flatten(), nn.Linear(512, 32), nn.Tanh(), nn.Linear(32, 10),
    ).to(dtype)
    batch = {
        "x": torch.randn(5, 1, 28, 28, generator=gen, dtype=dtype),
        "labels": torch.randint(0, 10, (5,), generator=gen),
    }
    return Case(model, lambda call, b: call(b["x"]), ["*"], batch)


class _EmbedLN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.norm(self.embed(tokens)).mean(1))


def _embed_ln(gen: torch.Generator, dtype: torch.dtype) -> Case:
    batch = {
        "tokens": torch.randint(0, 20, (6, 4), generator=gen),
        "labels": torch.randint(0, 3, (6,), generator=gen),
    }
    patterns = ["embed.weight", "norm.*", "head.weight"]  # head.bias stays a constant
    return Case(_EmbedLN().to(dtype), lambda call, b: call(b["tokens"]), patterns, batch)


CASES = {"bert": _bert, "cnn": _cnn, "embed_ln": _embed_ln}


@pytest.fixture(params=sorted(CASES))
def case_name(request) -> str:
    return request.param


def make_case(name: str, dtype: torch.dtype = torch.float64, seed: int = 0) -> Case:
    torch.manual_seed(seed)
    return CASES[name](torch.Generator().manual_seed(seed), dtype)


def reference(case: Case, names: list[str]) -> tuple[Tensor, Tensor]:
    """Rows by a loop over batches of one with torch.autograd.grad (model in eval)."""
    case.model.eval()
    params = [case.model.get_parameter(n) for n in names]
    n = next(iter(case.batch.values())).shape[0]
    rows, losses = [], []
    for i in range(n):
        one = {k: v[i : i + 1] for k, v in case.batch.items()}
        loss = case.loss(case.forward(case.model, one), one).sum()
        grads = torch.autograd.grad(loss, params)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
        losses.append(loss.detach())
    return torch.stack(rows), torch.stack(losses)


def build(case: Case, backend, **kw) -> PerExampleGradients:
    names = select_parameters(case.model, case.patterns)
    return PerExampleGradients(case.model, case.forward, case.loss, names, backend=backend, **kw)


# ---------------------------------------------------------------------- correctness
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_matches_batch_of_one_loop_float64(case_name, backend):
    case = make_case(case_name)
    pe = build(case, backend, dtype=None)
    grads, losses = pe(case.batch)
    want, want_losses = reference(case, pe.names)
    assert grads.dtype == torch.float64 and grads.shape == want.shape == (len(want), pe.p)
    assert want.abs().max() > 1e-4  # the check below is not vacuous
    torch.testing.assert_close(grads, want, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(losses, want_losses, rtol=1e-9, atol=1e-12)
    assert not losses.requires_grad and not grads.requires_grad


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_float32_rows_match_loop(case_name, backend):
    case = make_case(case_name, torch.float32)
    grads, _ = build(case, backend)(case.batch)
    want, _ = reference(case, select_parameters(case.model, case.patterns))
    assert grads.dtype == torch.float32
    rel = (grads - want).norm(dim=1) / want.norm(dim=1)
    assert rel.max() < 1e-5


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_microbatches_equal_one_pass(case_name, backend):
    case = make_case(case_name)
    whole, whole_losses = build(case, backend, dtype=None)(case.batch)
    pe = build(case, backend, dtype=None, microbatch=2)
    parts = list(pe.iter_microbatches(case.batch))
    n = whole.shape[0]
    assert [g.shape[0] for g, _ in parts] == [2] * (n // 2) + [1] * (n % 2)
    grads, losses = pe(case.batch)
    torch.testing.assert_close(grads, whole, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(losses, whole_losses, rtol=1e-9, atol=1e-12)


def test_backends_agree_on_plain_bert_mask():
    """Hooks accept the usual 2D mask; its rows equal vmap's with the 4D mask."""
    case = make_case("bert")
    vmap_rows, _ = build(case, "vmap", dtype=None)(case.batch)

    def forward_2d(call, batch):
        return call(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits

    names = select_parameters(case.model, case.patterns)
    hooks = PerExampleGradients(case.model, forward_2d, _ce, names, backend="hooks", dtype=None)
    torch.testing.assert_close(hooks(case.batch)[0], vmap_rows, rtol=1e-6, atol=1e-9)
    vmap_2d = PerExampleGradients(case.model, forward_2d, _ce, names, backend="vmap")
    with pytest.raises(ValueError, match="4D attention mask"):
        vmap_2d(case.batch)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_clipped_sum(backend):
    case = make_case("cnn")
    pe = build(case, backend, dtype=None, microbatch=2)
    rows, losses = pe(case.batch)
    norms = rows.norm(dim=1)
    max_norm = float(norms.median())  # some rows clipped, some not
    total, got_norms, got_losses = pe.clipped_sum(case.batch, max_norm)
    want = (rows * (max_norm / (norms + 1e-6)).clamp(max=1)[:, None]).sum(0)
    torch.testing.assert_close(total, want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got_norms, norms)
    torch.testing.assert_close(got_losses, losses)
    with pytest.raises(ValueError, match="max_norm"):
        pe.clipped_sum(case.batch, 0.0)


# ---------------------------------------------------------------------- layout and state
def test_only_selected_parameters_in_layout_order():
    case = make_case("embed_ln")
    names = select_parameters(case.model, ["head.weight", "embed.*"])  # given out of order
    assert names == ["embed.weight", "head.weight"]
    pe = PerExampleGradients(case.model, case.forward, case.loss, names[::-1], dtype=None)
    assert pe.names == names and pe.layout == layout_for(case.model, names)
    assert pe.p == 20 * 8 + 3 * 8
    grads, _ = pe(case.batch)
    want, _ = reference(case, names)
    for spec in pe.layout.params:
        block = grads[:, spec.offset : spec.stop]
        torch.testing.assert_close(block, want[:, spec.offset : spec.stop], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_model_state_restored(backend):
    case = make_case("embed_ln")
    model = case.model
    model.train()
    model.norm.eval()
    model.head.bias.requires_grad_(False)
    model.embed.weight.requires_grad_(False)  # selected, yet frozen by someone: restored
    old_grad = torch.ones_like(model.head.weight)
    model.head.weight.grad = old_grad
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    modes = {n: m.training for n, m in model.named_modules()}
    build(case, backend)(case.batch)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert {n: m.training for n, m in model.named_modules()} == modes
    assert model.head.weight.grad is old_grad and model.norm.weight.grad is None
    assert not any(hasattr(p, "grad_sample") for p in model.parameters())


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_dropout_off_by_default(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.5), nn.Linear(16, 3)).double().train()
    batch = {"x": torch.randn(4, 6, dtype=torch.float64), "labels": torch.tensor([0, 1, 2, 0])}
    case = Case(model, lambda call, b: call(b["x"]), ["*"], batch)
    pe = build(case, backend, dtype=None)
    first, _ = pe(batch)
    torch.testing.assert_close(pe(batch)[0], first, rtol=0, atol=0)
    assert model.training
    torch.testing.assert_close(first, reference(case, pe.names)[0], rtol=1e-6, atol=1e-9)
    noisy = build(case, backend, dtype=None, train_mode=True)
    assert not torch.allclose(noisy(batch)[0], first)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_empty_batch(backend):
    case = make_case("embed_ln")
    pe = build(case, backend)
    empty = {k: v[:0] for k, v in case.batch.items()}
    grads, losses = pe(empty)
    assert grads.shape == (0, pe.p) and losses.shape == (0,)
    total, norms, _ = pe.clipped_sum(empty, 1.0)
    assert total.shape == (pe.p,) and not total.any() and norms.shape == (0,)


# ---------------------------------------------------------------------- errors
def test_bad_patterns_and_names():
    model = make_case("embed_ln").model
    with pytest.raises(ValueError, match=r"matches.*embed\.weight"):
        select_parameters(model, ["*.query.weight"])
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        layout_for(model, ["nope"])
    with pytest.raises(ValueError, match="no parameter 'nope'"):
        PerExampleGradients(model, lambda c, b: c(b["tokens"]), _ce, ["head.weight", "nope"])
    with pytest.raises(ValueError, match="per-example backend.*vmap, hooks"):
        PerExampleGradients(model, lambda c, b: c(b["tokens"]), _ce, ["head.weight"], backend="x")
    with pytest.raises(ValueError, match="microbatch"):
        PerExampleGradients(model, lambda c, b: c(b["tokens"]), _ce, ["head.weight"], microbatch=0)


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight


def test_hooks_reject_unsupported_layer_vmap_handles_it():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), _Scale()).double()
    batch = {"x": torch.randn(5, 4, dtype=torch.float64), "labels": torch.tensor([0, 1, 2, 0, 1])}
    case = Case(model, lambda call, b: call(b["x"]), ["*"], batch)
    with pytest.raises(ValueError, match="_Scale.*backend='vmap'"):
        build(case, "hooks")
    bn = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    with pytest.raises(ValueError, match="BatchNorm1d"):
        PerExampleGradients(bn, case.forward, _ce, ["1.weight"], backend="hooks")
    grads, _ = build(case, "vmap", dtype=None)(batch)
    torch.testing.assert_close(grads, reference(case, ["0.weight", "0.bias", "1.weight"])[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_cuda_matches_cpu(backend):
    case = make_case("cnn")
    want, want_losses = build(case, backend, dtype=None)(case.batch)
    case.model.cuda()
    case.batch = {k: v.cuda() for k, v in case.batch.items()}
    grads, losses = build(case, backend, dtype=None)(case.batch)
    assert grads.device.type == "cuda"
    torch.testing.assert_close(grads.cpu(), want, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(losses.cpu(), want_losses, rtol=1e-9, atol=1e-12)
