"""Build the bundled private optimizers and projectors by name.

Example:
    >>> from gradspec.optim import make_algorithm
    >>> make_algorithm("rpdp-sgd", rank=10).name
    'rpdp-sgd'
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Any

import torch

from gradspec._enums import parse_choice
from gradspec.collect._hooks import StepHooks
from gradspec.optim._adadps import AdaDPS
from gradspec.optim._adagrad import NoisyAdaGrad
from gradspec.optim._dpadam import DPAdam
from gradspec.optim._pdp import PDPSGD
from gradspec.optim._projectors import FixedProjector, Projector, PublicProjector, RandomProjector
from gradspec.optim._subspace import SubspaceRetrain

__all__ = [
    "Algorithm",
    "ProjectorKind",
    "make_algorithm",
    "make_projector",
    "spectrum_basis",
]


class Algorithm(StrEnum):
    """The bundled private optimizers."""

    DP_SGD = "dp-sgd"  # Abadi et al. 2016
    SUBSPACE = "subspace"  # retrain in a fixed subspace, Li et al. 2022 §4.2
    PDP_SGD = "pdp-sgd"  # Zhou et al. 2021, Alg. 1
    RPDP_SGD = "rpdp-sgd"  # Zhou et al. 2021, random projector
    NOISY_ADAGRAD = "noisy-adagrad"  # Kairouz et al. 2021, Alg. 1
    ADADPS = "adadps"  # Li et al. 2022 (AdaDPS), Alg. 1
    DP_ADAM = "dp-adam"  # Adam on privatised gradients


class ProjectorKind(StrEnum):
    """Where a projector's subspace comes from."""

    SPECTRUM = "spectrum"  # top-k of a spectrum store (or a given basis)
    PUBLIC = "public"  # top-k eigenspace of public gradients, recomputed every s steps
    RANDOM = "random"  # Gaussian, orthonormalised


#: Projected algorithms and their default projector.
PROJECTED = {
    Algorithm.SUBSPACE: ProjectorKind.SPECTRUM,
    Algorithm.PDP_SGD: ProjectorKind.PUBLIC,
    Algorithm.RPDP_SGD: ProjectorKind.RANDOM,
    Algorithm.NOISY_ADAGRAD: ProjectorKind.PUBLIC,
}

_PROJECTOR_OPTIONS = ("projector", "rank", "spectrum", "basis", "public_size", "period", "seed")
_OPTIONS: dict[Algorithm, tuple[str, ...]] = {
    Algorithm.DP_SGD: (),
    Algorithm.SUBSPACE: ("noise",),
    Algorithm.PDP_SGD: ("start_epoch",),
    Algorithm.RPDP_SGD: ("start_epoch",),
    Algorithm.NOISY_ADAGRAD: ("precond_noise_multiplier", "diagonal", "lipschitz", "rcond",
                              "noise_seed"),
    Algorithm.ADADPS: ("rule", "side_information", "public_size", "public_batch", "beta1",
                       "beta2", "eps", "seed"),
    Algorithm.DP_ADAM: ("betas", "eps"),
}


def spectrum_basis(path: str | os.PathLike, rank: int) -> torch.Tensor:
    """The first ``rank`` right singular vectors (p x rank, float64) of a spectrum store.

    Raises:
        ValueError: if the store is not complete or holds fewer than ``rank`` vectors.
    """
    from gradspec.store._spectrum import SpectrumStore

    store = SpectrumStore.open(path)
    if store.status != "complete":
        raise ValueError(f"the spectrum store {str(path)!r} is {store.status!r}, not complete: "
                         "finish `gradspec pca` first")
    if rank > store.k:
        raise ValueError(f"rank {rank} exceeds the {store.k} vectors in {str(path)!r}")
    v = torch.from_numpy(store.read_v()[:, :rank].astype("float64"))
    return v


