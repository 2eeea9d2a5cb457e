"""Where a clipped per-example gradient's norm comes from, measured before a run trains.

DP-SGD clips each example's gradient at the norm of every trained parameter together
(Abadi et al. 2016). When a small part of the model carries most of that norm, clipping leaves
the rest of the model only what is left, at the same noise in every coordinate. Fine-tuning
all of MiniLM with its frozen random head is the case that found this: the pooler, 0.65% of the
parameters, held 88% of each example's squared norm, and the run did not learn
(analyses/li2022_restricted_lipschitz/README.md, "The whole-model study"). A new run measures
the split on its warm-up batch (the first ``batch_size`` training examples at the starting
weights, clipped as the run clips; the batch an energy-split sketch plan is made from),
logs the largest groups, warns when one small group dominates, and keeps the table in its
run config (``norm_shares``).

A group is a module's parameters with the indices of repeated blocks folded
(``bert.encoder.layer.3.attention.self.query.weight`` -> ``bert.encoder.layer.*.attention.self.query``),
so a type of layer counts once, over every block it appears in; the layers of a
``Sequential`` (``features.0``, ``features.3``) stay apart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gradspec._layout import ParamLayout

logger = logging.getLogger(__name__)

#: A group is flagged when it holds at least this share of the clipped squared norm ...
DOMINANT_SHARE = 0.5
#: ... with at most this fraction of the trained parameters ...
SMALL_FRACTION = 0.05
#: ... and at least this many times its fraction (share / fraction).
CONCENTRATION = 20.0
#: Groups the INFO line names.
SHOWN = 3

def group_of(name: str) -> str:
    """A parameter's group: its module's name with the index of each repeated block replaced
    by ``*`` (a parameter of the root module is its own group)."""
    owner, dot, _ = name.rpartition(".")
    if not dot:
        return name
    parts = owner.split(".")
    # an index with a name after it is a repeated block (layer.3.attention); a last one is a
    # position in a container of different layers (features.0 and features.3 of a Sequential)
    return ".".join("*" if part.isdigit() and i < len(parts) - 1 else part for i, part in enumerate(parts))


@dataclass(frozen=True)
class NormShares:
    """Each group's share of a batch's clipped per-example squared norms (largest first).

    ``groups``: ``(group, parameters, share)``; ``p``: the trained parameters; ``examples``:
    the warm-up batch's size; ``median_norm``: its median pre-clip norm where known (NaN
    otherwise)."""

    groups: tuple[tuple[str, int, float], ...]
    p: int
    examples: int
    median_norm: float

    def to_dict(self) -> dict[str, Any]:
        return {"examples": self.examples, "p": self.p, "median_norm": self.median_norm,
                "groups": [{"group": g, "parameters": n, "share": s} for g, n, s in self.groups]}

    def dominant(self) -> tuple[str, int, float] | None:
        """The group that holds most of the norm with few of the parameters, or None."""
        if not self.groups or self.p <= 0:
            return None
        g, n, share = self.groups[0]
        fraction = n / self.p
        if share >= DOMINANT_SHARE and fraction <= SMALL_FRACTION and share >= CONCENTRATION * fraction:
            return g, n, share
        return None

    def summary(self, shown: int = SHOWN) -> str:
        """One line: the largest groups' shares and sizes."""
        parts = [f"{g} {s:.1%} ({n / self.p:.2%} of the parameters)" for g, n, s in self.groups[:shown]]
        return (f"clipped gradient norm by parameter group over {self.examples} warm-up examples: "
                + "; ".join(parts))

    def warning(self) -> str | None:
        """What a dominant group means for the run, or None."""
        top = self.dominant()
        if top is None:
            return None
        g, n, share = top
        return (f"{g} ({n:,} parameters, {n / self.p:.2%} of those trained) holds {share:.0%} of the "
                f"clipped squared gradient norm of {self.examples} examples: clipping at the whole norm "
                f"leaves every other parameter {1 - share:.0%} of it, at the same noise in every coordinate, "
                "and such runs can fail to learn. If that is not what you want, leave it out of --params "
                "(freeze it)")


