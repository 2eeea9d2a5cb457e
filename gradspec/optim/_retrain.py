"""Experiments: one private optimizer on one configuration, or a grid of them.

:func:`retrain` runs a configuration through the trainer (:func:`gradspec.train.train`) with
the optimizer's hooks and no gradient store, and writes ``retrain.json`` (algorithm,
options, epsilon, final metrics) next to the run's ``metrics.jsonl``. :func:`sweep`
runs a grid over algorithms, ranks, seeds and noise multiplier or epsilon, one directory each,
and writes ``summary.csv`` and ``summary.json`` of every finished run in its folder (an
earlier sweep's into the same folder too).

``retrain.json`` also records what the optimizer used (``hooks``: the public examples'
ids into the task's pool under ``public_ids``, the random projector's seed, the fixed
subspace's source and parameters, AdaDPS's side information) and the settings the run
was asked for (``settings``), which a resumed sweep compares before reusing a run.
Final metrics hold ``eval_*`` (held-out), ``train_*`` (the private training set, at
the final parameters), the held-out size ``eval_examples`` and, for an accuracy, its
binomial standard error ``eval_accuracy_se`` = sqrt(a (1 - a) / n_eval): differences
between runs well below twice it are noise of the evaluation set.

Randomness of the optimizer (the random projector, the choice of public examples)
follows the run's seed unless the options fix ``seed``, so the runs of a sweep over
seeds differ in it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gradspec._json import as_saved
from gradspec._json import describe_jsonable as _jsonable
from gradspec.optim._projectors import Projector
from gradspec.optim._registry import (
    PROJECTED,
    Algorithm,
    algorithm_options,
    make_algorithm,
    outer_config,
)
from gradspec.optim._result import RESULT_NAME, RetrainResult, read_result, write_result
from gradspec.optim._summary import write_summary
from gradspec.tasks import Task
from gradspec.train import BOOKKEEPING, StepHooks, TrainConfig

logger = logging.getLogger(__name__)

__all__ = ["retrain", "sweep"]

def _rank(hooks: StepHooks, options: dict[str, Any]) -> int | None:
    projector = getattr(hooks, "projector", None)
    return projector.rank if projector is not None else options.get("rank")


def _describe(hooks: StepHooks) -> dict[str, Any]:
    """What the hooks used (public example ids, projector seed, ...), JSON-able."""
    out: dict[str, Any] = {"name": hooks.name}
    describe = getattr(hooks, "describe", None)
    if callable(describe):
        out.update(describe())
    projector = getattr(hooks, "projector", None)
    if "projector" not in out and callable(getattr(projector, "describe", None)):
        out["projector"] = projector.describe()
    return _jsonable(out)


def _seeded_options(name: str | Algorithm, options: dict[str, Any], seed: int) -> dict[str, Any]:
    """``options`` with ``seed`` set to the run's seed when the algorithm takes one and it is
    not given: the random projector and the public examples then differ across seeds."""
    if "seed" in options or "seed" not in algorithm_options(name):
        return options
    if isinstance(options.get("projector"), Projector):
        return options
    return {**options, "seed": seed}


def _held_out_report(task: Task, final: dict[str, float]) -> dict[str, float]:
    """The held-out size and the binomial standard error of the held-out accuracy."""
    n = len(task.eval)
    out: dict[str, float] = {"eval_examples": n}
    acc = final.get("eval_accuracy")
    if acc is not None and n:
        out["eval_accuracy_se"] = math.sqrt(max(acc * (1 - acc), 0.0) / n)
    return out


def _train_metrics(task: Task, config: TrainConfig) -> dict[str, float]:
    """Loss and metrics on the private training set at the current parameters (``train_*``)."""
    from gradspec.train import evaluate, resolve_device

    device = resolve_device(config.device)
    view = SimpleNamespace(eval=task.train, forward=task.forward, loss=task.loss, metrics=task.metrics)
    was_training = task.model.training
    task.model.eval()
    try:
        found = evaluate(view, task.model, device)
    finally:
        task.model.train(was_training)
    return {f"train_{k.removeprefix('eval_')}": v for k, v in found.items()}


def _accounting(hooks: StepHooks, config: TrainConfig) -> str:
    """How the run's epsilon accounts the gradient releases (and the hooks' own)."""
    if config.sampling != "poisson":
        text = "gradient mechanism per epoch of shuffled batches (no subsampling amplification)"
    elif getattr(hooks, "subsampling_amplification", True):
        text = "Poisson-subsampled gradient mechanism"
    else:
        text = (f"gradient mechanism without subsampling amplification ({hooks.name}'s releases "
                "read the sampled batches)")
        if hooks.name == "noisy-adagrad":
            text = ("gradient mechanism without subsampling amplification (noisy AdaGrad's "
                    "preconditioner reads the sampled batches)")
    if getattr(hooks, "extra_privacy", False):
        text += f", composed with {hooks.name}'s own Gaussian mechanisms"
    return text


def _dp_guarantee(hooks: StepHooks, task: Task) -> tuple[bool, str | None]:
    """Whether the run's epsilon is a DP guarantee, and if not why.

    A fixed subspace (a :class:`FixedProjector`, e.g. from ``gradspec pca`` of a collect
    run) is computed without noise, so its privacy cost is not accounted and cannot be:
    when its gradients came from examples of this run's private training split, the
    reported epsilon covers the gradient noise only. The basis is taken to be of
    disjoint data only when its records show it (:func:`spectrum_provenance`): another
    pool of examples (the source task's ``pool``, default its name, differs from this
    task's), or the same pool with recorded ``train_ids`` disjoint from this run's
    training ids (``task.train.ids``, else ``task.config["train_ids"]``). Anything else,
    a basis given as a tensor included, is treated as computed from the private data.
    """
    from gradspec.optim._projectors import FixedProjector
    from gradspec.optim._registry import spectrum_provenance

    projector = getattr(hooks, "projector", None)
    if not isinstance(projector, FixedProjector):
        return True, None
    if projector.source is None:
        return False, ("the fixed basis was given as a tensor, with no record of the data it came "
                       "from: it is treated as computed from the private training data")
    prov = spectrum_provenance(projector.source)
    if not prov["known"]:
        return False, (f"the spectrum store {prov['spectrum']!r} does not say what data its gradients "
                       "came from (its source gradient store is not readable here): it is treated as "
                       "computed from the private training data")
    pool = task.config.get("pool", task.name) if isinstance(task.config, dict) else task.name
    if prov["pool"] != pool:
        return True, None
    ids = task.train.ids if task.train.ids is not None else task.config.get("train_ids")
    if prov["train_ids"] is not None and ids is not None:
        shared = len(set(prov["train_ids"]) & {int(i) for i in ids})
        if shared == 0:
            return True, None
        how = f"shares {shared} examples with"
    else:
        how = "is not recorded as disjoint from"
    return False, (f"the subspace comes from noise-free gradients (`gradspec pca` of "
                   f"{prov['spectrum']!r}) of task {prov['task']!r}'s training split (n = "
                   f"{prov['n_train']}), which {how} this run's private training split; its "
                   "privacy cost is not accounted")


def retrain(
    *,
    config: TrainConfig,
    algorithm: str | Algorithm | StepHooks,
    out: str | os.PathLike,
    options: dict[str, Any] | None = None,
    task: Task | None = None,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    train_metrics: bool = True,
) -> RetrainResult:
    """Train one configuration with a private optimizer and report its metrics and epsilon.

    Algorithms that compute their own direction (noisy AdaGrad, DP-Adam) run with the
    outer optimizer SGD without momentum (``theta <- theta - lr d``); the config is
    changed to that and the change is logged and saved in ``config.json``.

    Args:
        config: the training run (task, steps, batch size, noise multiplier or epsilon, lr, ...).
        algorithm: a name (see :class:`Algorithm`) or ready hooks.
        out: run directory (``metrics.jsonl``, ``config.json``, ``retrain.json``).
        options: options of :func:`make_algorithm` when ``algorithm`` is a name; ``seed``
            (random projector, public examples) defaults to ``config.seed``.
        task: a user's own task (default: built from ``config``).
        resume: continue the run in ``out`` from its last checkpoint (an interrupted run);
            refused for a run started with another algorithm or options, or settings that a
            resume may not change (see :func:`gradspec.train.train`).
        overwrite: replace a run in ``out``.
        progress: progress bar on stderr.
        train_metrics: also report loss and metrics on the private training set at the
            end (``train_*``; one pass over it).

    Returns:
        A :class:`RetrainResult` (also written to ``out/retrain.json``).

    Raises:
        ValueError: bad options, or a target epsilon with an optimizer that spends
            privacy of its own (calibrate the noise multiplier with ``gradspec account`` instead).
    """
    from gradspec.train import is_run_dir, train

    if not (resume or overwrite) and is_run_dir(out):  # what to advise depends on whether the run finished
        if (Path(out) / RESULT_NAME).is_file():
            raise FileExistsError(f"{str(out)!r} already holds a finished run: pass --overwrite to replace it or "
                                  "choose another --out")
        raise FileExistsError(f"{str(out)!r} holds an interrupted run: pass --resume to continue it (with the "
                              "settings it was started with), --overwrite to replace it, or choose another --out")
    options = dict(options or {})
    requested = config.to_dict()
    if isinstance(algorithm, StepHooks):
        if options:
            raise ValueError("options are for an algorithm given by name; configure the hooks instead")
        hooks = algorithm
    else:
        options = _seeded_options(algorithm, options, config.seed)
        if options.get("noise_seed") is not None and int(options["noise_seed"]) == config.seed + 2:
            raise ValueError(f"noise_seed={options['noise_seed']} is the seed of the gradient noise "
                             f"(run seed + 2): the preconditioner noise would repeat it; choose another")
        hooks = make_algorithm(algorithm, **options)
    outer = outer_config(hooks, config)
    if outer is not config:
        logger.info("%s computes its own direction: outer optimizer set to sgd, momentum 0", hooks.name)
        config = outer
    if getattr(hooks, "extra_privacy", False) and config.target_epsilon is not None:
        raise ValueError(
            f"{hooks.name} spends privacy beyond the gradient noise, so a target epsilon cannot be "
            "met by calibrating the noise multiplier alone: give the noise multiplier (and the preconditioner's)"
        )
    if task is None:
        from gradspec.tasks import make_task

        task = make_task(config.task, seed=config.seed_of_task, **config.task_options)
    if not getattr(hooks, "subsampling_amplification", True) and config.sampling == "poisson":
        logger.info("%s: the gradient releases are accounted without amplification by subsampling "
                    "(the hooks' releases read the sampled batches)", hooks.name)
    dp_guarantee, dp_caveat = _dp_guarantee(hooks, task)
    if not dp_guarantee:
        logger.warning("%s: the reported epsilon is NOT a DP guarantee: %s", hooks.name, dp_caveat)
    settings = {"config": requested, "options": _jsonable(options),
                "algorithm": hooks.name if isinstance(algorithm, StepHooks) else str(algorithm)}
    result = train(config, out=out, task=task, resume=resume, overwrite=overwrite, progress=progress,
                   hooks=hooks, write_store=False, run_info=_run_info(settings))
    final = dict(result.final_metrics)
    final.update(_held_out_report(task, final))
    if train_metrics and result.steps:
        final.update(_train_metrics(task, config))
    res = RetrainResult(
        out=Path(out), algorithm=hooks.name, options=_jsonable(options), rank=_rank(hooks, options),
        seed=config.seed, noise_multiplier=result.noise_multiplier, epsilon=result.epsilon,
        delta=result.delta, steps=result.steps, final_metrics=final, metrics=result.metrics,
        hooks=_describe(hooks), settings=settings,
        accounting=_accounting(hooks, config) if math.isfinite(result.epsilon) else "non-private",
        dp_guarantee=dp_guarantee, dp_caveat=dp_caveat,
    )
    write_result(res, Path(out) / RESULT_NAME)
    return res


def _run_info(settings: dict[str, Any]) -> dict[str, Any]:
    """What a run records of the algorithm it was started with (its run config's ``run_info``),
    so that a resume with another is refused (the trainer checks the config itself)."""
    return {"retrain": {"algorithm": settings["algorithm"], "options": settings["options"]}}


def _resumable(run_dir: Path, config: TrainConfig, algorithm: str, options: dict[str, Any]) -> str | None:
    """Why the interrupted run in ``run_dir`` cannot be continued as this sweep's run, or None
    when it can: it has a checkpoint, and was started with these very settings (the config it
    ran with up to :data:`~gradspec.train.BOOKKEEPING`, the algorithm and its options)."""
    from gradspec.train import CHECKPOINT_NAME, read_run_config, read_run_info

    if not (run_dir / CHECKPOINT_NAME).is_file():
        return "no checkpoint"
    try:
        started = read_run_config(run_dir).to_dict()
        info = read_run_info(run_dir)
    except (OSError, ValueError) as exc:
        return str(exc).splitlines()[0]
    ran = as_saved(outer_config(algorithm, config).to_dict())
    diff = _changed(started, ran)
    asked = as_saved({"algorithm": algorithm, "options": options})
    if "retrain" not in info:
        diff.append("no record of its algorithm")
    elif info["retrain"] != _run_info(asked)["retrain"]:
        diff.append("algorithm or options")
    return f"other settings ({', '.join(diff)})" if diff else None


def _run_name(algorithm: str, rank: int | None, seed: int, noise_multiplier: float | None,
              epsilon: float | None, tag: str | None = None, *, legacy: bool = False) -> str:
    """A sweep run's directory name, e.g. ``rpdp-sgd-k5-seed1-nm0.5``; ``legacy``: the name
    sweeps used before (``...-sigma0.5``, when sigma still meant the noise multiplier)."""
    parts = [algorithm] + ([tag] if tag else []) + ([f"k{rank}"] if rank is not None else [])
    parts.append(f"seed{seed}")
    if noise_multiplier is not None:
        parts.append(f"{'sigma' if legacy else 'nm'}{noise_multiplier:g}")
    if epsilon is not None:
        parts.append(f"eps{epsilon:g}")
    return "-".join(parts)


def _options_tag(options: dict[str, Any]) -> str:
    """A short stable tag of an entry's options (for an algorithm listed twice in a sweep)."""
    text = json.dumps(_jsonable(options), sort_keys=True, default=str)
    return "o" + hashlib.sha1(text.encode()).hexdigest()[:6]


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys of config ``new`` whose values ``old`` does not share, bookkeeping aside (what a
    finished run may be reused, or an interrupted one continued, under)."""
    return [k for k, v in new.items() if k not in BOOKKEEPING and old.get(k) != v]


def _check_reusable(saved: dict[str, Any], settings: dict[str, Any], run_dir: Path) -> None:
    """Refuse to reuse a finished sweep run that was asked for with other settings."""
    old = saved.get("settings")
    settings = as_saved(settings)
    if not old:
        raise ValueError(f"{str(run_dir)!r} holds a run that does not record its settings, so it "
                         "cannot be reused safely; pass overwrite=True (CLI --overwrite) or another out")
    was, now = old.get("config", {}), settings["config"]
    diff = [f"{k}: {was.get(k)!r} -> {now[k]!r}" for k in _changed(was, now)]
    if old.get("algorithm") != settings["algorithm"]:
        diff.append(f"algorithm: {old.get('algorithm')!r} -> {settings['algorithm']!r}")
    if old.get("options") != settings["options"]:
        diff.append(f"options: {old.get('options')} -> {settings['options']}")
    if diff:
        raise ValueError(f"{str(run_dir)!r} holds a finished run with other settings ({'; '.join(diff)}); "
                         "pass overwrite=True (CLI --overwrite) to rerun it, or use another out")


def sweep(
    *,
    config: TrainConfig,
    algorithms: Sequence[str | tuple[str, dict[str, Any]]],
    out: str | os.PathLike,
    ranks: Sequence[int] = (),
    seeds: Sequence[int] = (0,),
    noise_multipliers: Sequence[float] = (),
    epsilons: Sequence[float] = (),
    task_factory: Callable[[int], Task] | None = None,
    overwrite: bool = False,
    progress: bool = False,
    train_metrics: bool = True,
) -> list[dict[str, Any]]:
    """Run a grid of :func:`retrain` configurations and write a summary table.

    Projected algorithms run once per rank; the others (DP-SGD, DP-Adam, AdaDPS) once
    per seed and privacy level, as the full-dimensional baselines. Finished runs
    (with ``retrain.json``) are reused unless ``overwrite``, so a sweep resumes; a
    finished run asked for with other settings is refused, not reused. An interrupted run
    (a checkpoint, no ``retrain.json``) continues from its last checkpoint when it was
    started with the same settings (up to :data:`~gradspec.train.BOOKKEEPING`), and is
    replaced otherwise; either is logged. The optimizer's
    ``seed`` follows each run's seed unless an entry's options fix it. An algorithm
    listed twice (with different options) gets an options tag in its run names.

    Args:
        config: the base run; ``seed`` and the noise multiplier / epsilon are replaced per
            grid point.
        algorithms: names, or ``(name, options)`` pairs.
        out: the sweep directory; each run in ``out/<algorithm>-k<rank>-seed<s>-nm<z>``
            (``-eps<e>`` for a target epsilon). A finished run of an older sweep, named
            ``...-sigma<z>``, is reused as well.
        ranks: k values for projected algorithms (e.g. 10, 20, 100 as Li et al. Fig. 2b).
        seeds: training seeds.
        noise_multipliers: noise multipliers z (or give ``epsilons``; neither: the config's).
        epsilons: target epsilons (the noise multiplier calibrated per run).
        task_factory: builds the task for a seed (default: from the config).
        overwrite: rerun finished and interrupted runs from the start.
        progress: progress bar per run.
        train_metrics: report ``train_*`` metrics (see :func:`retrain`).

    Returns:
        This sweep's summary rows (``out/summary.csv`` and ``out/summary.json`` list these and
        the folder's other finished runs).
    """
    if noise_multipliers and epsilons:
        raise ValueError("sweep over noise multipliers or over epsilons, not both")
    for what, values in (("ranks", ranks), ("seeds", seeds), ("noise_multipliers", noise_multipliers),
                         ("epsilons", epsilons)):
        seen = [v for i, v in enumerate(values) if v in list(values)[:i]]
        if seen:
            # the second run would reuse the first's directory: one run counted twice in the summary
            raise ValueError(f"{what} lists {seen[0]!r} twice; give each value once")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    privacy: list[tuple[float | None, float | None]] = (
        [(s, None) for s in noise_multipliers] or [(None, e) for e in epsilons] or [(None, None)]
    )
    rows = []
    entries = [(e, {}) if isinstance(e, str) else (e[0], dict(e[1])) for e in algorithms]
    counts: dict[str, int] = {}
    for name, _ in entries:
        counts[name] = counts.get(name, 0) + 1
    for name, base in entries:
        tag = _options_tag(base) if counts[name] > 1 else None
        projected = Algorithm(name) in PROJECTED if name in set(Algorithm) else False
        if projected and not ranks and "rank" not in base and "projector" not in base:
            raise ValueError(f"{name!r} is projected: give ranks to sweep over")
        for rank in (ranks or [None]) if projected else [None]:
            for seed in seeds:
                for z, eps in privacy:
                    cfg = dataclasses.replace(
                        config, seed=seed,
                        noise_multiplier=z if z is not None else (
                            None if eps is not None else config.noise_multiplier),
                        target_epsilon=eps if eps is not None else (
                            None if z is not None else config.target_epsilon),
                    )
                    options = {**base, **({"rank": rank} if rank is not None else {})}
                    options = _seeded_options(name, options, seed)
                    run_dir = out / _run_name(name, rank, seed, z, eps, tag)
                    legacy = out / _run_name(name, rank, seed, z, eps, tag, legacy=True)
                    if not overwrite and not run_dir.exists() and (legacy / RESULT_NAME).is_file():
                        run_dir = legacy  # finished under the old name: reuse it (checked below)
                    done = run_dir / RESULT_NAME
                    if done.is_file() and not overwrite:
                        res = read_result(run_dir)
                        _check_reusable(res.to_dict(), {"config": cfg.to_dict(), "algorithm": name,
                                                        "options": _jsonable(options)}, run_dir)
                        logger.info("reusing finished run %s", run_dir)
                    else:
                        resume = False
                        if run_dir.is_dir() and not overwrite:  # an interrupted run: continue it if it is this one
                            why = _resumable(run_dir, cfg, name, _jsonable(options))
                            resume = why is None
                            # replacing discards the steps it ran: a warning, seen where INFO is not
                            logger.log(logging.INFO if resume else logging.WARNING, "sweep run %s: %s",
                                       run_dir.name, "continuing the interrupted run"
                                       if resume else f"replacing the interrupted run ({why})")
                        else:
                            logger.info("sweep run %s", run_dir.name)
                        res = retrain(config=cfg, algorithm=name, options=options, out=run_dir,
                                      task=task_factory(seed) if task_factory else None, resume=resume,
                                      overwrite=not resume, progress=progress, train_metrics=train_metrics)
                    rows.append(res.to_row())
    write_summary(rows, out)
    return rows