def make_projector(
    kind: ProjectorKind | str, *, rank: int, spectrum: str | os.PathLike | None = None,
    basis: torch.Tensor | None = None, public_size: int = 100, period: int = 1, seed: int = 0,
) -> Projector:
    """A projector of rank k.

    Args:
        kind: ``spectrum`` (needs ``spectrum``, a spectrum store path, or ``basis``),
            ``public`` or ``random``.
        rank: k.
        spectrum: path of a spectrum store (``gradspec pca`` output).
        basis: a p x k' basis instead of a store.
        public_size: m, for ``public``.
        period: s, the recompute period in steps, for ``public``.
        seed: chooses the public examples (``public``) or the random basis (``random``).

    Raises:
        ValueError: for an unknown kind or missing inputs.
    """
    kind = parse_choice(ProjectorKind, kind, "projector")
    if kind == ProjectorKind.SPECTRUM:
        if (spectrum is None) == (basis is None):
            raise ValueError("a spectrum projector needs exactly one of a spectrum store path "
                             "(--projector PATH) or a basis")
        if spectrum is not None:
            basis = spectrum_basis(spectrum, rank)
        return FixedProjector(basis, rank=rank, orthonormalize=spectrum is not None)
    if kind == ProjectorKind.PUBLIC:
        return PublicProjector(rank, public_size=public_size, period=period, seed=seed)
    return RandomProjector(rank, seed=seed)


def make_algorithm(name: Algorithm | str, **options: Any) -> StepHooks:
    """The step hooks of a bundled private optimizer.

    Projected algorithms (``subspace``, ``pdp-sgd``, ``rpdp-sgd``, ``noisy-adagrad``)
    take ``projector`` (a :class:`Projector`, or a kind: ``spectrum``, ``public``,
    ``random``; default per algorithm) and the options of :func:`make_projector`
    (``rank``, ``spectrum``, ``basis``, ``public_size``, ``period``, ``seed``).
    Algorithm options: ``subspace``: ``noise``; ``pdp-sgd``/``rpdp-sgd``: ``start_epoch``;
    ``noisy-adagrad``: ``precond_noise_multiplier``, ``diagonal``, ``lipschitz``, ``rcond``,
    ``noise_seed``; ``adadps``: ``rule``, ``side_information``, ``public_size``,
    ``public_batch``, ``beta1``, ``beta2``, ``eps``, ``seed``; ``dp-adam``: ``betas``, ``eps``.

    Raises:
        ValueError: for an unknown algorithm or option, naming the valid ones.
    """
    algorithm = parse_choice(Algorithm, name, "algorithm")
    valid = _OPTIONS[algorithm] + (_PROJECTOR_OPTIONS if algorithm in PROJECTED else ())
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for algorithm {str(algorithm)!r}; "
                         f"valid options are {sorted(valid)}")
    if algorithm == Algorithm.DP_SGD:
        return StepHooks()
    if algorithm == Algorithm.ADADPS:
        return AdaDPS(**options)
    if algorithm == Algorithm.DP_ADAM:
        return DPAdam(**options)

    projector = options.pop("projector", None) or PROJECTED[algorithm]
    proj_opts = {k: options.pop(k) for k in _PROJECTOR_OPTIONS[1:] if k in options}
    if not isinstance(projector, Projector):
        if "rank" not in proj_opts:
            raise ValueError(f"{str(algorithm)!r} needs a rank k (rank=...)")
        projector = make_projector(projector, **proj_opts)
    elif proj_opts:
        raise ValueError(f"options {sorted(proj_opts)} describe a projector, but a projector "
                         "object was given")
    if algorithm == Algorithm.SUBSPACE:
        return SubspaceRetrain(projector, **options)
    if algorithm == Algorithm.NOISY_ADAGRAD:
        if "noise_seed" in options:
            options["seed"] = options.pop("noise_seed")
        return NoisyAdaGrad(projector, **options)
    return PDPSGD(projector, **options)
