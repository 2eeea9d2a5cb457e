"""What a task is: a model, its data and its loss, in a form every trainer can use.

A task's data are in-memory tensors (``TensorData``); a batch is a dict of
tensors whose first dimension is the batch. The model is called through
``forward(call, batch)``, where ``call(*args, **kwargs)`` invokes the model, so
the same task serves a plain call and ``torch.func.functional_call`` (per-example
gradients with ``vmap``).

A task has three disjoint splits: ``train`` (the private training set), ``eval``
(held out, scored) and ``public`` (non-sensitive examples that PDP-SGD, noisy AdaGrad
and AdaDPS may use freely; Zhou et al. 2021 §5 draw them from the rest of the
training set, AdaDPS (Li et al. 2022 §6.1) takes 1% of the training data). Each split
may carry example ids (``TensorData.ids``: indices into the task's pool of
examples); :func:`check_splits` refuses overlapping splits when a task is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

Batch = dict[str, Tensor]

__all__ = [
    "Batch",
    "Task",
    "TensorData",
    "accuracy",
    "carve",
    "check_splits",
    "cross_entropy_loss",
    "drawn_splits",
    "permutation",
    "split_summary",
]


@dataclass
class TensorData:
    """An in-memory dataset: named tensors sharing their first dimension.

    Attributes:
        tensors: the data; a batch is a dict of rows of these.
        ids: optional example ids (n,), distinct integers naming each example in the
            task's pool (e.g. its index in the original dataset). With ids, the splits
            of a task are checked disjoint by id; without, by exact content.
        sequences: optional names of (n, T) token-aligned tensors, the first a 0/1 mask
            of real tokens (e.g. ``("attention_mask", "input_ids", "token_type_ids")``).
            A batch then drops the trailing positions that are padding in every one of
            its rows, so it costs its own longest example, not the split's. Exact for a
            model that masks padded keys and reads positions from the left (BERT, GPT-2
            with right padding): the real tokens' outputs, the loss and every gradient
            are unchanged up to rounding.
    """

    tensors: dict[str, Tensor]
    ids: Tensor | None = None
    sequences: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"all tensors of a dataset need the same first dimension, got {sizes}")
        if self.ids is not None:
            ids = torch.as_tensor(self.ids)
            if ids.ndim != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
                raise ValueError(f"example ids must be a 1-D integer tensor, got {ids.dtype} {tuple(ids.shape)}")
            ids = ids.to(torch.long)
            if ids.numel() != len(self):
                raise ValueError(f"{ids.numel()} example ids for {len(self)} examples")
            if ids.unique().numel() != ids.numel():
                raise ValueError("example ids must be distinct within a dataset")
            self.ids = ids
        if self.sequences:
            self.sequences = tuple(self.sequences)
            shapes = {k: tuple(self.tensors[k].shape) if k in self.tensors else None for k in self.sequences}
            if any(v is None or len(v) != 2 for v in shapes.values()) or len({v[1] for v in shapes.values()}) != 1:
                raise ValueError(f"sequences must name (n, T) tensors of one length T, got {shapes}")

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def batch(self, index: Tensor | Sequence[int] | slice) -> Batch:
        """The examples at ``index`` as a batch."""
        if not isinstance(index, slice):
            index = torch.as_tensor(index, dtype=torch.long)
        out = {k: v[index] for k, v in self.tensors.items()}
        if self.sequences:
            out.update(trim_padding({k: out[k] for k in self.sequences}, self.sequences[0]))
        return out

    def subset(self, index: Tensor | Sequence[int] | slice) -> TensorData:
        """The examples at ``index`` as a dataset, with their ids."""
        if not isinstance(index, slice):
            index = torch.as_tensor(index, dtype=torch.long)
        return TensorData(self.batch(index), None if self.ids is None else self.ids[index], self.sequences)


def trim_padding(sequences: dict[str, Tensor], mask: str) -> dict[str, Tensor]:
    """``sequences`` (b, T) without the trailing positions where ``sequences[mask]`` is 0 in
    every row (at least one position is kept)."""
    m = sequences[mask]
    if m.ndim != 2 or m.shape[1] <= 1 or m.shape[0] == 0:
        return sequences
    real = (m != 0).any(0).nonzero()
    keep = int(real.max()) + 1 if len(real) else 1
    if keep == m.shape[1]:
        return sequences
    return {k: v[:, :keep] for k, v in sequences.items()}


def permutation(n: int, seed: int) -> Tensor:
    """A seeded random permutation of ``range(n)``."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def carve(pool: Tensor, *, n_train: int | None, n_public: int, seed: int,
          what: str = "training pool") -> tuple[Tensor, Tensor]:
    """Disjoint ``(private, public)`` index sets drawn from ``pool`` by a seeded permutation.

    The first ``n_public`` of the permutation are public, the next ``n_train`` (all the
    rest when ``None``) private; each set is returned sorted.

    Raises:
        ValueError: if the pool holds fewer than ``n_train + n_public`` examples.
    """
    if n_public < 0 or (n_train is not None and n_train < 1):
        raise ValueError(f"need n_train >= 1 (or None) and n_public >= 0, got {n_train}, {n_public}")
    wanted = n_public + (n_train if n_train is not None else 1)
    if wanted > len(pool):
        raise ValueError(f"the {what} has {len(pool)} examples, fewer than n_train + n_public = "
                         f"{n_train if n_train is not None else 'at least 1'} + {n_public}")
    order = pool[permutation(len(pool), seed)]
    public, rest = order[:n_public], order[n_public:]
    private = rest if n_train is None else rest[:n_train]
    return private.sort().values, public.sort().values


