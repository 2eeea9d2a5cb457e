"""Per-example gradients that are not per-example, and masks that change the model, are refused.

Issue 13 §1: a DP run that clips a batch sum as one example, or differentiates a model other
than the one it trains, reports a wrong epsilon with exit code 0. Each test here failed on the
code before the checks: it either returned such rows silently or raised an unrelated error.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from gradspec.train import (
    PerExampleGradients,
    additive_attention_mask,
    attention_is_causal,
    attention_mask_4d,
)

transformers = pytest.importorskip("transformers")

F64 = torch.float64
WPE = "transformer.wpe.weight"


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def _ce(out: Tensor, batch: dict[str, Tensor]) -> Tensor:
    return nn.functional.cross_entropy(out, batch["labels"], reduction="none")


def _loop(model: nn.Module, names: list[str], examples: list[dict[str, Tensor]], forward, loss):
    """Rows by torch.autograd.grad on each example alone (a batch of one), model in eval."""
    model.eval()
    params = [model.get_parameter(n) for n in names]
    rows = []
    for one in examples:
        grads = torch.autograd.grad(loss(forward(model, one), one).sum(), params)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows)


def _split(batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
    n = next(iter(batch.values())).shape[0]
    return [{k: v[i : i + 1] for k, v in batch.items()} for i in range(n)]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ---------------------------------------------------------------------- tiny models
def _gpt2_config(attn: str = "eager", **kw):
    return transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        n_positions=64,
        vocab_size=100,
        attn_implementation=attn,
        **kw,
    )


def _bert_config(**kw):
    return transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=64,
        attn_implementation="eager",
        **kw,
    )


def _gpt2_lm() -> nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(_gpt2_config()).to(F64).eval()


def _lm_forward(call, batch):
    return call(input_ids=batch["input_ids"]).logits


def _lm_loss(out: Tensor, batch: dict[str, Tensor]) -> Tensor:
    """Next-token cross-entropy summed over each sequence: (B,)."""
    targets = batch["input_ids"][:, 1:]
    return nn.functional.cross_entropy(out[:, :-1].transpose(1, 2), targets, reduction="none").sum(
        1
    )


def _lm_batch(b: int = 6, t: int = 10) -> dict[str, Tensor]:
    return {"input_ids": torch.randint(1, 100, (b, t), generator=torch.Generator().manual_seed(1))}


# ---------------------------------------------------------------------- 1. rows per example
@pytest.mark.parametrize("microbatch", [None, 3], ids=["whole", "microbatch3"])
@pytest.mark.parametrize("check", [True, False], ids=["probe", "no-probe"])
def test_hooks_refuse_gpt2_position_embedding(microbatch, check):
    """Opacus gives wpe one summed row (position ids have batch size 1): refused by name."""
    model, batch = _gpt2_lm(), _lm_batch()
    pe = PerExampleGradients(
        model, _lm_forward, _lm_loss, [WPE], backend="hooks", microbatch=microbatch, check=check
    )
    with pytest.raises(ValueError, match=r"'transformer\.wpe\.weight'.*backend='vmap'") as err:
        pe(batch)
    assert "not one row per example" in _one_line(err)
    with pytest.raises(ValueError, match="wpe"):
        pe.clipped_sum(batch, 1.0)


def test_hooks_refuse_gpt2_position_embedding_at_construction():
    model, batch = _gpt2_lm(), _lm_batch()
    with pytest.raises(ValueError, match=r"'transformer\.wpe\.weight'.*backend='vmap'") as err:
        PerExampleGradients(model, _lm_forward, _lm_loss, [WPE], backend="hooks", probe_batch=batch)
    _one_line(err)
    with pytest.raises(ValueError, match="at least 2 examples"):
        PerExampleGradients(model, _lm_forward, _lm_loss, [WPE], probe_batch=_lm_batch(b=1))


def test_hooks_refuse_bert_position_embedding():
    """BERT's position ids are a (1, T) buffer: the same summed row."""
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_bert_config()).to(F64)
    batch = {**_lm_batch(b=4), "labels": torch.tensor([0, 1, 1, 0])}
    name = "bert.embeddings.position_embeddings.weight"
    pe = PerExampleGradients(
        model, _lm_forward, _ce, [name], backend="hooks", dtype=None, check=False
    )
    with pytest.raises(ValueError, match=r"position_embeddings\.weight'.*backend='vmap'") as err:
        pe(batch)
    _one_line(err)


