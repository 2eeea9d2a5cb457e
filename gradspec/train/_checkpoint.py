"""A run directory on disk: what it holds, checkpoints written atomically and validated when loaded.

A run directory holds exactly the entries of :data:`RUN_ENTRIES` (and the lock
file of :class:`gradspec.store.RunLock`); it is recognised by its ``config.json``,
which parses as a :class:`~gradspec.train.TrainConfig`. Other files may sit
next to them (``gradspec pca`` output, figures): ``overwrite`` removes only the
run's own entries, and never touches a directory that is not a run directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch

from gradspec.train._config import TrainConfig, resume_conflicts

CHECKPOINT_FORMAT = 1

STORE_NAME = "gradients.zarr"
METRICS_NAME = "metrics.jsonl"
CONFIG_NAME = "config.json"
CHECKPOINT_NAME = "checkpoint.pt"
RUN_NAME = "run.json"  # the run's config when it writes no store (training only)

#: What a run writes into its directory; ``overwrite`` removes exactly these.
RUN_ENTRIES = (
    CONFIG_NAME, CONFIG_NAME + ".partial", STORE_NAME, METRICS_NAME, CHECKPOINT_NAME,
    CHECKPOINT_NAME + ".partial", RUN_NAME, RUN_NAME + ".partial",
    "retrain.json",  # gradspec.optim.retrain's result: stale once the run is replaced
)


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    torch.save({"format": CHECKPOINT_FORMAT, **state}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`; check its format and keys."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {str(path)!r}: the run stopped before its first checkpoint and "
            "cannot be resumed; start it anew with --overwrite"
        )
    try:
        # weights_only: a checkpoint is tensors, state dicts and plain values; torch's restricted
        # unpickler refuses anything else, so a shared run folder can never run code here.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"{str(path)!r} holds objects other than tensors and plain values, which gradspec "
            "refuses to load (unpickling them could run code); it was not written by this "
            "gradspec: start the run anew with --overwrite"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"{str(path)!r} cannot be read ({type(exc).__name__}); it is damaged — "
                         "start the run anew with --overwrite") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not a gradspec checkpoint of format {CHECKPOINT_FORMAT}")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} lacks {missing}; it is damaged — start the run anew")
    return state


def layout_difference(saved: list[dict], now: list[dict]) -> str:
    """'' if two parameter layouts agree in names and shapes, else the first difference in words."""
    a = [(d["name"], tuple(d["shape"])) for d in saved]
    b = [(d["name"], tuple(d["shape"])) for d in now]
    if a == b:
        return ""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"parameter {i}: saved {x[0]} {x[1]}, now {y[0]} {y[1]}"
    return f"saved {len(a)} parameters, now {len(b)}"


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a temporary file (never a torn file)."""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------ run directories
def read_run_config(out: str | os.PathLike) -> TrainConfig:
    """The saved settings of the run in ``out``.

    Raises:
        FileNotFoundError: ``out`` holds no run (no ``config.json``).
        ValueError: its ``config.json`` is not a gradspec run config.
    """
    path = Path(out) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no run to resume in {str(out)!r} (no {CONFIG_NAME}); drop --resume")
    try:
        return TrainConfig.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"{str(path)!r} is not the config of a gradspec run ({str(exc).splitlines()[0][:120]}); "
            f"{str(out)!r} is not a run directory gradspec can resume"
        ) from None


def is_run_dir(out: str | os.PathLike) -> bool:
    """Whether ``out`` holds a gradspec run (a ``config.json`` that parses as one)."""
    try:
        read_run_config(out)
    except (OSError, ValueError):
        return False
    return True


def _entries(out: Path) -> list[str]:
    from gradspec.store import LOCK_NAME

    return sorted(e.name for e in out.iterdir() if e.name != LOCK_NAME)