#: How :func:`drawn_splits` numbers the examples (a task's ``config["ids"]``).
DRAWN_IDS = "train 0..n-1, eval n..n+n_eval-1, public n+n_eval.. (drawn in that order)"


def drawn_splits(data: dict[str, Tensor], public: dict[str, Tensor], *, n: int,
                 n_eval: int) -> tuple[TensorData, TensorData, TensorData | None]:
    """The train, eval and public splits of a synthetic task whose examples were drawn in that order.

    ``data`` holds the ``n`` training examples followed by the ``n_eval`` held-out ones,
    ``public`` the public examples (none: ``None`` is returned for the public split). Ids
    follow :data:`DRAWN_IDS`, so the three splits are disjoint by construction.

    Raises:
        ValueError: if ``data`` does not hold exactly ``n + n_eval`` rows in every tensor, or
            the public tensors differ in length.
    """
    sizes = {k: len(v) for k, v in data.items()}
    if set(sizes.values()) != {n + n_eval}:
        raise ValueError(f"expected n + n_eval = {n + n_eval} drawn examples in every tensor, got {sizes}")
    public_sizes = {len(v) for v in public.values()}
    if len(public_sizes) > 1:
        raise ValueError(f"the public tensors differ in length: { {k: len(v) for k, v in public.items()} }")
    n_public = public_sizes.pop() if public_sizes else 0
    ids = torch.arange(n + n_eval + n_public)
    train = TensorData({k: v[:n] for k, v in data.items()}, ids[:n])
    held_out = TensorData({k: v[n:] for k, v in data.items()}, ids[n : n + n_eval])
    return train, held_out, TensorData(public, ids[n + n_eval :]) if n_public else None


def cross_entropy_loss(outputs: Tensor, batch: Batch) -> Tensor:
    """Per-example cross-entropy of logits against ``batch['labels']``."""
    return nn.functional.cross_entropy(outputs, batch["labels"], reduction="none")


def accuracy(outputs: Tensor, batch: Batch) -> dict[str, float]:
    """Mean classification accuracy of logits against ``batch['labels']``."""
    return {"accuracy": (outputs.argmax(-1) == batch["labels"]).float().mean().item()}


