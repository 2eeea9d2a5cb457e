from __future__ import annotations

import pytest
import torch

from gradspec._layout import match_names
from gradspec.tasks import HEAD_PATTERNS, QV_PATTERNS, make_task, tiny_bert
from gradspec.tasks import text as text_mod
from gradspec.tasks.text import dataset_to_tensordata, tokenize_texts


@pytest.fixture(scope="module")
def minilm():
    return make_task("text", n_train=4, n_eval=2, seed=0)


@pytest.fixture(scope="module")
def tiny():
    return make_task("text", model="tiny-bert", n_train=24, n_eval=8, seed=0)


def test_qv_patterns_select_the_12_minilm_query_value_weights(minilm):
    names = [n for n, _ in minilm.model.named_parameters()]
    expected = [
        f"bert.encoder.layer.{i}.attention.self.{m}.weight"
        for i in range(6)
        for m in ("query", "value")
    ]
    assert match_names(names, QV_PATTERNS) == expected
    assert minilm.params == QV_PATTERNS
    assert minilm.model.config._attn_implementation == "eager"


def test_minilm_head_is_frozen_and_seeded(minilm):
    trainable = {n for n, p in minilm.model.named_parameters() if p.requires_grad}
    assert trainable == set(match_names(list(trainable), QV_PATTERNS)) and len(trainable) == 12
    head = minilm.model.classifier.weight
    assert not head.requires_grad and head.abs().sum() > 0
    again = make_task("text", n_train=4, n_eval=2, seed=0).model.classifier.weight
    other = make_task("text", n_train=4, n_eval=2, seed=1).model.classifier.weight
    torch.testing.assert_close(head, again, rtol=0, atol=0)
    assert not torch.allclose(head, other)
    # a frozen head is drawn at std 3/sqrt(hidden) (logits of order one), not BERT's 0.02
    assert float(head.std()) == pytest.approx(3 / 384**0.5, rel=0.1)
    trained = make_task("text", n_train=4, n_eval=2, seed=0, train_head=True).model.classifier.weight
    assert float(trained.detach().std()) == pytest.approx(0.02, rel=0.1)


def test_tiny_bert_is_seeded_and_small():
    a, tok = tiny_bert(seed=3)
    b, _ = tiny_bert(seed=3)
    c, _ = tiny_bert(seed=4)
    assert (a.config.hidden_size, a.config.num_hidden_layers, a.config.num_attention_heads) == (
        32,
        2,
        2,
    )
    assert a.config.vocab_size == tok.vocab_size
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(a.classifier.weight, c.classifier.weight)


def test_train_head_adds_the_classifier(tiny):
    task = make_task("text", model="tiny-bert", n_train=4, n_eval=2, train_head=True)
    trainable = {n for n, p in task.model.named_parameters() if p.requires_grad}
    assert {"classifier.weight", "classifier.bias", "bert.pooler.dense.weight"} <= trainable
    assert len(match_names(list(trainable), QV_PATTERNS)) == 4
    frozen = {n for n, p in tiny.model.named_parameters() if p.requires_grad}
    assert "classifier.weight" not in frozen and len(frozen) == 4


def test_explicit_params_override(tiny):
    task = make_task("text", model="tiny-bert", n_train=4, n_eval=2, params=["*.key.weight"])
    assert [n for n, p in task.model.named_parameters() if p.requires_grad] == [
        f"bert.encoder.layer.{i}.attention.self.key.weight" for i in range(2)
    ]
    with pytest.raises(ValueError, match="no parameter matches"):
        make_task("text", model="tiny-bert", n_train=4, n_eval=2, params=["nothing"])


def test_synthetic_data_layout(tiny):
    t = tiny.train.tensors
    assert set(t) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert len(tiny.train) == 24 and len(tiny.eval) == 8
    assert t["input_ids"].shape[1] == int(t["attention_mask"].sum(1).max()) <= 64  # longest
    assert t["labels"].sum() == 12  # balanced
    assert tiny.config["num_labels"] == 2 and tiny.config["vocabulary_size"] == 115
    fixed = make_task(
        "text", model="tiny-bert", n_train=4, n_eval=2, padding="max_length", max_length=40
    )
    assert fixed.train.tensors["input_ids"].shape == (4, 40)


def test_defaults_are_2000_500_and_100_public(monkeypatch):
    seen = []
    real = text_mod.generate_splits

    def spy(sizes, *, seed):
        seen.extend(sizes)
        return real([4] * len(sizes), seed=seed)

    monkeypatch.setattr(text_mod, "generate_splits", spy)
    task = make_task("text", model="tiny-bert")
    assert seen == [2000, 500, 100] and task.config["n_train"] == 4  # the effective size
    assert task.config["n_public"] == 4 and len(task.public) == 4


def test_padding_does_not_change_logits(tiny):
    """The 4-D additive mask hides padding: a padded example scores like the unpadded one."""
    batch = tiny.train.batch(range(8))
    lengths = batch["attention_mask"].sum(1)
    assert lengths.min() < lengths.max()
    model = tiny.model.eval()
    with torch.no_grad():
        padded = tiny.forward(model, batch)
        for i in range(8):
            one = {
                k: v[i : i + 1, : int(lengths[i])] if v.ndim == 2 else v[i : i + 1]
                for k, v in batch.items()
            }
            torch.testing.assert_close(tiny.forward(model, one)[0], padded[i], rtol=1e-5, atol=1e-5)


