"""Build the bundled private optimizers and projectors by name.

Example:
    >>> from gradspec.optim import make_algorithm
    >>> make_algorithm("rpdp-sgd", rank=10).name
    'rpdp-sgd'
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gradspec._enums import parse_choice
from gradspec.optim._adadps import AdaDPS
from gradspec.optim._adagrad import NoisyAdaGrad
from gradspec.optim._dpadam import DPAdam
from gradspec.optim._orthonormal import LARGE_BASIS, SPECTRUM_V_ATOL
from gradspec.optim._pdp import PDPSGD
from gradspec.optim._projectors import FixedProjector, Projector, RandomProjector
from gradspec.optim._public import PublicProjector
from gradspec.optim._subspace import ComplementRetrain, SubspaceRetrain
from gradspec.train import StepHooks

__all__ = [
    "Algorithm",
    "ProjectorKind",
    "algorithm_options",
    "make_algorithm",
    "make_projector",
    "spectrum_basis",
    "spectrum_layout",
    "spectrum_provenance",
]

logger = logging.getLogger(__name__)


class Algorithm(StrEnum):
    """The bundled private optimizers."""

    DP_SGD = "dp-sgd"  # Abadi et al. 2016
    SUBSPACE = "subspace"  # retrain in a fixed subspace, Li et al. 2022 §4.2
    COMPLEMENT = "complement"  # ... in its orthogonal complement, Song, Ahn & Yun 2025
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
    Algorithm.COMPLEMENT: ProjectorKind.SPECTRUM,
    Algorithm.PDP_SGD: ProjectorKind.PUBLIC,
    Algorithm.RPDP_SGD: ProjectorKind.RANDOM,
    Algorithm.NOISY_ADAGRAD: ProjectorKind.PUBLIC,
}

#: The hooks class of each algorithm (what :func:`make_algorithm` builds).
_HOOKS: dict[Algorithm, type[StepHooks]] = {
    Algorithm.DP_SGD: StepHooks, Algorithm.SUBSPACE: SubspaceRetrain, Algorithm.COMPLEMENT: ComplementRetrain,
    Algorithm.PDP_SGD: PDPSGD, Algorithm.RPDP_SGD: PDPSGD, Algorithm.NOISY_ADAGRAD: NoisyAdaGrad,
    Algorithm.ADADPS: AdaDPS, Algorithm.DP_ADAM: DPAdam,
}


def outer_config(algorithm: Algorithm | str | StepHooks, config):
    """The config a run of ``algorithm`` trains with: an algorithm that computes its own update
    direction (noisy AdaGrad, DP-Adam) steps with plain SGD without momentum, so its optimizer
    and momentum become ``sgd`` and 0 (what :func:`gradspec.optim.retrain` runs and saves)."""
    hooks = algorithm if isinstance(algorithm, StepHooks) else _HOOKS[parse_choice(Algorithm, algorithm, "algorithm")]
    if getattr(hooks, "own_direction", False) and (config.optimizer != "sgd" or config.momentum):
        return dataclasses.replace(config, optimizer="sgd", momentum=0.0)
    return config


_PROJECTOR_OPTIONS = ("projector", "rank", "spectrum", "basis", "public_size", "period", "seed",
                      "check_layout")
_OPTIONS: dict[Algorithm, tuple[str, ...]] = {
    Algorithm.DP_SGD: (),
    Algorithm.SUBSPACE: ("noise",),
    Algorithm.COMPLEMENT: (),
    Algorithm.PDP_SGD: ("start_epoch",),
    Algorithm.RPDP_SGD: ("start_epoch",),
    Algorithm.NOISY_ADAGRAD: ("precond_noise_multiplier", "diagonal", "lipschitz", "rcond",
                              "noise_seed"),
    Algorithm.ADADPS: ("rule", "side_information", "public_size", "public_batch", "beta1",
                       "beta2", "eps", "seed"),
    Algorithm.DP_ADAM: ("betas", "eps"),
}


def algorithm_options(name: Algorithm | str) -> tuple[str, ...]:
    """The options :func:`make_algorithm` takes for ``name``."""
    algorithm = parse_choice(Algorithm, name, "algorithm")
    return _OPTIONS[algorithm] + (_PROJECTOR_OPTIONS if algorithm in PROJECTED else ())


def spectrum_basis(path: str | os.PathLike, rank: int) -> torch.Tensor:
    """The first ``rank`` right singular vectors (p x rank) of a spectrum store.

    float64, or the store's own dtype (float32) above
    :data:`~gradspec.optim.LARGE_BASIS` entries; read block by block, so memory is the
    p x rank result (not all of the store's k columns).

    Raises:
        ValueError: if the store is not complete or holds fewer than ``rank`` vectors.
    """
    from gradspec.store import SpectrumStore

    store = SpectrumStore.open(path)
    if store.status != "complete":
        raise ValueError(f"the spectrum store {str(path)!r} is {store.status!r}, not complete: "
                         "finish `gradspec pca` first")
    if rank > store.k:
        raise ValueError(f"rank {rank} exceeds the {store.k} vectors in {str(path)!r}")
    p = store.shape[1]
    large = p * rank > LARGE_BASIS
    v = np.empty((p, rank), dtype=store.V.dtype if large else np.float64)
    for offset, block in store.iter_v_blocks():
        v[offset:offset + block.shape[0]] = block[:, :rank]
    return torch.from_numpy(v)


def _warn_unlike_rows(path: str | os.PathLike) -> None:
    """Warn, by name, when a spectrum's rows are not the kind retraining privatises (clipped
    means of per-example gradients): e.g. a Hugging Face Trainer's unclipped ``.grad``."""
    from gradspec.store import MEAN_OF_EXAMPLES, RowKind, SpectrumStore

    kind = (SpectrumStore.open(path).source or {}).get("row_kind")
    if kind and (not kind["clipped"] or kind["normalisation"] != MEAN_OF_EXAMPLES):
        logger.warning("the spectrum %r was computed from rows that are %s; retraining privatises "
                       "clipped means of per-example gradients", os.fspath(path), RowKind(**kind).describe())