def check_new_run(out: str | os.PathLike, *, overwrite: bool) -> bool:
    """Check that a new run may start in ``out``; return whether an old run must be removed first.

    ``out`` may be missing, empty, or a run directory (with ``overwrite``). Any
    other non-empty directory is refused, ``overwrite`` or not: its files are not
    gradspec's to replace.

    Raises:
        FileExistsError: ``out`` holds a run and ``overwrite`` is False; or ``out``
            is a file, or a non-empty directory that is not a run directory.
    """
    out = Path(out)
    if not out.exists():
        return False
    if not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} is a file, not a directory: choose a directory")
    entries = _entries(out)
    if not entries:
        return False
    if is_run_dir(out):
        if not overwrite:
            raise FileExistsError(
                f"{str(out)!r} already holds a run: pass --resume to continue it or --overwrite to replace it"
            )
        return True
    shown = ", ".join(entries[:4]) + (f", ... ({len(entries)} entries)" if len(entries) > 4 else "")
    raise FileExistsError(
        f"{str(out)!r} is not empty and is not a gradspec run directory (it holds {shown}): "
        "give a new or empty directory as --out"
        + ("; --overwrite replaces only a gradspec run, never other files" if overwrite else "")
    )


def clear_run(out: str | os.PathLike) -> list[str]:
    """Remove the run's own entries from the run directory ``out``; return their names.

    Only :data:`RUN_ENTRIES` are removed, and only from a directory that
    :func:`is_run_dir` recognises; everything else in ``out`` stays.
    """
    out = Path(out)
    if not is_run_dir(out):
        raise ValueError(f"{str(out)!r} is not a gradspec run directory: nothing in it is removed")
    removed = []
    # config.json last: a run killed while clearing is still recognised and can be cleared again.
    for name in sorted(RUN_ENTRIES, key=lambda n: n == CONFIG_NAME):
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def saved_run_config(out: Path) -> dict[str, Any]:
    """The run config a run wrote (the store's attributes, or run.json of a training-only run)."""
    from gradspec.store import GradientStore

    with contextlib.suppress(OSError, ValueError, KeyError):
        return GradientStore.open(out / STORE_NAME).config
    with contextlib.suppress(OSError, ValueError):
        return json.loads((out / RUN_NAME).read_text())
    return {}


def open_resumable(out: Path, state: dict[str, Any], saved: TrainConfig, layout: list[dict], *,
                   write_store: bool, run_config: dict[str, Any]):
    """Check that the run directory ``out`` agrees with its checkpoint ``state``; open its store.

    Nothing is changed. Returns the store opened for appending (None without ``write_store``).

    Raises:
        FileNotFoundError: the store is missing.
        ValueError: the store, the checkpoint, ``config.json`` or ``metrics.jsonl``
            disagree (a damaged directory, or files of two runs), naming what.
    """
    from gradspec.store import GradientStore

    store = None
    if write_store:
        if not (out / STORE_NAME).exists():
            raise FileNotFoundError(
                f"the run in {str(out)!r} has no {STORE_NAME} (it was deleted, or the run only trained): "
                "it cannot be resumed with a store; start it anew with --overwrite"
            )
        store = GradientStore.open(out / STORE_NAME, mode="r+")
        diff = layout_difference(store.layout.to_list(), layout)
        if diff:
            raise ValueError(f"the store's parameter layout differs from this model's ({diff}): "
                             "resume with the same task and --params")
        if store.n_rows < state["rows"]:
            raise ValueError(f"the store has {store.n_rows} committed rows but the checkpoint expects "
                             f"{state['rows']}; it is damaged — start the run anew with --overwrite")
    ids = (run_config.get("run_id"), state.get("run_id"))
    if None not in ids and ids[0] != ids[1]:
        raise ValueError(f"the checkpoint in {str(out)!r} comes from another run than its store (or run.json); "
                         "the directory is damaged — start the run anew with --overwrite")
    stored = run_config.get("collect")
    # (sigma and the target may differ for a moment: a resume converts a calibrated run to a fixed sigma)
    if isinstance(stored, dict) and resume_conflicts(saved, {
        k: v for k, v in stored.items() if k in saved.to_dict() and k not in ("noise_multiplier", "target_epsilon")
    }):
        raise ValueError(f"the settings the run recorded and its {CONFIG_NAME} in {str(out)!r} differ (edited, "
                         "or files of two runs) — start the run anew with --overwrite")
    metrics = out / METRICS_NAME
    if not metrics.is_file() or metrics.stat().st_size < int(state["metrics_offset"]):
        raise ValueError(f"{str(metrics)!r} is missing or shorter than the checkpoint expects; the run is "
                         "damaged — start it anew with --overwrite")
    return store
