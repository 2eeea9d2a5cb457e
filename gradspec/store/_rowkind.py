"""What a gradient store's rows are: clipped or not (and to which C), how they are
normalised, and which source wrote them.

Stores of different kinds look alike (r x p floats) but do not mean the same thing: a
Hugging Face per-step row is the Trainer's ``.grad`` (unclipped, divided as its loss is
normalised), a gradspec or Opacus per-step row is the mean of clipped per-example gradients,
a per-example row is one (clipped) gradient. :func:`row_kind` reads the kind from a store's
run config (every store written by gradspec says it, old ones included: the kind is derived
from the fields they recorded), and :func:`kind_mismatch` says, in one line, how two kinds
differ, for the commands that combine stores (``pca``'s record, ``decay --heldout``,
``retrain --projector``, plot overlays) to warn by name.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

#: Normalisations of a row.
PER_EXAMPLE = "per-example gradient"
MEAN_OF_EXAMPLES = "mean of per-example gradients over the step's examples"
TRAINER_GRAD = "the trainer's .grad (its loss normalisation)"

#: Who wrote a store's rows, by the ``source`` its config records.
SOURCES = {"recorder": "plain loop", "opacus": "opacus", "hf-trainer": "hf-trainer"}


@dataclass(frozen=True)
class RowKind:
    """What the rows of a gradient store are."""

    clipped: bool
    max_grad_norm: float | None  # C when clipped
    normalisation: str  # PER_EXAMPLE, MEAN_OF_EXAMPLES or TRAINER_GRAD
    source: str  # gradspec, opacus, hf-trainer, plain loop

    def describe(self) -> str:
        """One line, e.g. ``mean of per-example gradients ..., clipped to C = 1 (gradspec)``."""
        clip = f"clipped to C = {self.max_grad_norm:g}" if self.clipped else "not clipped"
        return f"{self.normalisation}, {clip}, before noise (source: {self.source})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def row_kind(config: dict[str, Any], *, per_example: bool) -> RowKind:
    """The kind of a store's rows, from its run config and whether it holds per-example rows."""
    run = config.get("collect")
    if isinstance(run, dict):  # gradspec's trainer
        c = run.get("max_grad_norm")
        clipped = bool(run.get("clip", True)) and c is not None
        return RowKind(clipped, float(c) if clipped else None,
                       PER_EXAMPLE if per_example else MEAN_OF_EXAMPLES, "gradspec")
    source = SOURCES.get(str(config.get("source")), str(config.get("source") or "unknown"))
    c = config.get("max_grad_norm")
    clipped = isinstance(c, int | float) and math.isfinite(c) and c > 0
    if source == "hf-trainer" and not per_example:
        # the optimizer's gradient: no per-example clipping (the Trainer's global-norm clip is not)
        return RowKind(False, None, TRAINER_GRAD, source)
    return RowKind(clipped, float(c) if clipped else None,
                   PER_EXAMPLE if per_example else MEAN_OF_EXAMPLES, source)


def kind_mismatch(a: RowKind, b: RowKind, *, names: tuple[str, str] = ("one", "the other")) -> str | None:
    """How two kinds differ (clipping, C, normalisation), one line; None when they agree.

    The source alone is not a difference: gradspec, Opacus and plain-loop rows of the same
    kind mean the same thing (``gradspec.collect``'s row convention).
    """
    diffs = []
    if a.normalisation != b.normalisation:
        diffs.append(f"{names[0]} holds {a.normalisation}, {names[1]} {b.normalisation}")
    if a.clipped != b.clipped:
        which = names[0] if a.clipped else names[1]
        diffs.append(f"only {which} is clipped")
    elif a.clipped and a.max_grad_norm != b.max_grad_norm:
        diffs.append(f"C = {a.max_grad_norm:g} vs {b.max_grad_norm:g}")
    return "; ".join(diffs) or None