def spectrum_layout(path: str | os.PathLike) -> list[tuple[str, tuple[int, ...]]] | None:
    """The parameters (name, shape), in order, whose gradients the rows of a spectrum
    store's V belong to; ``None`` if the store does not tell.

    Read from the store's recorded source: the source gradient store's layout (recorded
    in the spectrum store, or read from the source store at its recorded path, or next to
    the spectrum store under the same name), restricted to the recorded column ranges.

    Raises:
        ValueError: if the recorded columns cut a parameter in two, or do not add up to
            the store's p.
    """
    from gradspec.store import ParamLayout, SpectrumStore

    store = SpectrumStore.open(path)
    src, p = store.source, store.shape[1]
    try:  # what the store records of its source: a layout and column ranges, or damage
        if src.get("layout"):
            full = ParamLayout.from_list(src["layout"])
        else:
            full = _source_store_layout([src.get("path"), src.get("abspath")], path)
            if full is None:
                return None
        ranges = [(int(a), int(b)) for a, b in (src.get("col_ranges") or [(0, full.p)])]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the spectrum store {os.fspath(path)!r} records a damaged source layout or column "
                         f"ranges ({str(exc).splitlines()[0][:80]}); compute it again with `gradspec pca`") from None
    pairs = []
    for spec in full.params:
        inside = [(a, b) for a, b in ranges if a < spec.stop and spec.offset < b]
        if not inside:
            continue
        if not any(a <= spec.offset and spec.stop <= b for a, b in inside):
            raise ValueError(f"the spectrum store {os.fspath(path)!r} covers only part of parameter "
                             f"{spec.name!r}; a subspace of part of a parameter cannot be retrained")
        pairs.append((spec.name, tuple(spec.shape)))
    total = sum(math.prod(shape) for _, shape in pairs)
    if total != p:
        raise ValueError(f"the spectrum store {os.fspath(path)!r} has p={p} columns but its recorded "
                         f"source parameters hold {total}")
    return pairs