def test_hf_dataset_columns_to_tensordata():
    datasets = pytest.importorskip("datasets")
    _, tok = tiny_bert()
    ds = datasets.Dataset.from_dict(
        {
            "idx": [0, 1, 2],
            "sentence": ["a fine film", "dull.", "not bad at all, really"],
            "label": [1, 0, 1],
        }
    )
    data = dataset_to_tensordata(ds, tok, max_length=6)
    assert data.tensors["input_ids"].shape == (3, 6)  # truncated to max_length
    assert data.tensors["labels"].tolist() == [1, 0, 1]
    assert data.tensors["input_ids"][1, 0] == tok.cls_token_id
    other = datasets.Dataset.from_dict({"review": ["x", "y"], "stars": [4, 2]})
    assert len(dataset_to_tensordata(other, tok, label_column="stars")) == 2
    with pytest.raises(ValueError, match="column 'label' not in the dataset"):
        dataset_to_tensordata(other, tok)
    with pytest.raises(ValueError, match="no text column"):
        dataset_to_tensordata(datasets.Dataset.from_dict({"a": ["x"], "label": [0]}), tok)
    with pytest.raises(ValueError, match="labels must be >= 0"):
        tokenize_texts(tok, ["x"], [-1])


def test_hf_dataset_task_path(monkeypatch):
    """``dataset="sst2"`` goes through ``datasets.load_dataset("glue", "sst2")``."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    )

    def split(n):
        return datasets.Dataset.from_dict(
            {
                "sentence": [f"review number {i}" for i in range(n)],
                "label": [i % 2 for i in range(n)],
            },
            features=features,
        )

    calls = []

    def fake_load(path, name=None):
        calls.append((path, name))
        return datasets.DatasetDict({"train": split(10), "validation": split(6), "test": split(3)})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    task = make_task("text", model="tiny-bert", dataset="sst2", n_train=4, seed=2)
    assert calls == [("glue", "sst2")]
    assert (len(task.train), len(task.eval), task.config["num_labels"]) == (4, 6, 2)
    assert task.config["n_train"] == 4 and "vocabulary_size" not in task.config
    with pytest.raises(ValueError, match="no split 'dev'"):
        make_task("text", model="tiny-bert", dataset="sst2", eval_split="dev")


def test_patterns_cover_distilbert_and_roberta():
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=50, max_position_embeddings=40, num_labels=2)
    distil = transformers.DistilBertForSequenceClassification(
        transformers.DistilBertConfig(dim=16, hidden_dim=32, n_layers=2, n_heads=2, **small)
    )
    roberta = transformers.RobertaForSequenceClassification(
        transformers.RobertaConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            **small,
        )
    )
    for model, q in ((distil, "q_lin"), (roberta, "self.query")):
        names = [n for n, _ in model.named_parameters()]
        qv = match_names(names, QV_PATTERNS)
        assert len(qv) == 4 and all(n.endswith(".weight") for n in qv)
        assert sum(q in n for n in qv) == 2
        head = match_names(names, HEAD_PATTERNS)
        assert head and all("classifier" in n for n in head)


def test_head_seed_changes_the_head_not_the_data(tiny):
    other = make_task("text", model="tiny-bert", n_train=24, n_eval=8, seed=0, head_seed=7)
    for key in ("input_ids", "labels"):
        assert torch.equal(other.train.tensors[key], tiny.train.tensors[key])
    assert not torch.equal(other.model.classifier.weight, tiny.model.classifier.weight)
    same = make_task("text", model="tiny-bert", n_train=24, n_eval=8, seed=0, head_seed=0)
    assert torch.equal(same.model.classifier.weight, tiny.model.classifier.weight)
    assert other.config["head"] == {"init": "random", "seed": 7}


def _objective_grad(task, l2):
    """The public fit's objective gradient at the task's head, recomputed independently."""
    model = task.model.eval()
    feats = []
    handle = model.classifier.register_forward_hook(lambda _m, a, _o: feats.append(a[0].double()))
    with torch.no_grad():
        model(**{k: v for k, v in task.public.tensors.items() if k != "labels"})
    handle.remove()
    x, y = feats[0], task.public.tensors["labels"]
    w = model.classifier.weight.detach().double().requires_grad_(True)
    b = model.classifier.bias.detach().double().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(x @ w.T + b, y) + 0.5 * l2 * (w * w).sum()
    loss.backward()
    at_zero = torch.nn.functional.cross_entropy(torch.zeros(len(y), 2, dtype=torch.float64), y)
    return float(torch.cat([w.grad.flatten(), b.grad.flatten()]).norm()), float(loss.detach()), float(at_zero)


def test_public_head_is_the_regularised_logistic_fit_of_the_public_split_only():
    a = make_task("text", model="tiny-bert", n_train=24, n_eval=8, n_public=40, seed=0, head="public",
                  head_l2=1e-3)
    grad, loss, at_zero = _objective_grad(a, 1e-3)
    assert grad < 1e-5 and loss < at_zero  # a minimiser, better than the zero head
    assert a.config["head"]["examples"] == 40 and not a.model.classifier.weight.requires_grad
    # other private examples (more of them) leave the public split, and so the head, unchanged
    b = make_task("text", model="tiny-bert", n_train=31, n_eval=8, n_public=40, seed=0, head="public",
                  head_l2=1e-3)
    assert torch.equal(a.public.tensors["input_ids"], b.public.tensors["input_ids"])
    torch.testing.assert_close(a.model.classifier.weight, b.model.classifier.weight, rtol=0, atol=1e-6)
    for bad, match in (({"n_public": 0}, "n_public > 0"), ({"train_head": True}, "drop train_head"),
                       ({"head": "pretrained"}, "'random' or 'public'")):
        with pytest.raises(ValueError, match=match):
            make_task("text", model="tiny-bert", n_train=8, n_eval=4, **{"head": "public", **bad})
