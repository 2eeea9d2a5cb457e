"""Ghost clipping of every layer type it handles, against a batch-of-one loop (float64):
convolutions, GPT-2 (transformers' Conv1D, a broadcast position embedding), RMSNorm,
GroupNorm, MultiheadAttention's projections; and the refusal of everything else by name."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import Tensor, nn

from gradspec.privacy import clip_factors
from gradspec.train import GhostClipping, select_parameters

from .test_per_example import Case, _ce, make_case, reference


# ---------------------------------------------------------------------- cases
class _Convs(nn.Module):
    """Conv2d with groups, dilation, reflect padding, 'same' padding with an even kernel, no
    bias; a depthwise Conv1d with circular padding and stride; GroupNorm and RMSNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2, padding_mode="reflect")
        self.c2 = nn.Conv2d(6, 8, 4, padding="same", bias=False)
        self.gn = nn.GroupNorm(2, 8)
        self.d1 = nn.Conv1d(8, 8, 3, stride=2, padding=2, groups=8, padding_mode="circular")
        self.d2 = nn.Conv1d(8, 12, 2)  # 3 positions: the ghost Gram path
        self.rms = nn.RMSNorm(12)
        self.head = nn.Linear(12, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.gn(self.c2(torch.tanh(self.c1(x)))))  # (B, 8, 5, 5)
        h = torch.tanh(self.d1(h.flatten(2)))  # (B, 8, 14)
        h = self.d2(h[..., ::3])  # (B, 12, 4)
        return self.head(self.rms(h.transpose(1, 2)).mean(1))


def _convs(gen: torch.Generator, dtype: torch.dtype) -> Case:
    batch = {"x": torch.randn(5, 4, 10, 10, generator=gen, dtype=dtype),
             "labels": torch.randint(0, 3, (5,), generator=gen)}
    return Case(_Convs().to(dtype), lambda call, b: call(b["x"]), ["*"], batch)


def _gpt2_model(tie: bool, dtype: torch.dtype) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
                        eos_token_id=0, tie_word_embeddings=tie, attn_implementation="eager")
    return GPT2LMHeadModel(config).to(dtype)


def _lm_loss(logits: Tensor, batch: dict[str, Tensor]) -> Tensor:
    """Per-example mean next-token cross-entropy."""
    ids = batch["input_ids"]
    tok = nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    return tok.mean(1)


def _gpt2(gen: torch.Generator, dtype: torch.dtype, tie: bool = False) -> Case:
    """GPT-2 (Conv1D projections, LayerNorms, token and broadcast position embeddings, an
    untied head), every parameter selected."""
    batch = {"input_ids": torch.randint(0, 100, (4, 9), generator=gen)}
    forward = lambda call, b: call(input_ids=b["input_ids"]).logits  # noqa: E731
    return Case(_gpt2_model(tie, dtype), forward, ["*"], batch, loss=_lm_loss)


