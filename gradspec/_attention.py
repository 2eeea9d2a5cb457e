"""Attention masks that keep a Hugging Face model the model it is, under ``vmap``.

Under ``torch.func.vmap`` a Hugging Face model cannot build its attention mask from
a 2D padding mask (transformers branches on values); it takes a ready 4D additive
mask as given, which must then carry all of the model's own masking: causal and
padding for decoders (GPT-2), padding only for encoders (BERT).
:func:`attention_mask_4d` builds it, :func:`attention_is_causal` says which a model
needs, :func:`additive_attention_mask` is the encoder-only padding mask.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gradspec._modes import _modes

__all__ = ["additive_attention_mask", "attention_is_causal", "attention_mask_4d"]


def attention_mask_4d(attention_mask: Tensor, dtype: torch.dtype, *, causal: bool) -> Tensor:
    """A (B, T) 0/1 padding mask as the 4D additive mask a Hugging Face model adds to its scores.

    Under ``vmap`` a Hugging Face model cannot build its mask from a 2D one (transformers
    branches on values, e.g. ``mask.all()``), but a 4D mask is used as given
    (``masking_utils._preprocess_mask_arguments`` returns it as-is) and the eager attention
    adds it to the scores (``scores + mask``; a bool mask would be added as 0/1, hence a
    float one). Given as-is, it must therefore carry *all* of the model's masking: a
    decoder (GPT-2, Llama, BERT with ``is_decoder``) masks the future as well as the
    padding, and a padding-only mask silently turns it into a different, bidirectional
    model (for a tiny GPT-2, per-example gradients off by about 3e-2 relative).

    Query i attends key j iff ``attention_mask[b, j] == 1`` and, when ``causal``, j <= i:
    the same pattern as transformers' ``create_causal_mask`` / ``create_bidirectional_mask``
    (padded keys masked; padded query rows are never read by real tokens). With right
    padding (and the model's default position ids), a real token's output then equals that
    of the unpadded sequence run alone. Left padding shifts the positions of a model that
    numbers them from the first column (GPT-2), exactly as transformers' own 2D path does.

    Args:
        attention_mask: (B, T), 1 for tokens, 0 for padding.
        dtype: the model's dtype (the mask is added to its attention scores).
        causal: whether the model's self-attention is causal; ``attention_is_causal(model)``
            reads it off a Hugging Face model.

    Returns:
        (B, 1, T, T) when ``causal``, else (B, 1, 1, T): 0 where attended,
        ``finfo(dtype).min`` where masked.
    """
    keep = attention_mask[:, None, None, :].to(torch.bool)
    if causal:
        t = attention_mask.shape[-1]
        pos = torch.arange(t, device=attention_mask.device)
        keep = keep & (pos[None, :] <= pos[:, None])  # (B, 1, T, T): key j <= query i
    zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


def additive_attention_mask(attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The padding-only (B, 1, 1, T) additive mask: **bidirectional (encoder) models only**.

    Same as ``attention_mask_4d(attention_mask, dtype, causal=False)``. Passed to a causal
    model (GPT-2) it drops the causal mask, so the gradients are those of another model;
    use ``attention_mask_4d(..., causal=attention_is_causal(model))`` there.
    """
    return attention_mask_4d(attention_mask, dtype, causal=False)


def attention_is_causal(model: nn.Module) -> bool:
    """Whether a Hugging Face model's self-attention is causal (masks the future).

    Read off the model the way transformers decides, in this order:

    1. ``config.is_causal is False``: bidirectional (transformers' override, under which
       ``create_causal_mask`` builds a bidirectional mask);
    2. attention modules carry ``is_causal`` (what SDPA/flash use when no mask is given;
       GPT-2: True; BERT: ``config.is_decoder``): causal iff any is True (cross-attention
       modules are False; a decoder's self-attention is True);
    3. else ``config.is_decoder`` True: causal;
    4. else measured: the base model's hidden states of two token sequences that differ
       only in their last token; causal iff those at the earlier positions are equal.

    Args:
        model: a transformers ``PreTrainedModel`` (anything with ``config``).

    Returns:
        True for decoder models (GPT-2, Llama, ...), False for encoders (BERT, RoBERTa).

    Raises:
        ValueError: when rule 4 is needed and the model cannot run on ``input_ids`` alone.
    """
    config = getattr(model, "config", None)
    if getattr(config, "is_causal", None) is False:
        return False
    flags = [
        m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)
    ]
    if flags:
        return any(flags)
    if getattr(config, "is_decoder", False):
        return True
    return _measured_causal(model)


def _measured_causal(model: nn.Module) -> bool:
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    if vocab < 6:
        raise ValueError(
            f"cannot tell whether {type(model).__name__} is causal; pass causal= explicitly"
        )
    device = next(model.parameters()).device
    base = getattr(model, "base_model", model)  # hidden states, not a head's pooled output
    try:
        with torch.no_grad(), _modes(model, False):
            hidden = [
                base(input_ids=torch.tensor([[1, 2, 3, last]], device=device))[0][0, :3].double()
                for last in (4, 5)
            ]
    except Exception as err:  # any model that needs more than input_ids
        raise ValueError(
            f"cannot tell whether {type(model).__name__} is causal (running it on input_ids "
            f"alone raised {type(err).__name__}); pass causal= explicitly"
        ) from err
    gap = (hidden[0] - hidden[1]).abs().max()
    return bool(gap <= 1e-3 * hidden[0].abs().max())  # rounding vs. a changed input
