"""Choices shared by the library and the CLI (one StrEnum per choice)."""

from __future__ import annotations

from enum import StrEnum


class CollectMode(StrEnum):
    """What `collect` stores per row."""

    BATCH = "batch"  # the average of the clipped per-example gradients of a step (Li et al. 2022)
    PER_EXAMPLE = "per-example"  # each clipped per-example gradient


class Sampling(StrEnum):
    """How a DP-SGD step draws its batch."""

    POISSON = "poisson"  # each example joins independently with probability q (accounted as such)
    SHUFFLE = "shuffle"  # a fresh permutation per epoch cut into fixed-size batches


class Accounting(StrEnum):
    """How (epsilon, delta) is computed."""

    PLD = "pld"  # privacy loss distributions (dp-accounting); tightest
    RDP = "rdp"  # Renyi DP with the improved conversion (dp-accounting)
    RDP_CLASSIC = "rdp-classic"  # RDP(a) + log(1/delta)/(a-1), minimised over a grid (Abadi et al., older papers)


class GradDtype(StrEnum):
    """On-disk dtype of the gradient rows."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


class PerExampleBackend(StrEnum):
    """How per-example gradients are computed."""

    VMAP = "vmap"  # torch.func: vmap(grad(functional_call))
    HOOKS = "hooks"  # Opacus GradSampleModule (module hooks)
    GHOST = "ghost"  # ghost clipping: norms and the clipped sum, no rows (batch mode only)
    AUTO = "auto"  # the trainer picks ghost where it applies (batch mode, layers it handles), else vmap


class PcaMethod(StrEnum):
    """Spectral methods of the engine."""

    AUTO = "auto"
    GRAM = "gram"
    ORTHOGONAL = "orthogonal"
    KRYLOV = "krylov"
    LANCZOS = "lanczos"


def parse_choice(enum: type[StrEnum], value: str | StrEnum, what: str):
    """Return ``enum(value)`` or raise a ValueError naming the valid choices."""
    try:
        return enum(value)
    except ValueError:
        valid = ", ".join(m.value for m in enum)
        raise ValueError(f"unknown {what} {value!r}; choose one of: {valid}") from None