@dataclass
class Task:
    """A model with its data, loss and metrics.

    Attributes:
        name: registry name (or a user's label).
        model: the module; its selected parameters are trained and collected.
        train: the private training data.
        eval: held-out data for evaluation.
        forward: ``forward(call, batch) -> outputs`` where ``call`` invokes the model.
        loss: ``loss(outputs, batch) -> per-example losses`` of shape (B,).
        metrics: ``metrics(outputs, batch) -> {name: value}`` averaged over the batch.
        params: name patterns (globs, or ``re:`` regexes) of the parameters to train
            and collect; all others are frozen.
        config: what built the task, recorded in the store.
        public: public (non-private) examples for PDP-SGD, noisy AdaGrad and AdaDPS,
            disjoint from ``train`` and ``eval``; ``None``: the task has none.

    Raises:
        ValueError: if ``public`` overlaps ``train`` or ``eval``, or ``eval`` overlaps
            ``train`` (see :func:`check_splits`).
    """

    name: str
    model: nn.Module
    train: TensorData
    eval: TensorData
    forward: Callable[[Callable[..., Tensor], Batch], Tensor]
    loss: Callable[[Tensor, Batch], Tensor] = cross_entropy_loss
    metrics: Callable[[Tensor, Batch], dict[str, float]] = accuracy
    params: tuple[str, ...] = ("*",)
    config: dict = field(default_factory=dict)
    public: TensorData | None = None

    def __post_init__(self) -> None:
        check_splits(self)


def split_summary(task: Task) -> dict:
    """Sizes of the three splits and the public examples' ids (``None`` without ids), JSON-able."""
    public = task.public
    return {
        "n_train": len(task.train),
        "n_eval": len(task.eval),
        "n_public": 0 if public is None else len(public),
        "public_ids": None if public is None or public.ids is None else public.ids.tolist(),
    }


def check_splits(task: Task, public: TensorData | None = None) -> None:
    """Refuse a task whose splits overlap.

    With ``public`` given, only those examples are checked (against the task's
    ``train`` and ``eval``), in place of the task's own public split.

    ``public`` is checked against ``train`` and ``eval``: by example id when both
    splits carry ids, else by exact content (an example whose every tensor equals
    one of the other split's; tensors of different widths, e.g. padded to different
    lengths, cannot be compared — give ids then). ``train`` and ``eval`` are checked by
    id when both carry ids, else only for being the very same data.

    Raises:
        ValueError: one line naming the overlapping splits and how many examples they share.
    """
    name = getattr(task, "name", "?")
    pub = task.public if public is None else public
    splits = [("public", pub, "train", task.train), ("public", pub, "eval", task.eval)]
    if public is None:
        splits.append(("eval", task.eval, "train", task.train))
    for a_name, a, b_name, b in splits:
        if a is None or b is None or len(a) == 0 or len(b) == 0:
            continue
        by_ids = a.ids is not None and b.ids is not None
        if _same_data(a, b):
            shared, how = len(a), "the same tensors"
        elif a_name == "eval" and not by_ids:
            shared, how = 0, ""
        else:
            shared, how = _shared_examples(a, b), "id" if by_ids else "content"
        if shared:
            fix = ("carve the public examples from outside the evaluation and private training "
                   "data (bundled tasks: make_task(..., n_public=M), CLI -t n_public=M)"
                   if a_name == "public" else "evaluate on held-out examples")
            raise ValueError(f"task {name!r}: its {a_name} split shares {shared} of {len(a)} examples "
                             f"with its {b_name} split (by {how}); {fix}")


def _same_data(a: TensorData, b: TensorData) -> bool:
    if a is b:
        return True
    if a.tensors.keys() != b.tensors.keys():
        return False
    return all(a.tensors[k] is b.tensors[k] or (
        a.tensors[k].data_ptr() == b.tensors[k].data_ptr()
        and a.tensors[k].shape == b.tensors[k].shape and a.tensors[k].stride() == b.tensors[k].stride()
    ) for k in a.tensors)


def _shared_examples(a: TensorData, b: TensorData) -> int:
    """How many examples of ``a`` also occur in ``b`` (by id, else by content)."""
    if a.ids is not None and b.ids is not None:
        return int(torch.isin(a.ids, b.ids).sum())
    keys = [k for k in a.tensors if k in b.tensors and a.tensors[k].shape[1:] == b.tensors[k].shape[1:]
            and a.tensors[k].dtype == b.tensors[k].dtype]
    if not keys:
        return 0
    seen = set(_fingerprints(b, keys))
    return sum(f in seen for f in _fingerprints(a, keys))


def _fingerprints(data: TensorData, keys: list[str]) -> list[bytes]:
    rows = [data.tensors[k].detach().cpu().reshape(len(data), -1).contiguous().view(torch.uint8).numpy()
            for k in keys]
    return [b"".join(r[i].tobytes() for r in rows) for i in range(len(data))]
