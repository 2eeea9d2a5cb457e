"""What a run folder holds, read through gradspec's own readers.

A run folder is what `gradspec collect --out` made and the later steps wrote into:
``gradients.zarr`` and ``metrics.jsonl`` (collect), ``spectrum.zarr`` (pca), a folder with
``report.json`` (decay), retraining runs (``retrain.json`` in the folder, or a sweep folder
of them). Any part may be missing, or still being written; :func:`read_run` reads what is
there, records how far each step got (:class:`Stage`), and keeps every part it could not
read as one line in ``problems`` instead of failing.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gradspec.plot import RunMetrics, read_metrics
from gradspec.spectrum import read_report, sigma_analysis, store_relation
from gradspec.store import GradientStore, SpectrumStore, StoreDamagedError, open_store

logger = logging.getLogger(__name__)

__all__ = ["RunContents", "Stage", "read_run"]

METRICS = "metrics.jsonl"
CONFIG = "config.json"
RESULT = "retrain.json"
REPORT = "report.json"

#: Stage states, from done to not begun.
COMPLETE, RUNNING, STOPPED, STALE, DAMAGED, UNREADABLE, ABSENT = (
    "complete", "running", "stopped", "stale", "damaged", "unreadable", "absent")


@dataclass
class Stage:
    """How far one step of the pipeline got in this folder.

    Attributes:
        name: ``collect``, ``pca``, ``decay`` or ``retrain``.
        state: one of ``complete``, ``running``, ``stopped``, ``stale``, ``damaged``,
            ``unreadable``, ``absent``.
        path: what it wrote (None when absent).
        note: one line: what is there, or what is missing or wrong.
        next_step: the command that would take it further (None when there is nothing to do).
    """

    name: str
    state: str
    path: str | None = None
    note: str = ""
    next_step: str | None = None


@dataclass
class RunContents:
    """Everything :func:`read_run` found (None / empty where a part is missing).

    Attributes:
        run_dir: the folder.
        stages: name → :class:`Stage`, in pipeline order.
        config: the run config (the gradient store's, or ``config.json``'s settings as
            ``{"collect": ...}`` before the store exists).
        gradients: :meth:`GradientStore.summary` of the run's gradient store.
        spectrum: :meth:`SpectrumStore.summary` of its spectrum store, with ``sigma`` and
            ``residuals`` (lists) once it is complete.
        decay: the decay report (``report.json``), or the analysis of σ alone
            (:func:`~gradspec.spectrum.sigma_analysis`) when there is none (``decay_source``).
        decay_source: ``"report"``, ``"sigma"`` or None.
        metrics: the run's ``metrics.jsonl``.
        retrain: the retraining runs (:class:`gradspec.optim.RetrainResult`), each with the
            folder it lies in.
        files: the folder's entries: ``name``, ``what``, ``bytes`` (None: not measured).
        problems: parts that could not be read, one line each.
    """

    run_dir: Path
    stages: dict[str, Stage] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    gradients: dict[str, Any] | None = None
    spectrum: dict[str, Any] | None = None
    decay: dict[str, Any] | None = None
    decay_source: str | None = None
    metrics: RunMetrics | None = None
    retrain: list[Any] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _q(path: Path | str) -> str:
    return shlex.quote(str(path))


def _first_line(exc: BaseException) -> str:
    text = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _stores(run_dir: Path, contents: RunContents) -> tuple[list[GradientStore], list[SpectrumStore]]:
    """The gradient and spectrum stores directly in ``run_dir`` (gradients.zarr, spectrum.zarr first)."""
    grads, specs = [], []
    preferred = {"gradients.zarr": 0, "spectrum.zarr": 0}
    for child in sorted(run_dir.iterdir(), key=lambda c: (preferred.get(c.name, 1), c.name)):
        if not child.is_dir() or not (child.name.endswith(".zarr") or (child / "zarr.json").is_file()):
            continue
        try:
            store = open_store(child)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            contents.problems.append(f"{child.name}: {_first_line(exc)}")
            continue
        (grads if isinstance(store, GradientStore) else specs).append(store)
    return grads, specs


def _collect_stage(run_dir: Path, grads: list[GradientStore], contents: RunContents) -> None:
    collect_cmd = f"gradspec collect --out {_q(run_dir)} ..."
    if not grads:
        state, note, step = ABSENT, "no gradient store", collect_cmd
        if (run_dir / RESULT).is_file():  # `gradspec retrain --out`: training only, by design
            note, step = "a retraining run's folder: it records no gradients", None
            if (run_dir / CONFIG).is_file():
                _config_only(run_dir, contents)
        elif (run_dir / CONFIG).is_file():
            state, note = _config_only(run_dir, contents)
            step = None if state == RUNNING else collect_cmd
        contents.stages["collect"] = Stage("collect", state, None, note, step)
        return
    store = grads[0]
    if len(grads) > 1:
        contents.problems.append(
            f"{len(grads)} gradient stores here; this page shows {Path(store.path).name} "
            f"(also: {', '.join(Path(g.path).name for g in grads[1:])})")
    summary = store.summary()
    contents.gradients, contents.config = summary, dict(store.config)
    r, p = summary["shape"]
    name = Path(store.path).name
    if summary["status"] == "damaged":
        stage = Stage("collect", DAMAGED, store.path, f"{name} is damaged ({r} rows committed)",
                      f"gradspec info {_q(store.path)} --verify")
    elif store.status == "complete":
        stage = Stage("collect", COMPLETE, store.path, f"{name}: {r:,} rows x {p:,} columns")
    else:
        steps = (contents.config or {}).get("steps")
        of = f" of {steps} steps" if steps else ""
        stage = Stage("collect", RUNNING, store.path,
                      f"{name} is not finished: {r:,} rows committed{of} (still running, or stopped)",
                      f"gradspec collect --out {_q(run_dir)} --resume")
    contents.stages["collect"] = stage


def _config_only(run_dir: Path, contents: RunContents) -> tuple[str, str]:
    """A run whose config.json is written but whose store is not (yet), or a training-only run."""
    from gradspec.train import read_run_config

    try:
        config = read_run_config(run_dir)
    except (OSError, ValueError) as exc:
        contents.problems.append(f"{CONFIG}: {_first_line(exc)}")
        return UNREADABLE, f"{CONFIG} cannot be read"
    contents.config = {"collect": config.to_dict(), "task": config.task, "steps": config.steps}
    return RUNNING, f"{CONFIG} is written but no gradient store yet (starting, or a run that records no rows)"


def _pca_k(contents: RunContents) -> int:
    """The k the page suggests: 100, or fewer where the finished store has fewer rows or columns
    (pca refuses a k above min(r, p))."""
    g = contents.gradients or {}
    shape = g.get("shape") or [None, None]
    limits = [100, shape[1]] + ([shape[0]] if g.get("status") == "complete" else [_planned_rows(contents)])
    return int(min(n for n in limits if isinstance(n, int) and n > 0))


def _planned_rows(contents: RunContents) -> int | None:
    """The rows an unfinished per-step run will hold when it finishes (its steps, every
    ``--every``-th stored), else None (per-example rows: their number is not known ahead).
    Found by review: an unfinished 80-step run was offered `pca --k 100`, refused then and after."""
    cfg = contents.config or {}
    run = cfg.get("collect") or {}
    steps = cfg.get("steps") if cfg.get("steps") is not None else run.get("steps")
    if run.get("mode") not in (None, "batch") or not isinstance(steps, int):
        return None
    every = run.get("every") if isinstance(run.get("every"), int) and run.get("every") > 0 else 1
    return -(-steps // every)


def _spectrum_stage(run_dir: Path, specs: list[SpectrumStore], contents: RunContents,
                    store: GradientStore | None = None) -> SpectrumStore | None:
    source = contents.stages["collect"].path or str(run_dir / "gradients.zarr")
    pca_cmd = f"gradspec pca {_q(source)} --k {_pca_k(contents)} --out {_q(run_dir / 'spectrum.zarr')}"
    if not specs:
        collect = contents.stages["collect"]
        ready = collect.state == COMPLETE
        possible = collect.state != ABSENT or collect.next_step is not None  # not in a retraining run's folder
        contents.stages["pca"] = Stage(
            "pca", ABSENT, None, "no spectrum yet" + ("" if ready else " (it needs a finished collect)"),
            pca_cmd if possible else None)
        return None
    spec = specs[0]
    if len(specs) > 1:
        contents.problems.append(
            f"{len(specs)} spectrum stores here; this page shows {Path(spec.path).name} "
            f"(also: {', '.join(Path(s.path).name for s in specs[1:])})")
    summary = spec.summary()
    name = Path(spec.path).name
    if summary["status"] == "damaged":
        stage = Stage("pca", DAMAGED, spec.path, f"{name} is damaged", f"{pca_cmd} --overwrite")
    elif spec.status == "complete":
        try:
            summary["sigma"] = [float(s) for s in spec.sigma]
            summary["residuals"] = [float(s) for s in spec.array("residuals")]
        except StoreDamagedError as exc:
            contents.problems.append(f"{name}: {_first_line(exc)}")
            contents.spectrum = summary
            contents.stages["pca"] = Stage("pca", DAMAGED, spec.path, f"{name} is damaged", f"{pca_cmd} --overwrite")
            return None
        r, p = summary["shape"]
        stage = Stage("pca", COMPLETE, spec.path, f"{name}: top {spec.k} of H ({r:,} x {p:,}), {spec.method}")
        if store is not None:  # the folder's store still holds the spectrum's rows? (as decay asks)
            try:
                store_relation(spec, store)
            except (ValueError, StoreDamagedError) as exc:
                summary["rewritten"] = _first_line(exc)
    elif spec.status == "running" and not summary.get("writer"):
        done = summary.get("iterations_done")
        stage = Stage("pca", RUNNING, spec.path, f"{name} is being written"
                      + (f" (iteration {done} saved)" if done is not None else ""))
    else:
        why = spec.replaceable() or spec.status
        stage = Stage("pca", STOPPED, spec.path, f"{name} did not finish: {why}", f"{pca_cmd} --resume")
    contents.spectrum = summary
    contents.stages["pca"] = stage
    return spec if stage.state == COMPLETE else None


def _reports(run_dir: Path, contents: RunContents) -> list[tuple[Path, dict[str, Any]]]:
    """The decay reports in ``run_dir`` and its direct subfolders."""
    found = []
    candidates = [run_dir / REPORT, *sorted(run_dir.glob(f"*/{REPORT}"))]
    for path in candidates:
        if not path.is_file():
            continue
        try:
            found.append((path, read_report(path)))
        except (OSError, ValueError) as exc:
            contents.problems.append(f"{path.relative_to(run_dir)}: {_first_line(exc)}")
    return found


def _decay_stage(run_dir: Path, spec: SpectrumStore | None, contents: RunContents) -> None:
    spec_path = contents.stages["pca"].path or str(run_dir / "spectrum.zarr")
    decay_cmd = f"gradspec decay {_q(spec_path)} --out {_q(run_dir / 'decay')}"
    reports = _reports(run_dir, contents)
    # the report of this folder's spectrum first (sort is stable: else the folder order)
    reports.sort(key=lambda pr: not _same_sigma(pr[1], contents.spectrum))
    if reports:
        path, report = reports[0]
        contents.decay, contents.decay_source = report, "report"
        rel = str(path.relative_to(run_dir))
        if spec is not None and not _same_sigma(report, contents.spectrum):
            contents.stages["decay"] = Stage(
                "decay", STALE, str(path), f"{rel} is of another spectrum than {Path(spec.path).name} "
                "(its σ differ): it predates the last pca", f"{decay_cmd} --overwrite")
        else:
            contents.stages["decay"] = Stage("decay", COMPLETE, str(path), rel)
        return
    note = "no decay analysis yet"
    if spec is not None:
        try:
            contents.decay, contents.decay_source = sigma_analysis(spec).to_dict(), "sigma"
            note += " (the σ fits below are of the spectrum alone: no G_k, no bounds)"
        except ValueError as exc:
            contents.problems.append(f"fits of {Path(spec.path).name}: {_first_line(exc)}")
    pca = contents.stages["pca"]
    possible = pca.state != ABSENT or pca.next_step is not None
    contents.stages["decay"] = Stage("decay", ABSENT, None, note, decay_cmd if possible else None)


def _same_sigma(report: dict[str, Any], spectrum: dict[str, Any] | None) -> bool:
    """Whether the report's σ are the spectrum store's (its first k of them)."""
    mine = (spectrum or {}).get("sigma")
    theirs = (report.get("spectrum") or {}).get("sigma")
    if mine is None or not isinstance(theirs, list):
        return True  # nothing to compare against
    return len(theirs) <= len(mine) and np.array_equal(np.asarray(theirs, dtype=np.float64),
                                                       np.asarray(mine[: len(theirs)], dtype=np.float64))


def _retrain_command(run_dir: Path, contents: RunContents, specs: list[SpectrumStore]) -> str | None:
    """The sweep the page suggests: ranks up to the spectrum's k; a sketched spectrum's directions
    (in sketch space, refused by --projector) replayed into parameter space first, unless the
    folder holds a finished replay already (then that is the projector), or, for per-example
    sketched rows (not replayable), no command."""
    spec = contents.stages["pca"].path or str(run_dir / "spectrum.zarr")
    k = (contents.spectrum or {}).get("k") or _pca_k(contents)
    g = contents.gradients or {}
    replay = ""
    if g.get("sketch") and (contents.spectrum or {}).get("method") != "replay":
        if g.get("per_example"):
            return None
        done = [s for s in specs if s.method == "replay" and s.status == "complete"]
        if done:
            spec, k = str(done[0].path), int(done[0].k)
        else:
            directions = run_dir / "directions.zarr"
            replay = (f"gradspec replay {_q(contents.stages['collect'].path)} --spectrum {_q(spec)} "
                      f"--out {_q(directions)} && ")
            spec = str(directions)
    ranks = ",".join(str(n) for n in sorted({min(10, k), min(100, k)}))
    task = _task_flags(contents)
    if task is None:
        return None
    return (f"{replay}gradspec retrain --sweep -a subspace -a dp-sgd --projector {_q(spec)} --ranks {ranks}{task} "
            f"--out {_q(run_dir / 'sweep')}")


def _task_flags(contents: RunContents) -> str | None:
    """The run's task, its options and parameter selection as retrain flags ('' when unknown:
    retrain's defaults), so that the suggested sweep trains the parameters the spectrum is of
    (retrain's own default task is text); None for a task built in Python (no flag names it)."""
    run = (contents.config or {}).get("collect") or {}
    task = run.get("task")
    if not isinstance(task, str):
        return ""
    if task.startswith("custom:"):
        return None
    out = f" --task {_q(task)}"
    for key, value in (run.get("task_options") or {}).items():
        out += f" -t {_q(f'{key}={value}')}"
    params = run.get("params")
    for pattern in [params] if isinstance(params, str) else (params or []):
        out += f" --params {_q(pattern)}"
    # the data (and a random head) the spectrum's run drew: its task seed, else its seed (found by
    # review: a run collected with --seed 3 got a sweep on seed 0's data, exit 0)
    task_seed = run.get("task_seed") if run.get("task_seed") is not None else run.get("seed")
    if isinstance(task_seed, int) and not isinstance(task_seed, bool):
        out += f" --task-seed {task_seed}"
    return out


def _retrain_stage(run_dir: Path, contents: RunContents, specs: list[SpectrumStore]) -> None:
    cmd = _retrain_command(run_dir, contents, specs)
    results = [run_dir / RESULT, *sorted(run_dir.glob(f"*/{RESULT}")), *sorted(run_dir.glob(f"*/*/{RESULT}"))]
    results = [p for p in results if p.is_file()]
    if not results:
        contents.stages["retrain"] = Stage("retrain", ABSENT, None, "no retraining runs (optional)", cmd)
        return
    from gradspec.optim import read_result

    for path in results:
        try:
            contents.retrain.append(read_result(path.parent))
        except ValueError as exc:
            contents.problems.append(f"{path.relative_to(run_dir)}: {_first_line(exc)}")
    folders = sorted({str(p.parent.parent.relative_to(run_dir)) if p.parent != run_dir else "."
                      for p in results})
    n = len(contents.retrain)
    contents.stages["retrain"] = Stage(
        "retrain", COMPLETE if n else UNREADABLE, str(run_dir / folders[0]),
        f"{n} retraining run{'s' * (n != 1)} in {', '.join(folders)}")


def _metrics(run_dir: Path, contents: RunContents) -> None:
    path = run_dir / METRICS
    if not path.is_file():
        return
    live = contents.stages["collect"].state != COMPLETE
    try:
        contents.metrics = read_metrics(path, in_progress=live)
    except (OSError, ValueError) as exc:
        contents.problems.append(f"{METRICS}: {_first_line(exc)}")


_WHAT = {
    "gradients.zarr": "gradient store (collect)", "spectrum.zarr": "spectrum store (pca)",
    METRICS: "training log (collect)", CONFIG: "run settings (collect)",
    "checkpoint.pt": "checkpoint (collect --resume)", "run.json": "run settings (training only)",
    RESULT: "retraining result", ".gradspec.lock": "writer lock",
    ".gradspec-written.json": "what gradspec wrote here, with checksums",
    "report.html": "this page (report)",
}


def _files(run_dir: Path, contents: RunContents) -> None:
    sizes, known = {}, dict(_WHAT)
    for part, what in ((contents.gradients, "gradient store (collect)"), (contents.spectrum, "spectrum store (pca)")):
        if part:
            sizes[Path(part["path"]).name] = part.get("size_on_disk")
            known[Path(part["path"]).name] = what
    for stage, what in (("decay", "decay report and figures (decay)"), ("retrain", "retraining runs (retrain)")):
        path = contents.stages[stage].path
        folder = None if not path else Path(path).parent if stage == "decay" else Path(path)
        if folder is not None and folder != run_dir and folder.parent == run_dir:  # a folder of the run's
            known[folder.name] = what
    for child in sorted(run_dir.iterdir(), key=lambda c: c.name):
        what = known.get(child.name, "")
        if not what and child.name.startswith(".") and child.name.endswith(".lock"):
            what = f"writer lock of {child.name[1:-5]}"
        elif child.is_dir() and not what:
            kinds = {f.suffix for f in child.iterdir() if f.is_file() and not f.name.startswith(".")}
            what = "figures" if kinds and kinds <= {".png", ".pdf", ".svg"} else "folder"
        if child.is_symlink():
            size, what = None, f"link{(': ' + what) if what else ''}"
        elif child.name in sizes:
            size = sizes[child.name]
        elif child.is_file():
            size = child.stat().st_size
        else:
            size = sum(f.stat().st_size for f in child.rglob("*") if f.is_file() and not f.is_symlink())
        contents.files.append({"name": child.name + ("/" if child.is_dir() else ""), "what": what, "bytes": size})


def read_run(run_dir: str | Path) -> RunContents:
    """Read every part of a run folder that is there (see the module note).

    Args:
        run_dir: the folder `gradspec collect --out` wrote (or one holding a spectrum store,
            a decay report or retraining runs).

    Returns:
        :class:`RunContents`.

    Raises:
        ValueError: ``run_dir`` is not a folder, or holds no part of a gradspec run (one line).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "does not exist" if not run_dir.exists() else "is not a folder"
        raise ValueError(f"{str(run_dir)!r} {what}; pass the folder of a run (`gradspec collect --out`)")
    contents = RunContents(run_dir)
    grads, specs = _stores(run_dir, contents)
    _collect_stage(run_dir, grads, contents)
    spec = _spectrum_stage(run_dir, specs, contents, grads[0] if grads else None)
    _decay_stage(run_dir, spec, contents)
    _retrain_stage(run_dir, contents, specs)
    _metrics(run_dir, contents)
    found = [s for s in contents.stages.values() if s.state != ABSENT]
    if not found and contents.metrics is None and not contents.problems:
        raise ValueError(
            f"{str(run_dir)!r} holds no part of a gradspec run (no gradient or spectrum store, "
            f"{CONFIG}, {METRICS}, decay {REPORT} or {RESULT}); pass the folder of a run "
            "(`gradspec collect --out`)")
    _files(run_dir, contents)
    return contents