@pytest.mark.parametrize("microbatch", [None, 4], ids=["whole", "microbatch4"])
def test_vmap_position_embedding_matches_batch_of_one_loop(microbatch):
    model, batch = _gpt2_lm(), _lm_batch()
    names = [WPE, "transformer.h.0.attn.c_attn.weight"]
    pe = PerExampleGradients(
        model, _lm_forward, _lm_loss, names, backend="vmap", dtype=None, microbatch=microbatch
    )
    rows, _ = pe(batch)
    want = _loop(model, names, _split(batch), _lm_forward, _lm_loss)
    assert rows.shape == want.shape == (6, pe.p)
    assert want[:, : 64 * 32].abs().max() > 1e-3  # wpe's block is not vacuous
    torch.testing.assert_close(rows, want, rtol=1e-9, atol=1e-12)
    # the row Opacus gives wpe is the batch sum, 3.6x off any one example's row
    wpe_rows = want[:, : 64 * 32]
    assert (wpe_rows.sum(0) - wpe_rows[0]).norm() > wpe_rows[0].norm()


def test_hooks_refuse_tied_weight_at_construction():
    model = _gpt2_lm()  # lm_head.weight is transformer.wte.weight
    with pytest.raises(ValueError, match=r"'transformer\.wte\.weight'.*'lm_head\.weight'") as err:
        PerExampleGradients(
            model, _lm_forward, _lm_loss, ["transformer.wte.weight"], backend="hooks"
        )
    assert "backend='vmap'" in _one_line(err)


@pytest.mark.parametrize("backend", ["hooks", "vmap"])
def test_batch_mean_loss_refused(backend):
    """Under hooks a mean scales every row by 1/B; both backends demand (B,) losses."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).to(F64)
    batch = {"x": torch.randn(5, 4, dtype=F64), "labels": torch.tensor([0, 1, 2, 0, 1])}

    def mean_loss(out, b):
        return nn.functional.cross_entropy(out, b["labels"])

    pe = PerExampleGradients(
        model, lambda c, b: c(b["x"]), mean_loss, ["0.weight"], backend=backend
    )
    with pytest.raises(ValueError, match=r"one value per example.*reduction='none'") as err:
        pe(batch)
    _one_line(err)


class _ReusedWeight(nn.Module):
    """``lin.weight`` also used outside ``lin``'s forward, where Opacus's hooks cannot see it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.lin(x) + x @ self.lin.weight.T))


@pytest.mark.parametrize("check", [True, False], ids=["probe", "no-probe"])
def test_hooks_rows_must_add_up_to_batch_gradient(check):
    torch.manual_seed(0)
    model = _ReusedWeight().to(F64)
    batch = {"x": torch.randn(5, 4, dtype=F64), "labels": torch.tensor([0, 1, 2, 0, 1])}
    forward = lambda c, b: c(b["x"])  # noqa: E731
    hooks = PerExampleGradients(model, forward, _ce, ["lin.weight"], backend="hooks", check=check)
    with pytest.raises(ValueError, match=r"'lin\.weight'.*do not add up.*backend='vmap'") as err:
        hooks(batch)
    _one_line(err)
    vmap = PerExampleGradients(model, forward, _ce, ["lin.weight"], dtype=None)
    want = _loop(model, ["lin.weight"], _split(batch), forward, _ce)
    torch.testing.assert_close(vmap(batch)[0], want, rtol=1e-9, atol=1e-12)


