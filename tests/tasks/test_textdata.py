import re

import numpy as np
import pytest

from gradspec.tasks._textdata import VOCABULARY_SIZE, generate_sentiment, vocabulary


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
