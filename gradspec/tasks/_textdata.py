"""An offline synthetic sentiment dataset: templated English movie reviews.

Each review is built from one to three opinion clauses ("the acting was wonderful",
"the plot was not dull") and neutral fillers ("i saw it last weekend"), in lower
case. A clause's sentiment is its adjective's polarity, flipped by a negation ("not",
"never", "hardly"), so single words do not give the label away. The label is

- one clause: its sentiment;
- "<clause>, but <clause>": the sentiment of the clause after "but" (the two disagree);
- three clauses: the majority sentiment.

Labels are a function of the text (a model that reads word order can be perfect),
but not of its word counts: a bag-of-words logistic regression reaches about 76% on
held-out reviews (word bigrams about 82%), since negation and "but" are not linear in
word counts. Labels are exactly balanced (1 = positive), texts are generated
deterministically from the seed with numpy's PCG64, and the vocabulary has
:data:`VOCABULARY_SIZE` = 115 distinct words (:func:`vocabulary`).

Splits are disjoint by content (:func:`generate_splits`): the templates repeat, so
independent draws share reviews word for word (about 1.8% of 500 eval reviews are
also among 2,000 training ones), and a model would be scored on reviews it trained
on. A split redraws, with the same label and from its own stream, any review an
earlier split holds. Reviews may repeat within a split.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

__all__ = ["VOCABULARY_SIZE", "generate_sentiment", "generate_splits", "vocabulary"]

POSITIVE = (
    "good", "great", "wonderful", "excellent", "brilliant", "delightful", "moving",
    "charming", "superb", "clever", "fun", "beautiful", "gripping", "enjoyable",
    "memorable", "funny", "touching", "impressive", "solid", "fantastic",
)  # fmt: skip
NEGATIVE = (
    "bad", "awful", "terrible", "boring", "dull", "weak", "clumsy", "tedious",
    "bland", "poor", "messy", "forgettable", "painful", "silly", "lifeless",
    "annoying", "predictable", "disappointing", "shallow", "dreadful",
)  # fmt: skip
SUBJECTS = (
    "the movie", "the film", "the plot", "the acting", "the story", "the script",
    "the soundtrack", "the cast", "the ending", "the direction", "the dialogue",
    "the pacing", "the camera work", "the lead actor", "the villain", "the humor",
)  # fmt: skip
INTENSIFIERS = ("very", "really", "truly", "quite", "rather", "pretty", "so", "incredibly")
COPULAS = ("was", "is", "seemed", "felt")
NEGATED = {"was": "was not", "is": "is not", "seemed": "never seemed", "felt": "hardly felt"}
FILLERS = (
    "i saw it last weekend", "we watched it at home", "it runs about two hours",
    "my friend picked it", "the theater was half empty", "it came out in the spring",
    "i went in without expectations", "we had popcorn", "it is based on a novel",
    "the trailer was everywhere", "i watched it twice", "it was raining that day",
)  # fmt: skip
VOCABULARY_SIZE = 115
#: Draws of one review before :func:`generate_sentiment` gives up finding one not excluded.
MAX_DRAWS = 1000


def vocabulary() -> tuple[str, ...]:
    """Every word the generator can emit, sorted."""
    phrases = (
        POSITIVE + NEGATIVE + SUBJECTS + INTENSIFIERS + COPULAS
        + tuple(NEGATED.values()) + FILLERS + ("but", "and", "overall")
    )  # fmt: skip
    return tuple(sorted({w for p in phrases for w in p.split()}))


def _clause(rng: np.random.Generator, sentiment: int) -> str:
    """An opinion clause whose (negation-aware) sentiment is ``sentiment`` (1 or 0)."""
    negate = rng.random() < 0.2
    polarity = sentiment ^ int(negate)
    adjective = str(rng.choice(POSITIVE if polarity else NEGATIVE))
    copula = str(rng.choice(COPULAS))
    verb = NEGATED[copula] if negate else copula
    if rng.random() < 0.3:
        adjective = f"{rng.choice(INTENSIFIERS)} {adjective}"
    return f"{rng.choice(SUBJECTS)} {verb} {adjective}"


def _review(rng: np.random.Generator, label: int) -> str:
    form = rng.choice(3, p=(0.55, 0.15, 0.3))
    if form == 0:
        body = _clause(rng, label)
    elif form == 1:
        body = f"{_clause(rng, 1 - label)}, but {_clause(rng, label)}"
    else:
        sentiments = [label, label, int(rng.integers(2))]
        rng.shuffle(sentiments)
        first, second, third = (_clause(rng, s) for s in sentiments)
        body = f"{first}, {second}, and overall {third}"
    if rng.random() < 0.5:
        filler = str(rng.choice(FILLERS))
        body = f"{filler}. {body}" if rng.random() < 0.5 else f"{body}. {filler}"
    return body + "."


def generate_sentiment(
    n: int, *, seed: int, stream: int = 0, exclude: Collection[str] = ()
) -> tuple[list[str], list[int]]:
    """``n`` reviews with exactly balanced labels (1 = positive, 0 = negative).

    Args:
        n: number of reviews: ``ceil(n/2)`` positive and ``floor(n/2)`` negative, shuffled.
        seed: the random seed.
        stream: an independent stream for the same seed (e.g. 0 = train, 1 = eval).
        exclude: reviews not to emit (an earlier split's): one drawn equal to them is
            drawn again, with its label, from the same stream (with none excluded, the
            reviews are exactly those of the stream).

    Returns:
        ``(texts, labels)``.

    Raises:
        ValueError: ``n < 0``, or :data:`MAX_DRAWS` draws in a row all gave excluded reviews
            (the templates are exhausted: ask for fewer).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = np.random.default_rng([seed, stream])
    labels = [1] * ((n + 1) // 2) + [0] * (n // 2)
    rng.shuffle(labels)
    if not exclude:
        return [_review(rng, y) for y in labels], labels
    excluded = exclude if isinstance(exclude, (set, frozenset, dict)) else set(exclude)
    texts = []
    for y in labels:
        for _ in range(MAX_DRAWS):
            text = _review(rng, y)
            if text not in excluded:
                texts.append(text)
                break
        else:
            raise ValueError(
                f"{MAX_DRAWS} reviews drawn in a row (stream {stream}, label {y}) all appear in an "
                f"earlier split of {len(excluded)} reviews: the templates are exhausted; ask for fewer reviews"
            )
    return texts, labels


def generate_splits(sizes: Sequence[int], *, seed: int) -> list[tuple[list[str], list[int]]]:
    """Splits of the given sizes that share no review: split ``i`` is stream ``i`` of ``seed``.

    Split ``i`` redraws any review that splits ``0..i-1`` hold (see
    :func:`generate_sentiment`'s ``exclude``), so the first split is exactly
    ``generate_sentiment(sizes[0], seed=seed)`` and no split depends on the sizes
    after it (the text task's order: train, eval, public).

    Returns:
        ``[(texts, labels)]``, one per size.
    """
    used: set[str] = set()
    out = []
    for stream, n in enumerate(sizes):
        texts, labels = generate_sentiment(n, seed=seed, stream=stream, exclude=used)
        used.update(texts)
        out.append((texts, labels))
    return out
