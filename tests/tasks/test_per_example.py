"""Every bundled task: forward + loss give finite (B,) losses, and per-example gradients by
``vmap(grad(functional_call))`` equal a batch-of-one loop (Opacus-style reference)."""

from __future__ import annotations

import json

import pytest
import torch

from gradspec.tasks import make_task

from ._helpers import loop_grads, trainable_names, vmap_grads

# (id, task name, options, examples checked)
CASES = [
    ("lowrank-linear", "lowrank", dict(kind="linear", n=16, n_eval=4, d=12, r=3), 3),
    ("lowrank-logistic", "lowrank", dict(kind="logistic", n=16, n_eval=4, d=12, r=3), 3),
    ("geomedian-sqrt", "geomedian", dict(d=15, d_min=5, n_train=16, n_eval=4), 3),
    ("cnn-digits", "cnn", dict(n_train=32, n_eval=8), 3),
    ("sparselinear", "sparselinear", dict(n=16, n_eval=4, n_public=2, d=20), 3),
    ("bow", "bow", dict(n=16, n_eval=4, n_public=2, vocab=50, n_stop=5, doc_len=10), 3),
    ("text-tiny-bert", "text", dict(model="tiny-bert", n_train=8, n_eval=4), 3),
    (
        "text-tiny-bert-head",
        "text",
        dict(model="tiny-bert", n_train=8, n_eval=4, train_head=True),
        3,
    ),
    ("text-minilm", "text", dict(n_train=4, n_eval=2), 2),
]


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request):
    _, name, options, n = request.param
    torch.manual_seed(0)
    return make_task(name, seed=1, **options), n


def test_forward_loss_shapes(case):
    task, n = case
    batch = task.train.batch(range(n))
    with torch.no_grad():
        outputs = task.forward(task.model, batch)
        losses = task.loss(outputs, batch)
        metrics = task.metrics(outputs, batch)
    assert losses.shape == (n,)
    assert torch.isfinite(losses).all()
    assert metrics and all(isinstance(v, float) for v in metrics.values())
    json.dumps(task.config)
    assert len(task.eval) > 0


def test_per_example_grads_match_loop(case):
    task, n = case
    names = trainable_names(task)
    assert names, "the task's params match some parameters"
    batch = task.train.batch(range(n))
    by_vmap, by_loop = vmap_grads(task, batch), loop_grads(task, batch)
    assert list(by_vmap) == names
    for name in names:
        assert by_vmap[name].shape == (n, *task.model.get_parameter(name).shape)
        torch.testing.assert_close(by_vmap[name], by_loop[name], rtol=1e-4, atol=1e-6)
    # the examples differ, so must their gradients
    first = torch.cat([g[0].flatten() for g in by_vmap.values()])
    second = torch.cat([g[1].flatten() for g in by_vmap.values()])
    assert not torch.allclose(first, second)


@pytest.mark.parametrize("arch", ["distilbert", "roberta"])
def test_text_forward_vmaps_other_architectures(arch):
    """DistilBERT and RoBERTa (Li et al. fine-tune DistilRoBERTa) run under vmap too."""
    transformers = pytest.importorskip("transformers")
    from gradspec.tasks import QV_PATTERNS, Task, TensorData
    from gradspec.tasks.text import _TextForward

    small = dict(
        vocab_size=50,
        max_position_embeddings=40,
        num_labels=2,
        pad_token_id=1,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    if arch == "distilbert":
        config = transformers.DistilBertConfig(
            dim=16, hidden_dim=32, n_layers=2, n_heads=2, **small
        )
        model = transformers.DistilBertForSequenceClassification(config)
    else:
        config = transformers.RobertaConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            **small,
        )
        model = transformers.RobertaForSequenceClassification(config)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 6 + [0]])
    ids = torch.randint(3, 50, (3, 7)).masked_fill(mask == 0, 1)
    data = TensorData({"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])})
    task = Task(arch, model, data, data.subset([0]), forward=_TextForward(model), params=QV_PATTERNS)
    batch = data.batch(range(3))
    by_vmap, by_loop = vmap_grads(task, batch), loop_grads(task, batch)
    assert len(by_vmap) == 4
    for name in by_vmap:
        torch.testing.assert_close(by_vmap[name], by_loop[name], rtol=1e-4, atol=1e-6)