def norm_shares(layout: ParamLayout, energies: Tensor, norms: Tensor | None = None) -> NormShares:
    """The groups' shares of ``energies``, each example's clipped squared norm per parameter.

    Args:
        layout: the trained parameters (``energies``'s columns, in layout order).
        energies: (B, parameters) clipped squared norms (float64).
        norms: (B,) pre-clip norms, for the table's median; None where unknown.

    Returns:
        The shares of the summed energies: an example counts by its clipped squared norm, so
        every clipped example counts alike.
    """
    if energies.ndim != 2 or energies.shape[1] != len(layout.params):
        raise ValueError(f"energies must be (examples, {len(layout.params)}), got {tuple(energies.shape)}")
    per_param = energies.detach().to("cpu", torch.float64).clamp(min=0).sum(0)
    total = float(per_param.sum())
    sizes: dict[str, int] = {}
    sums: dict[str, float] = {}
    for spec, e in zip(layout.params, per_param.tolist(), strict=True):
        g = group_of(spec.name)
        sizes[g] = sizes.get(g, 0) + spec.numel
        sums[g] = sums.get(g, 0.0) + e
    share = {g: (s / total if total > 0 else 0.0) for g, s in sums.items()}
    groups = tuple(sorted(((g, sizes[g], share[g]) for g in sizes), key=lambda t: (-t[2], t[0])))
    median = float(norms.detach().double().median()) if norms is not None and norms.numel() else float("nan")
    return NormShares(groups=groups, p=layout.p, examples=int(energies.shape[0]), median_norm=median)


def measured_shares(layout: ParamLayout, warm: WarmupBatch, *, log: bool = True) -> dict[str, Any]:
    """The shares of a run's warm-up batch (`norm_shares`) as a run config keeps them; with
    ``log``, the table is logged (INFO) and a dominant group named (WARNING)."""
    return _reported(norm_shares(layout, warm.energies, warm.norms), log)


def clipped_norm_shares(layout: ParamLayout, param_norms: Tensor, max_norm: float, *, eps: float = 0.0,
                        log: bool = True) -> dict[str, Any]:
    """`measured_shares` of a batch known by its per-parameter pre-clip norms (B, parameters),
    clipped at ``max_norm`` by ``C / max(||g_i|| + eps, C)`` (`gradspec.privacy.clip_factors`;
    Opacus: ``eps = OPACUS_CLIP_EPS``): what a user's Opacus loop records from its first
    physical batch (`gradspec.collect.record_opacus`)."""
    from gradspec.privacy import clip_factors

    e = param_norms.detach().to("cpu", torch.float64) ** 2
    norms = e.sum(1).sqrt()
    factors = clip_factors(norms, float(max_norm), eps=eps)
    return _reported(norm_shares(layout, e * factors[:, None] ** 2, norms), log)


def _reported(shares: NormShares, log: bool) -> dict[str, Any]:
    if log:
        logger.info("%s", shares.summary())
        why = shares.warning()
        if why is not None:
            logger.warning("%s", why)
    return shares.to_dict()


@dataclass(frozen=True)
class WarmupBatch:
    """One clipped pass over the warm-up batch, on the model's device: ``total`` (p,) the
    clipped sum, ``energies`` (B, parameters) each example's clipped squared norm per parameter
    (float64), ``norms`` (B,) the pre-clip norms (float64), ``examples`` B."""

    total: Tensor
    energies: Tensor
    norms: Tensor
    examples: int


def warmup_batch(config: Any, layout: ParamLayout, task: Any, ghost: Any, grads: Any,
                 device: torch.device) -> WarmupBatch:
    """The run's warm-up batch, clipped as the run clips, at the starting weights.

    The batch is the first ``batch_size`` training examples (index order, the same on every
    rank). Nothing is trained and the random generators are restored after it, so the run
    trains exactly as without it. Under torchrun every rank that needs it computes it alone
    from the whole batch, the same arithmetic on the same examples, so the ranks make the
    same sketch plan (tests/train/test_sketch_distributed.py). No collective: an all-reduce
    of the energies here hung the two-rank tests (cause not found).

    Args:
        config: the run's `TrainConfig` (``batch_size``, ``clip``, ``max_grad_norm``).
        layout: the trained parameters.
        task: the run's task (``task.train``).
        ghost: the run's `GhostClipping`, or None (``grads`` then forms the rows).
        grads: the run's `PerExampleGradients`.
        device: where the model is.
    """
    from gradspec.privacy import clip_rows, per_parameter_norms

    n = len(task.train)
    idx = torch.arange(min(n, max(int(config.batch_size), 1)))
    batch = {k: v.to(device) for k, v in task.train.batch(idx).items()}
    C = config.max_grad_norm if config.clip else None  # noqa: N806 - the paper's name
    spans = [(s.offset, s.stop) for s in layout.params]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if ghost is not None:
            total, energies, norms = ghost.clipped_energies(batch, C)
        else:
            total = torch.zeros(layout.p, device=device)
            parts, pre = [], []
            for g, _ in grads.iter_microbatches(batch):
                if C is not None:  # in place, as the trainer clips: no second (B, p) copy
                    g, norm, _ = clip_rows(g, C, in_place=True)
                    pre.append(norm.detach())
                parts.append(per_parameter_norms(g.detach(), spans) ** 2)
                total += g.sum(0)
            energies = torch.cat(parts)
            norms = torch.cat(pre) if pre else energies.sum(1).sqrt()
    return WarmupBatch(total=total.detach(), energies=energies.detach().double(), norms=norms.detach().double(),
                       examples=len(idx))
