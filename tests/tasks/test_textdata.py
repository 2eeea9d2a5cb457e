import re

import numpy as np
import pytest

from gradspec.tasks._textdata import (
    VOCABULARY_SIZE,
    generate_sentiment,
    generate_splits,
    vocabulary,
)


def test_deterministic_by_seed_and_stream():
    assert generate_sentiment(50, seed=3) == generate_sentiment(50, seed=3)
    assert generate_sentiment(50, seed=3)[0] != generate_sentiment(50, seed=4)[0]
    assert generate_sentiment(50, seed=3)[0] != generate_sentiment(50, seed=3, stream=1)[0]


@pytest.mark.parametrize("n", [0, 1, 7, 100])
def test_balanced(n):
    texts, labels = generate_sentiment(n, seed=0)
    assert len(texts) == len(labels) == n
    assert sum(labels) == (n + 1) // 2 and set(labels) <= {0, 1}


def test_vocabulary_is_closed_and_documented():
    texts, _ = generate_sentiment(500, seed=1)
    words = {w for t in texts for w in re.findall(r"[a-z]+", t)}
    assert words <= set(vocabulary())
    assert len(vocabulary()) == VOCABULARY_SIZE
    assert len(words) > 0.9 * VOCABULARY_SIZE


def test_learnable_but_not_by_bag_of_words():
    """Unigram logistic regression beats chance clearly but cannot be perfect (negation, 'but');
    word bigrams, which see 'not <adj>', do better: the labels follow the word order."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    train_x, train_y = generate_sentiment(2000, seed=0)
    test_x, test_y = generate_sentiment(500, seed=0, stream=1)
    scores = []
    for ngrams in ((1, 1), (1, 2)):
        vec = CountVectorizer(token_pattern=r"[a-z]+", ngram_range=ngrams)
        clf = LogisticRegression(solver="liblinear").fit(vec.fit_transform(train_x), train_y)
        scores.append(clf.score(vec.transform(test_x), test_y))
    unigram, bigram = scores
    assert 0.65 < unigram < 0.9
    assert bigram > unigram + 0.03
    assert np.mean(test_y) == 0.5


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_splits_share_no_review(seed):
    """The templates repeat: independent streams shared ~1.8% of eval reviews with train."""
    sizes = (2000, 500, 100)  # the text task's defaults: train, eval, public
    splits = generate_splits(sizes, seed=seed)
    seen: dict[str, int] = {}
    for i, (texts, labels) in enumerate(splits):
        assert len(texts) == len(labels) == sizes[i]
        assert sum(labels) == (sizes[i] + 1) // 2  # still exactly balanced
        for t in set(texts):
            assert seen.setdefault(t, i) == i, f"{t!r} is in split {seen[t]} and split {i}"
    # the first split is the plain stream; later ones differ only where they redrew
    assert splits[0] == generate_sentiment(2000, seed=seed)
    plain_eval = generate_sentiment(500, seed=seed, stream=1)[0]
    assert any(t in set(splits[0][0]) for t in plain_eval)  # there was leakage to remove
    assert generate_splits(sizes, seed=seed) == splits  # deterministic
    assert generate_splits((2000, 500, 7), seed=seed)[:2] == splits[:2]  # eval does not depend on n_public


def test_exclude_redraws_with_the_same_label_and_gives_up_when_exhausted():
    texts, labels = generate_sentiment(200, seed=2)
    again, again_labels = generate_sentiment(200, seed=2, exclude=set(texts[:100]))
    assert again_labels == labels and not set(again) & set(texts[:100])
    assert again[0] != texts[0]  # the first review is excluded, so redrawn
    with pytest.raises(ValueError, match="templates are exhausted"):
        generate_sentiment(1, seed=0, exclude=_AllStrings({"anything"}))


class _AllStrings(set):
    """Contains every string: nothing can be drawn."""

    def __contains__(self, item):
        return True