class _Attention(nn.Module):
    """MultiheadAttention in its three projection paths: self-attention (batch first, the
    packed weight in one call), key = value (sequence first, two row blocks, no bias) and
    cross-attention with other key/value widths (q/k/v_proj_weight, a key padding mask,
    without attention weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.kv_attn = nn.MultiheadAttention(8, 2, bias=False)
        self.cross = nn.MultiheadAttention(8, 2, kdim=5, vdim=6, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor, mem: Tensor, kv: Tensor, pad: Tensor) -> Tensor:
        h, _ = self.self_attn(x, x, x)
        s = h.transpose(0, 1)  # (L, B, 8)
        kvs = torch.tanh(kv).transpose(0, 1)
        h = h + self.kv_attn(s, kvs, kvs)[0].transpose(0, 1)
        h = h + self.cross(h, mem[..., :5], mem, key_padding_mask=pad, need_weights=False)[0]
        return self.head(torch.tanh(h).mean(1))


def _attention(gen: torch.Generator, dtype: torch.dtype) -> Case:
    b = 5
    pad = torch.zeros(b, 4, dtype=torch.bool)
    pad[1, 2:] = True
    batch = {"x": torch.randn(b, 6, 8, generator=gen, dtype=dtype),
             "mem": torch.randn(b, 4, 6, generator=gen, dtype=dtype),
             "kv": torch.randn(b, 3, 8, generator=gen, dtype=dtype),
             "pad": pad, "labels": torch.randint(0, 3, (b,), generator=gen)}
    return Case(_Attention().to(dtype), lambda call, b: call(b["x"], b["mem"], b["kv"], b["pad"]), ["*"], batch)


def _encoder(gen: torch.Generator, dtype: torch.dtype) -> Case:
    """nn.TransformerEncoderLayer: attention (need_weights=False), Linear, LayerNorm."""
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    model = nn.Sequential(layer, nn.Flatten(), nn.Linear(40, 3)).to(dtype)
    batch = {"x": torch.randn(5, 5, 8, generator=gen, dtype=dtype), "labels": torch.randint(0, 3, (5,), generator=gen)}
    return Case(model, lambda call, b: call(b["x"]), ["*"], batch)


BUILDERS = {"convs": _convs, "gpt2": _gpt2, "attention": _attention, "encoder": _encoder}
CASES = ["cnn", *BUILDERS]


def _case(name: str, dtype: torch.dtype = torch.float64) -> Case:
    if name in BUILDERS:
        torch.manual_seed(0)
        return BUILDERS[name](torch.Generator().manual_seed(0), dtype)
    return make_case(name, dtype)


def _ghost(case: Case, **kw) -> GhostClipping:
    return GhostClipping(case.model, case.forward, case.loss, select_parameters(case.model, case.patterns), **kw)


# ---------------------------------------------------------------------- exactness
@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("name", CASES)
def test_norms_and_clipped_sum_match_batch_of_one_loop_float64(name):
    case = _case(name)
    ghost = _ghost(case)
    rows, losses = reference(case, ghost.names)
    norms = rows.norm(dim=1)
    c = float(norms.median())
    assert (norms > c).any() and (norms < c).any()
    res = ghost(case.batch, c)  # the first call also runs the batch-of-one probe
    want = (clip_factors(norms, c)[:, None] * rows).sum(0)
    torch.testing.assert_close(res.norms, norms, rtol=1e-10, atol=0)
    torch.testing.assert_close(res.total, want, rtol=1e-10, atol=1e-12 * float(want.norm()))
    torch.testing.assert_close(res.losses, losses, rtol=1e-12, atol=0)
    # each parameter's own rows (the one-hot book-keeping sum) are exact too
    for i in range(rows.shape[0]):
        one = torch.zeros(rows.shape[0], dtype=torch.float64)
        one[i] = 1
        ghost._capture(case.batch)
        got = ghost._weighted_sum(one, out=torch.zeros(ghost.p, dtype=torch.float64))
        ghost._release()
        torch.testing.assert_close(got, rows[i], rtol=1e-10, atol=1e-12 * float(rows[i].norm()))


@pytest.mark.parametrize("name", ["gpt2", "attention"])
def test_float32_is_within_float32_rounding(name):
    ref = _case(name)
    rows, _ = reference(ref, select_parameters(ref.model, ref.patterns))
    case = _case(name, torch.float32)
    case.batch = {k: (v.float() if v.is_floating_point() else v) for k, v in ref.batch.items()}
    norms = rows.norm(dim=1)
    c = float(norms.median())
    res = _ghost(case)(case.batch, c)
    want = (clip_factors(norms, c)[:, None] * rows).sum(0)
    assert res.norms.dtype == torch.float64 and res.total.dtype == torch.float32
    assert float(((res.norms.double() - norms).abs() / norms).max()) < 1e-5
    assert float((res.total.double() - want).norm() / want.norm()) < 1e-5


def test_gpt2_position_ids_are_one_row_for_the_batch_and_its_layers_take_the_rules_claimed():
    case = _case("gpt2")
    seen = []
    hook = case.model.transformer.wpe.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape)))
    case.forward(case.model, case.batch)
    hook.remove()
    assert seen == [(1, 9)]  # broadcast over the batch of 4: the rule expands it (norms exact above)
    rules = {layer.name: layer.rule for layer in _ghost(case)._layers}
    assert rules["transformer.h.0.attn.c_attn"].transposed and rules["transformer.h.1.mlp.c_proj"].transposed
    assert not rules["lm_head"].transposed
    assert {type(rules[n]).__name__ for n in ("transformer.wpe", "transformer.wte", "transformer.ln_f")} == {
        "EmbeddingRule", "LayerNormRule"}


def test_microbatches_equal_one_pass():
    case = _case("attention")
    one = _ghost(case)(case.batch, 0.5)
    parts = _ghost(case, microbatch=2)(case.batch, 0.5)
    torch.testing.assert_close(parts.total, one.total, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(parts.norms, one.norms, rtol=1e-12, atol=0)


def test_attention_leaves_f_linear_and_the_fast_path_as_they_were():
    linear, fast = nn.functional.linear, torch.backends.mha.get_fastpath_enabled()
    case = _case("encoder")
    _ghost(case)(case.batch, 1.0)
    bad = {**case.batch, "x": case.batch["x"][:, :4]}  # the head's Linear(40, 3) fails mid-forward
    with pytest.raises(RuntimeError):
        _ghost(case, check=False)(bad, 1.0)
    assert nn.functional.linear is linear and torch.backends.mha.get_fastpath_enabled() is fast


# ---------------------------------------------------------------------- refusals
class _OwnForward(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) * 2


class _SameForward(nn.Linear):
    pass


@pytest.mark.parametrize(
    ("layer", "match"),
    [(nn.BatchNorm1d(4), "layer type BatchNorm1d.*Conv1D.*vmap"),
     (nn.Bilinear(4, 4, 4), "layer type Bilinear"),
     (_OwnForward(4, 4), "Linear subclass with its own forward.*vmap")],
    ids=["batchnorm", "bilinear", "subclass-own-forward"],
)
def test_refuses_other_layers_by_name(layer, match):
    model = nn.Sequential(layer).double()
    with pytest.raises(ValueError, match=match):
        GhostClipping(model, lambda call, b: call(b["x"]), _ce, ["0.weight"])


def test_a_subclass_that_keeps_the_forward_takes_its_bases_rule():
    torch.manual_seed(0)
    case = Case(nn.Sequential(_SameForward(4, 3)).double(), lambda call, b: call(b["x"]), ["*"],
                {"x": torch.randn(5, 4, dtype=torch.float64), "labels": torch.randint(0, 3, (5,))})
    rows, _ = reference(case, ["0.weight", "0.bias"])
    torch.testing.assert_close(_ghost(case)(case.batch, None).norms, rows.norm(dim=1), rtol=1e-10, atol=0)


def test_refuses_attention_bias_kv():
    model = nn.Sequential(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="bias_k.*add_bias_kv"):
        GhostClipping(model, lambda call, b: call(b["x"]), _ce, ["0.bias_k"])


def test_refuses_gpt2_tied_embedding():
    case = _gpt2(torch.Generator().manual_seed(0), torch.float64, tie=True)
    with pytest.raises(ValueError, match="tied weights"):
        _ghost(case)


def test_refuses_unbatched_attention_input():
    class Unbatched(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(4, 1)

        def forward(self, x: Tensor) -> Tensor:  # attends over the batch as a sequence
            return self.attn(x, x, x)[0]

    model = Unbatched().double()
    batch = {"x": torch.randn(5, 4, dtype=torch.float64), "labels": torch.randint(0, 4, (5,))}
    ghost = GhostClipping(model, lambda call, b: call(b["x"]), _ce, ["attn.in_proj_weight"], check=False)
    with pytest.raises(ValueError, match="not one per example"):
        ghost(batch, 1.0)


# ---------------------------------------------------------------------- check=False
def test_check_false_warns_naming_what_is_unchecked(caplog):
    case = _case("cnn")
    with caplog.at_level(logging.WARNING, logger="gradspec.train._ghost"):
        ghost = _ghost(case, check=False)
    assert not ghost.check
    assert "check=False" in caplog.text and "used outside its layer" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gradspec.train._ghost"):
        assert _ghost(case).check
    assert not caplog.text
