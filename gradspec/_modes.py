"""Train/eval modes of a model, set for one computation and restored after it.

Model plumbing shared by the per-example engines (``gradspec.train``) and the attention-mask
helpers (``gradspec._attention``): every module's ``training`` flag is saved and put back, so
a computation never leaves the caller's model in another mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from torch import nn


@contextlib.contextmanager
def _modes(model: nn.Module, train: bool, also_train: Sequence[nn.Module] = ()) -> Iterator[None]:
    """Set ``model`` to train/eval (``also_train`` to train) and restore every module's mode."""
    saved = [(m, m.training) for m in model.modules()]
    model.train(train)
    for m in also_train:
        m.training = True  # non-recursive: these own the parameters, not dropout
    try:
        yield
    finally:
        for m, mode in saved:
            m.training = mode