def test_probe_refuses_rows_that_depend_on_other_examples():
    """A batch-coupled forward: right shape, right sum, but no row is one example's gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).to(F64)
    batch = {"x": torch.randn(5, 4, dtype=F64), "labels": torch.tensor([0, 1, 2, 0, 1])}

    def coupled(call, b):
        out = call(b["x"])
        return out - 0.5 * out.mean(0, keepdim=True)

    pe = PerExampleGradients(model, coupled, _ce, ["0.weight"], backend="hooks", dtype=None)
    with pytest.raises(ValueError, match=r"'0\.weight'.*differ from each example.*vmap") as err:
        pe(batch)
    _one_line(err)
    with pytest.raises(ValueError, match="differ from each example"):
        PerExampleGradients(model, coupled, _ce, ["0.weight"], backend="hooks", probe_batch=batch)
    unchecked = PerExampleGradients(
        model, coupled, _ce, ["0.weight"], backend="hooks", dtype=None, check=False
    )
    assert unchecked(batch)[0].shape == (5, 12)  # the documented opt-out


@pytest.mark.parametrize("backend", ["hooks", "vmap"])
def test_train_mode_with_batch_norm_refused(backend):
    """In train mode BatchNorm normalizes over the batch: rows coupled, running stats moved."""
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    with pytest.raises(ValueError, match=r"BatchNorm1d layer '1'.*train_mode=False") as err:
        PerExampleGradients(
            model, lambda c, b: c(b["x"]), _ce, ["2.weight"], backend=backend, train_mode=True
        )
    _one_line(err)


def test_row_check_names_the_parameter_for_vmap_too():
    model = nn.Sequential(nn.Linear(4, 3))
    pe = PerExampleGradients(model, lambda c, b: c(b["x"]), _ce, ["0.weight", "0.bias"])
    pe._check_rows([torch.zeros(4, 3, 4), torch.zeros(4, 3)], 4)  # right: passes
    with pytest.raises(ValueError, match=r"'0\.bias' from backend 'vmap' has shape \(1, 3\)"):
        pe._check_rows([torch.zeros(4, 3, 4), torch.zeros(1, 3)], 4)


# ---------------------------------------------------------------------- 2. masks
LENGTHS = [9, 5, 7, 3]  # right padding to 9


def _gpt2_classifier(attn: str = "eager") -> nn.Module:
    torch.manual_seed(0)
    config = _gpt2_config(attn, pad_token_id=0)
    return transformers.GPT2ForSequenceClassification(config).to(F64).eval()


def _padded_batch() -> dict[str, Tensor]:
    t = max(LENGTHS)
    mask = (torch.arange(t)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(1, 100, (len(LENGTHS), t), generator=torch.Generator().manual_seed(2))
    return {"input_ids": ids * mask, "attention_mask": mask, "labels": torch.tensor([0, 1, 1, 0])}


def _unpadded_examples(batch: dict[str, Tensor]) -> list[dict[str, Tensor]]:
    """Each example alone at its true length, without a mask."""
    return [
        {"input_ids": batch["input_ids"][i : i + 1, :n], "labels": batch["labels"][i : i + 1]}
        for i, n in enumerate(LENGTHS)
    ]


def _forward_with(causal: bool):
    def forward(call, batch):
        mask = attention_mask_4d(batch["attention_mask"], F64, causal=causal)
        return call(input_ids=batch["input_ids"], attention_mask=mask).logits

    return forward


GPT2_NAMES = [WPE, "transformer.h.0.attn.c_attn.weight", "transformer.h.1.attn.c_attn.weight"]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("how", ["helper", "text-task"])
def test_gpt2_padded_rows_equal_unpadded_loop(how, attn):
    from gradspec.tasks.text import _TextForward

    model, batch = _gpt2_classifier(attn), _padded_batch()
    assert attention_is_causal(model)
    forward = _forward_with(causal=True) if how == "helper" else _TextForward(model)
    pe = PerExampleGradients(model, forward, _ce, GPT2_NAMES, dtype=None)
    rows, losses = pe(batch)
    plain = lambda m, b: m(input_ids=b["input_ids"]).logits  # noqa: E731
    want = _loop(model, GPT2_NAMES, _unpadded_examples(batch), plain, _ce)
    assert want.abs().max() > 1e-3
    torch.testing.assert_close(rows, want, rtol=1e-8, atol=1e-10)
    assert (rows - want).abs().max() < 1e-10


def test_padding_only_mask_changes_a_causal_model():
    """The encoder mask on GPT-2 drops causality: the gradients of another model."""
    model, batch = _gpt2_classifier(), _padded_batch()
    plain = lambda m, b: m(input_ids=b["input_ids"]).logits  # noqa: E731
    want = _loop(model, GPT2_NAMES, _unpadded_examples(batch), plain, _ce)
    for forward in (_forward_with(causal=False), _encoder_only_forward):
        rows, _ = PerExampleGradients(model, forward, _ce, GPT2_NAMES, dtype=None)(batch)
        assert ((rows - want).norm(dim=1) / want.norm(dim=1)).max() > 1e-2


def _encoder_only_forward(call, batch):
    mask = additive_attention_mask(batch["attention_mask"], F64)
    return call(input_ids=batch["input_ids"], attention_mask=mask).logits


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_4d_mask_equals_the_models_own_2d_mask(arch):
    """Outside vmap the model builds its own mask from the 2D one; ours gives the same logits."""
    torch.manual_seed(0)
    if arch == "gpt2":
        model = _gpt2_classifier()
    else:
        model = transformers.BertForSequenceClassification(_bert_config()).to(F64).eval()
    batch = _padded_batch()
    own = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    causal = attention_is_causal(model)
    assert causal == (arch == "gpt2")
    mask = attention_mask_4d(batch["attention_mask"], F64, causal=causal)
    ours = model(input_ids=batch["input_ids"], attention_mask=mask).logits
    torch.testing.assert_close(ours, own, rtol=1e-10, atol=1e-12)
    wrong = attention_mask_4d(batch["attention_mask"], F64, causal=not causal)
    assert not torch.allclose(model(input_ids=batch["input_ids"], attention_mask=wrong).logits, own)


def test_attention_mask_4d_pattern():
    mask = torch.tensor([[1, 1, 0]])
    lo = torch.finfo(torch.float32).min
    causal = attention_mask_4d(mask, torch.float32, causal=True)
    keep = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert causal.shape == (1, 1, 3, 3) and causal.dtype == torch.float32
    assert torch.equal(causal[0, 0], torch.where(keep, 0.0, lo))
    enc = attention_mask_4d(mask, torch.float32, causal=False)
    assert enc.shape == (1, 1, 1, 3) and torch.equal(enc[0, 0, 0], torch.tensor([0.0, 0.0, lo]))
    assert torch.equal(additive_attention_mask(mask, torch.float32), enc)


def test_attention_is_causal_rules_and_measurement():
    from gradspec._attention import _measured_causal

    torch.manual_seed(0)
    gpt2 = _gpt2_classifier()
    bert = transformers.BertForSequenceClassification(_bert_config())
    bert_decoder = transformers.BertModel(_bert_config(is_decoder=True))
    assert attention_is_causal(gpt2) and attention_is_causal(bert_decoder)
    assert not attention_is_causal(bert)
    # the measurement (rule 4, for models without is_causal flags) agrees
    assert _measured_causal(gpt2) and _measured_causal(bert_decoder)
    assert not _measured_causal(bert)
    bloom = transformers.BloomForSequenceClassification(
        transformers.BloomConfig(hidden_size=32, n_layer=1, n_head=2, vocab_size=100)
    )
    assert not any(hasattr(m, "is_causal") for m in bloom.modules())
    assert attention_is_causal(bloom)


def test_vmap_error_points_to_the_causal_mask():
    """GPT-2 with SDPA asks `padding_mask.all()` of its 2D mask (eager GPT-2 vmaps it fine)."""
    model, batch = _gpt2_classifier("sdpa"), _padded_batch()

    def forward_2d(call, b):
        return call(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits

    pe = PerExampleGradients(model, forward_2d, _ce, [WPE])
    with pytest.raises(ValueError, match="attention_mask_4d") as err:
        pe(batch)
    text = _one_line(err)
    assert "causal=attention_is_causal(model)" in text and "GPT-2" in text
    assert "additive_attention_mask" not in text
