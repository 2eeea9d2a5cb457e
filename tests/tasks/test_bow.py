"""The synthetic bag-of-words task (Zipf word frequencies) for AdaDPS's token-frequency side information."""

from __future__ import annotations

import math

import pytest
import torch

from gradspec.optim import frequency_side_information
from gradspec.tasks import available_tasks, bow_polarity, make_task

OPTS = dict(n=3000, n_eval=200, n_public=100, vocab=400, n_stop=20, doc_len=60)


@pytest.fixture(scope="module")
def task():
    return make_task("bow", seed=2, **OPTS)


def test_word_frequencies_follow_zipf(task):
    x = task.train.tensors["inputs"].double()
    assert x.shape == (3000, 400) and set(x.unique().tolist()) == {0.0, 1.0}
    lengths = x.sum(1)
    assert 35 < lengths.mean() < 60  # distinct words of ~60 drawn (frequent ones repeat)
    # presence probability 1 - (1 - p_j)^L ~ L p_j for rare words: log-log slope ~ -zipf = -1
    df = x.mean(0)
    ranks = torch.arange(100, 400, dtype=torch.float64) + 1
    lx, ly = ranks.log(), df[100:400].clamp_min(1e-6).log()
    fit = ((lx - lx.mean()) * (ly - ly.mean())).sum() / ((lx - lx.mean()) ** 2).sum()
    assert -1.25 < float(fit) < -0.75
    assert df[:10].mean() > 5 * df[200:].mean()


def test_rare_words_carry_the_sentiment(task):
    s = bow_polarity(task)
    assert s.shape == (400,) and torch.all(s[:20] == 0)
    assert abs(float((s[20:] != 0).double().mean()) - 0.3) < 0.01
    x, y = task.train.tensors["inputs"].double(), task.train.tensors["labels"]
    assert 0.45 < y.double().mean() < 0.55
    pos, neg = x[y == 1].mean(0), x[y == 0].mean(0)
    contrast = (pos - neg)[s != 0] * s[s != 0]
    assert (contrast > 0).double().mean() > 0.85  # polarised words lean to their class
    stop = (pos - neg)[:20].abs() / x[:, :20].mean(0)
    assert stop.max() < 0.1  # stop words do not


def test_logistic_model_and_frequency_side_information(task):
    assert "bow" in available_tasks()
    assert task.model.weight.shape == (2, 400) and torch.all(task.model.weight == 0)
    batch = task.train.batch(range(8))
    loss = task.loss(task.forward(task.model, batch), batch)
    torch.testing.assert_close(loss, torch.full((8,), math.log(2.0)))
    names = ["weight", "bias"]
    a = frequency_side_information(task.model, names, task.public)
    ref = task.public.tensors["inputs"].double().mean(0)
    m = len(task.public)
    ref_w = ref[None, :].expand(2, 400).flatten() + 1 / m
    full = torch.cat([ref_w, torch.full((2,), 1 + 1 / m, dtype=torch.float64)])
    torch.testing.assert_close(a.double(), full / full.max(), rtol=1e-6, atol=0)
    assert not set(task.public.ids.tolist()) & set(task.train.ids.tolist())
    assert not set(task.public.ids.tolist()) & set(task.eval.ids.tolist())


def test_validated_and_deterministic():
    a = make_task("bow", seed=0, n=20, n_eval=5, n_public=0, vocab=30, n_stop=3)
    b = make_task("bow", seed=0, n=20, n_eval=5, n_public=4, vocab=30, n_stop=3)
    assert torch.equal(a.train.tensors["inputs"], b.train.tensors["inputs"])
    with pytest.raises(ValueError, match="n_stop < vocab"):
        make_task("bow", vocab=10, n_stop=10)
    with pytest.raises(ValueError, match="sentiment_frac"):
        make_task("bow", strength=0.0)
