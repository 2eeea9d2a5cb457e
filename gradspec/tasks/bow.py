"""A synthetic bag-of-words sentiment task with Zipf-distributed word frequencies, for
AdaDPS's token-frequency side information (Li, Zaheer, Reddi, Smith 2022, §6.1.2; their
IMDB BoW logistic regression has a 10,000-word vocabulary and 20,002 parameters).

No text corpus ships offline with this toolkit's dependencies (scikit-learn's text data,
20 Newsgroups, must be downloaded), so the documents are generated:

* word j (0-based rank) has base probability ``p_j ∝ (j + 1)^-zipf`` (Zipf's law);
* the ``n_stop`` most frequent words carry no sentiment; of the others, a seeded random
  ``sentiment_frac`` get a polarity ``s_j = ±1`` (0 for the rest);
* a document of class ``y`` in {0, 1} has ``L ~ 1 + Poisson(doc_len - 1)`` words drawn
  i.i.d. from ``p^(y)_j ∝ p_j exp(strength * s_j * (2y - 1))``;
* its features are the bag of words as presence (multi-hot, 1 if word j occurs).

So frequent words are uninformative and the informative words are spread over the
rarer ranks: the regime in which the paper's §6.1.2 says token frequencies are good side
information ("rare features are more informative than frequent ones"). This is the
paper's assumption built into the data, not evidence that it holds for real text.

The model is logistic regression, ``nn.Linear(vocab, 2)`` with cross-entropy (as the
paper's 2 x 10,000 + 2 parameters), initialised to zero. Splits are drawn i.i.d. from
the same distribution: training ``0..n-1``, held-out ``n..n+n_eval-1``, public from
``n+n_eval`` on (drawn last, so the training and held-out data do not depend on it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from gradspec.tasks._base import DRAWN_IDS, Batch, Task, accuracy, cross_entropy_loss, drawn_splits
from gradspec.tasks._registry import register_task

__all__ = ["bow_polarity", "bow_task"]


def _polarity(gen: torch.Generator, vocab: int, n_stop: int, frac: float) -> Tensor:
    s = torch.zeros(vocab, dtype=torch.float64)
    candidates = torch.arange(n_stop, vocab)
    k = int(round(frac * len(candidates)))
    chosen = candidates[torch.randperm(len(candidates), generator=gen)[:k]]
    signs = torch.randint(0, 2, (k,), generator=gen).double() * 2 - 1
    s[chosen] = signs
    return s


def bow_polarity(task_or_config: Task | dict) -> Tensor:
    """The planted polarity s (vocab,) in {-1, 0, 1} of a ``bow`` task, regenerated from its seed."""
    config = task_or_config.config if isinstance(task_or_config, Task) else task_or_config
    if config.get("task") != "bow":
        raise ValueError("bow_polarity needs a task (or config) built by make_task('bow')")
    gen = torch.Generator().manual_seed(int(config["seed"]))
    return _polarity(gen, int(config["vocab"]), int(config["n_stop"]), float(config["sentiment_frac"]))


def _bow_forward(call: Callable[..., Tensor], batch: Batch) -> Tensor:
    return call(batch["inputs"])


@register_task("bow")
def bow_task(
    *,
    seed: int = 0,
    n: int = 10000,
    n_eval: int = 5000,
    n_public: int = 100,
    vocab: int = 5000,
    zipf: float = 1.0,
    n_stop: int = 50,
    sentiment_frac: float = 0.3,
    strength: float = 0.5,
    doc_len: int = 100,
) -> Task:
    """Synthetic bag-of-words binary classification with logistic regression.

    Args:
        seed: draws the polarities, the documents and their labels.
        n: training documents.
        n_eval: held-out documents.
        n_public: public documents (default 1% of n, as AdaDPS §6.1.1); 0 for none.
        vocab: vocabulary size = input features.
        zipf: exponent of the word-frequency law ``p_j ∝ (j + 1)^-zipf``.
        n_stop: the most frequent words, which carry no sentiment.
        sentiment_frac: share of the other words that carry a polarity.
        strength: log-odds shift of a polarised word between the classes (per side).
        doc_len: mean document length in words.

    Returns:
        A task with model ``nn.Linear(vocab, 2)`` (zero-initialised), data
        ``{"inputs": (n, vocab) float32 in {0, 1}, "labels": (n,) long}``, metric accuracy.
    """
    if vocab < 2 or not 0 <= n_stop < vocab:
        raise ValueError(f"need vocab >= 2 and 0 <= n_stop < vocab, got {vocab}, {n_stop}")
    if not 0 < sentiment_frac <= 1 or strength <= 0 or zipf < 0 or doc_len < 1:
        raise ValueError("need 0 < sentiment_frac <= 1, strength > 0, zipf >= 0, doc_len >= 1; got "
                         f"{sentiment_frac}, {strength}, {zipf}, {doc_len}")
    if n < 1 or n_eval < 1 or n_public < 0:
        raise ValueError(f"n and n_eval must be positive and n_public >= 0, got {n}, {n_eval}, {n_public}")
    gen = torch.Generator().manual_seed(seed)
    s = _polarity(gen, vocab, n_stop, sentiment_frac)
    base = (torch.arange(vocab, dtype=torch.float64) + 1) ** -zipf
    probs = torch.stack([base * torch.exp(strength * s * sign) for sign in (-1.0, 1.0)])
    probs = probs / probs.sum(1, keepdim=True)

    def draw(m: int) -> tuple[Tensor, Tensor]:
        y = torch.randint(0, 2, (m,), generator=gen)
        lengths = 1 + torch.poisson(torch.full((m,), float(doc_len - 1), dtype=torch.float64), gen).long()
        x = torch.zeros(m, vocab)
        for label in (0, 1):
            rows = (y == label).nonzero().flatten()
            if len(rows) == 0:
                continue
            for start in range(0, len(rows), 4096):
                chunk = rows[start : start + 4096]
                width = int(lengths[chunk].max())
                drawn = torch.multinomial(probs[label].expand(len(chunk), vocab), width,
                                          replacement=True, generator=gen)
                keep = torch.arange(width)[None, :] < lengths[chunk][:, None]
                x[chunk[:, None].expand_as(drawn)[keep], drawn[keep]] = 1.0
        return x, y

    x, y = draw(n + n_eval)
    x_pub, y_pub = draw(n_public) if n_public else (torch.zeros(0, vocab), torch.zeros(0, dtype=torch.long))
    model = nn.Linear(vocab, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    train, held_out, public = drawn_splits({"inputs": x, "labels": y}, {"inputs": x_pub, "labels": y_pub},
                                           n=n, n_eval=n_eval)
    return Task(
        name="bow",
        model=model,
        train=train,
        eval=held_out,
        public=public,
        forward=_bow_forward,
        loss=cross_entropy_loss,
        metrics=accuracy,
        params=("weight", "bias"),
        config={"ids": DRAWN_IDS, "features": "word presence (multi-hot)"},
    )
