"""A text batch is cut to its own longest example (``TensorData.sequences``): which positions
go, and that logits and per-example gradients are those of the fully padded batch."""

from __future__ import annotations

import pytest
import torch

from gradspec.tasks import Task, TensorData, make_task
from gradspec.tasks._base import trim_padding

from ._helpers import loop_grads, vmap_grads


def test_only_trailing_positions_padded_in_every_row_go() -> None:
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    ids = torch.arange(12).view(2, 6)
    out = trim_padding({"attention_mask": mask, "input_ids": ids}, "attention_mask")
    assert out["attention_mask"].tolist() == [[1, 1, 0, 1], [1, 0, 0, 0]]  # the inner 0 column stays
    assert out["input_ids"].tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]]
    left = {"attention_mask": torch.tensor([[0, 1, 1], [0, 0, 1]])}
    assert trim_padding(left, "attention_mask") is left  # left padding: nothing trailing to cut
    empty = trim_padding({"attention_mask": torch.zeros(2, 5, dtype=torch.long)}, "attention_mask")
    assert empty["attention_mask"].shape == (2, 1)  # one position is always kept


def test_a_dataset_trims_its_batches_and_keeps_the_rule_in_subsets() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    data = TensorData({"attention_mask": mask, "input_ids": mask * 7, "labels": torch.tensor([0, 1, 0])},
                      sequences=("attention_mask", "input_ids"))
    assert data.batch([1, 2])["input_ids"].shape == (2, 2)
    assert data.batch([1, 2])["labels"].tolist() == [1, 0]
    assert data.batch(slice(None))["attention_mask"].shape == (3, 3)
    sub = data.subset([2])
    assert sub.sequences == data.sequences and sub.tensors["input_ids"].shape == (1, 1)
    with pytest.raises(ValueError, match="sequences must name"):
        TensorData({"attention_mask": mask, "labels": torch.tensor([0, 1, 0])}, sequences=("attention_mask", "labels"))
    with pytest.raises(ValueError, match="sequences must name"):
        TensorData({"attention_mask": mask}, sequences=("input_ids",))


def test_the_text_task_trims_longest_padding_and_keeps_max_length() -> None:
    longest = make_task("text", model="tiny-bert", n_train=64, n_eval=8, n_public=0)
    fixed = make_task("text", model="tiny-bert", n_train=64, n_eval=8, n_public=0, padding="max_length",
                      max_length=40)
    assert longest.train.sequences[0] == "attention_mask" and fixed.train.sequences == ()
    assert fixed.train.batch([0, 1])["input_ids"].shape[1] == 40
    lengths = longest.train.tensors["attention_mask"].sum(1)
    short = lengths.argsort()[:4]
    assert longest.train.batch(short)["input_ids"].shape[1] == int(lengths[short].max())


def _padded_and_trimmed(task: Task, index: torch.Tensor) -> tuple[dict, dict]:
    full = {k: v[index] for k, v in task.train.tensors.items()}
    return full, task.train.batch(index)


def _check_exact(task: Task, index: torch.Tensor) -> None:
    task.model.double()
    full, cut = _padded_and_trimmed(task, index)
    assert cut["input_ids"].shape[1] < full["input_ids"].shape[1]  # something was cut
    model = task.model.eval()
    torch.testing.assert_close(task.forward(model, cut), task.forward(model, full), rtol=1e-10, atol=1e-12)
    by_cut, by_full = vmap_grads(task, cut), loop_grads(task, full)
    assert by_cut
    for name in by_cut:
        torch.testing.assert_close(by_cut[name], by_full[name], rtol=1e-9, atol=1e-12)


def test_bert_gradients_of_a_trimmed_batch_are_those_of_the_padded_one() -> None:
    task = make_task("text", model="tiny-bert", n_train=64, n_eval=8, n_public=0)
    lengths = task.train.tensors["attention_mask"].sum(1)
    _check_exact(task, lengths.argsort()[:3])


@pytest.mark.parametrize("arch", ["gpt2", "roberta"])
def test_other_architectures_are_exact_too(arch) -> None:
    """GPT-2 reads its logits at the last real token; RoBERTa counts positions past padding."""
    transformers = pytest.importorskip("transformers")
    from gradspec.tasks import QV_PATTERNS
    from gradspec.tasks.text import _TextForward

    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                         num_labels=2, pad_token_id=0, attn_implementation="eager")
        model = transformers.GPT2ForSequenceClassification(config)
        params = ("*.c_attn.weight",)
        pad = 0
    else:
        config = transformers.RobertaConfig(vocab_size=50, max_position_embeddings=40, hidden_size=16,
                                            intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                            num_labels=2, pad_token_id=1,
                                            attn_implementation="eager")
        model = transformers.RobertaForSequenceClassification(config)
        params, pad = QV_PATTERNS, 1
    lengths = torch.tensor([9, 3, 5, 4, 12])
    mask = (torch.arange(12) < lengths[:, None]).long()
    ids = torch.randint(3, 50, (5, 12)).masked_fill(mask == 0, pad)
    data = TensorData({"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1, 0, 1])},
                      sequences=("attention_mask", "input_ids"))
    task = Task(arch, model, data, data.subset([0]), forward=_TextForward(model), params=params)
    _check_exact(task, torch.tensor([1, 2, 3]))
