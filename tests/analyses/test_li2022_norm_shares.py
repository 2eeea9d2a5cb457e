"""Which parameters a per-example gradient's norm comes from (the whole-model study's diagnosis),
on a tiny random BERT: shares per group against each example's gradient from a plain backward."""

from __future__ import annotations

import math

import torch

from analyses.li2022_restricted_lipschitz.norm_shares import GROUPS, group_of, main, norm_shares
from gradspec.tasks import make_task


def test_shares_split_each_examples_squared_norm_by_group() -> None:
    task = make_task("text", model="tiny-bert", n_train=8, n_eval=4, n_public=0, params=["*"])
    out = norm_shares(task, 5)
    model = task.model
    assert len(out["norms"]) == 5
    assert sum(out["sizes"].values()) == sum(p.numel() for p in model.parameters())
    assert {"pooler", "head", "word embeddings", "encoder weight matrices"} <= set(out["sizes"])
    for i in range(5):  # against a plain backward of example i alone
        one = {k: v[i : i + 1] for k, v in task.train.batch(torch.arange(5)).items()}
        model.zero_grad()
        task.loss(task.forward(lambda **kw: model(**kw), one), one).sum().backward()
        sq = {g: 0.0 for g in out["sizes"]}
        for name, p in model.named_parameters():
            sq[group_of(name)] += float(p.grad.double().pow(2).sum())
        total = sum(sq.values())
        assert math.isclose(out["norms"][i], total**0.5, rel_tol=1e-6)
        assert math.isclose(sum(v[i] for v in out["shares"].values()), 1.0, rel_tol=1e-9)
        for g in sq:
            assert math.isclose(out["shares"][g][i], sq[g] / total, rel_tol=1e-5, abs_tol=1e-12)


def test_groups_of_bert_names() -> None:
    assert group_of("classifier.weight") == "head"
    assert group_of("bert.pooler.dense.weight") == "pooler"
    assert group_of("bert.embeddings.word_embeddings.weight") == "word embeddings"
    assert group_of("bert.embeddings.LayerNorm.bias") == GROUPS[3][0]
    assert group_of("bert.encoder.layer.0.attention.self.query.bias") == "encoder biases and LayerNorms"
    assert group_of("bert.encoder.layer.0.output.LayerNorm.weight") == "encoder biases and LayerNorms"
    assert group_of("bert.encoder.layer.5.intermediate.dense.weight") == "encoder weight matrices"


def test_main_prints_the_table(capsys) -> None:
    assert main(["--dataset", "synthetic", "--model", "tiny-bert", "--n", "3"]) == 0
    out = capsys.readouterr().out
    assert "median per-example gradient norm over 3 examples" in out and "| pooler |" in out