def spectrum_provenance(path: str | os.PathLike) -> dict[str, Any]:
    """What data a spectrum store's basis was computed from, as far as its records tell.

    Read from the config of the source gradient store (recorded in the spectrum store's
    source, opened at its recorded path or next to the spectrum store): the training run's
    task name, ``n_train``, and, when the task's config records them, ``train_ids`` (the
    examples it trained on, i.e. whose gradients are in the store) and ``pool`` (what the
    ids index; default the task's name). A spectrum whose source is not a readable gradient
    store, or one whose record has the wrong JSON types, has ``known: False`` (records are
    taken as written: a store cannot prove which examples its gradients came from).

    Returns:
        ``{"spectrum", "known", "task", "pool", "n_train", "train_ids", "noise_multiplier"}``.
    """
    from gradspec.store import SpectrumStore

    src = SpectrumStore.open(path).source
    out: dict[str, Any] = {"spectrum": os.fspath(path), "known": False, "task": None, "pool": None,
                           "n_train": None, "train_ids": None, "noise_multiplier": None}
    config = None
    if src.get("source") in (None, "gradient-store"):
        config = _source_store_config([src.get("path"), src.get("abspath")], path)
    if not config or not config.get("task"):
        return out
    task_config = config.get("task_config") or {}
    ids = task_config.get("train_ids") if isinstance(task_config, dict) else None
    if (not isinstance(task_config, dict) or not isinstance(config["task"], str)
            or not isinstance(task_config.get("pool", ""), str)
            or not (ids is None or (isinstance(ids, list) and all(type(i) is int for i in ids)))):
        # A record of the wrong types tells nothing: the basis counts as from the private data.
        logger.warning("the source gradient store of %r records its task, pool or train ids with the "
                       "wrong types: its data is treated as unknown", os.fspath(path))
        return out
    out.update(known=True, task=config["task"], pool=task_config.get("pool", config["task"]),
               n_train=config.get("n_train"), noise_multiplier=config.get("noise_multiplier"),
               train_ids=ids)
    return out


def _source_store_config(recorded: list[str | None], spectrum: str | os.PathLike) -> dict[str, Any] | None:
    """The run config of a spectrum's source gradient store, if it can be opened here."""
    from pathlib import Path

    from gradspec.store import GradientStore

    candidates = [Path(r) for r in recorded if r]
    candidates += [Path(spectrum).parent / c.name for c in candidates]
    for candidate in candidates:
        if candidate.exists():
            try:
                return dict(GradientStore.open(candidate, mode="r").config)
            except (OSError, ValueError, KeyError):
                continue
    return None


def _source_store_layout(recorded: list[str | None], spectrum: str | os.PathLike) -> Any:
    """The layout of a spectrum's source gradient store, if it can be opened here."""
    from pathlib import Path

    from gradspec.store import GradientStore

    candidates = [Path(r) for r in recorded if r]
    candidates += [Path(spectrum).parent / c.name for c in candidates]
    for candidate in candidates:
        if candidate.exists():
            try:
                return GradientStore.open(candidate, mode="r").layout
            except (OSError, ValueError, KeyError):
                continue
    return None


def _refuse_sketched(spectrum: str | os.PathLike) -> None:
    """Refuse a spectrum of a sketched gradient store (``gradspec collect --sketch``): its V
    lives in the sketch's M columns, not in parameter space (one line)."""
    import re

    from gradspec.store import GradientStore, SpectrumStore

    src = SpectrumStore.open(spectrum).source
    if src.get("replay"):  # `gradspec replay`: V in parameter space, from the run's exact rows
        return
    sketched = None
    candidates = [Path(r) for r in (src.get("path"), src.get("abspath")) if r]
    for candidate in [*candidates, *(Path(spectrum).parent / c.name for c in candidates)]:
        if candidate.exists():
            try:
                sketched = GradientStore.open(candidate, mode="r").sketch is not None
                break
            except (OSError, ValueError, KeyError):
                continue
    if sketched is None:  # the source is not here: its recorded columns say (sketch.exact, sketch.block<j>)
        names = [d.get("name") for d in src.get("layout") or [] if isinstance(d, dict)]
        sketched = bool(names) and all(isinstance(n, str) and re.fullmatch(r"sketch\.(exact|block\d+)", n)
                                       for n in names)
    if sketched:
        raise ValueError(
            f"the spectrum store {os.fspath(spectrum)!r} was computed on a sketched gradient store (gradspec "
            "collect --sketch): its right singular vectors live in the sketch's columns, not in parameter space, "
            "so they cannot project a run's gradients; `gradspec replay STORE --spectrum SPECTRUM --out V` "
            "replays a per-step run into parameter space, or use the spectrum of an unsketched store")


#: Energy of H outside its top-k directions (a share of ‖H‖_F²) at or below which the top-k
#: span all of H: float32 rows leave ~1e-14 there, a k below H's rank far more.
COMPLEMENT_OF_ALL = 1e-6


def _warn_complement_of_all(path: str | os.PathLike, rank: int) -> None:
    """Warn when ``-a complement`` removes every direction of the spectrum's H (k = its rank).

    Not refused: the complement still has p - k dimensions, and a retraining run's gradients
    (another trajectory, other batches) can have parts outside the span of the collected
    ones; whether they carry learning is the control's question. But where a model's
    gradients lie in that span (a low-rank task), every update is the noise alone."""
    from gradspec.store import SpectrumStore

    explained = SpectrumStore.open(path).array("cumulative_explained_variance")
    left = max(0.0, 1.0 - float(explained[rank - 1])) if 0 < rank <= explained.size else 1.0
    if left <= COMPLEMENT_OF_ALL:
        held = "all" if left < 1e-12 else f"all but {left:.1g}"
        logger.warning(
            "-a complement with k = %d removes every direction of the gradients %r was computed from "
            "(their top %d hold %s of their energy: k is their rank); the run trains only on the parts "
            "of its own gradients outside their span, and on noise alone where its gradients lie in "
            "it; choose a smaller k to keep some of them", rank, os.fspath(path), rank, held)


def make_projector(
    kind: ProjectorKind | str, *, rank: int, spectrum: str | os.PathLike | None = None,
    basis: torch.Tensor | None = None, public_size: int = 100, period: int = 1, seed: int = 0,
    check_layout: bool = True,
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
        check_layout: a ``spectrum`` projector checks at setup that the run trains the
            parameters (names, shapes, order) the spectrum was computed on; a store that
            does not record them is refused unless ``check_layout=False``, which
            compares p only.

    Raises:
        ValueError: for an unknown kind or missing inputs, or a spectrum store whose
            parameters are unknown (with ``check_layout``).
    """
    kind = parse_choice(ProjectorKind, kind, "projector")
    if kind == ProjectorKind.SPECTRUM:
        if (spectrum is None) == (basis is None):
            raise ValueError("a spectrum projector needs exactly one of a spectrum store path "
                             "(--projector PATH) or a basis")
        layout = None
        if spectrum is not None:
            _refuse_sketched(spectrum)
            basis = spectrum_basis(spectrum, rank)
            _warn_unlike_rows(spectrum)
            layout = spectrum_layout(spectrum) if check_layout else None
            if layout is None and check_layout:
                raise ValueError(
                    f"the spectrum store {os.fspath(spectrum)!r} does not record which parameters its "
                    "columns are (no layout, and its source gradient store is not readable here), so "
                    "the run's parameters cannot be checked against it; pass check_layout=False "
                    "(CLI --no-layout-check) to compare p only")
        # a spectrum's V is orthonormal up to what pca keeps (SPECTRUM_V_ATOL): repair that, refuse damage
        return FixedProjector(basis, rank=rank, orthonormalize=spectrum is not None, layout=layout,
                              source=None if spectrum is None else os.fspath(spectrum),
                              copy=spectrum is None,  # a basis read here is ours to change
                              repair_only=None if spectrum is None else SPECTRUM_V_ATOL)
    if kind == ProjectorKind.PUBLIC:
        return PublicProjector(rank, public_size=public_size, period=period, seed=seed)
    return RandomProjector(rank, seed=seed)


def make_algorithm(name: Algorithm | str, **options: Any) -> StepHooks:
    """The step hooks of a bundled private optimizer.

    Projected algorithms (``subspace``, ``complement``, ``pdp-sgd``, ``rpdp-sgd``,
    ``noisy-adagrad``)
    take ``projector`` (a :class:`Projector`, or a kind: ``spectrum``, ``public``,
    ``random``; default per algorithm) and the options of :func:`make_projector`
    (``rank``, ``spectrum``, ``basis``, ``public_size``, ``period``, ``seed``,
    ``check_layout``).
    Algorithm options: ``subspace``: ``noise``; ``complement``: none (the subspace of
    ``projector`` is projected out of the clipped sum, noise in all p dimensions);
    ``pdp-sgd``/``rpdp-sgd``: ``start_epoch``; ``noisy-adagrad``: ``precond_noise_multiplier``, ``diagonal``, ``lipschitz``, ``rcond``,
    ``noise_seed``; ``adadps``: ``rule``, ``side_information``, ``public_size``,
    ``public_batch``, ``beta1``, ``beta2``, ``eps``, ``seed``; ``dp-adam``: ``betas``, ``eps``.

    Raises:
        ValueError: for an unknown algorithm or option, naming the valid ones.
    """
    algorithm = parse_choice(Algorithm, name, "algorithm")
    valid = algorithm_options(algorithm)
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
    if algorithm == Algorithm.COMPLEMENT:
        if proj_opts.get("spectrum") is not None:
            _warn_complement_of_all(proj_opts["spectrum"], int(proj_opts["rank"]))
        return ComplementRetrain(projector)
    if algorithm == Algorithm.NOISY_ADAGRAD:
        if "noise_seed" in options:
            options["seed"] = options.pop("noise_seed")
        return NoisyAdaGrad(projector, **options)
    return PDPSGD(projector, **options)
