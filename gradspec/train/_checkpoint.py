"""A run directory on disk: what it holds, checkpoints written atomically and validated when loaded.

A run directory holds exactly the entries of :data:`RUN_ENTRIES` (and the lock
file of :class:`gradspec.store.RunLock`); it is recognised by its ``config.json``,
which parses as a :class:`~gradspec.train.TrainConfig`. Other files may sit
next to them (``gradspec pca`` output, figures): ``overwrite`` removes only the
run's own entries, and never touches a directory that is not a run directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import types
import typing
from pathlib import Path
from typing import Any

import torch

from gradspec._files import read_regular, unlink_planted
from gradspec.train._checkpoint_schema import check_state, unsafe_value
from gradspec.train._config import TrainConfig

logger = logging.getLogger(__name__)

#: 3: format 2 plus ``digest``, the SHA-256 of every value it holds (:func:`state_digest`),
#: checked at load: torch checks no checksum of a checkpoint's tensors, so a flipped bit
#: loaded and was trained on. 2: loadable with ``torch.load(weights_only=True)`` (tensors,
#: containers and plain values only, checked at save and at load); still resumed, with a
#: warning that its bytes cannot be verified. Format 1 checkpoints were unpickled without
#: restriction; they are refused, not converted (no released gradspec wrote them).
CHECKPOINT_FORMAT = 3
#: The oldest format a resume accepts (without a digest to check).
_UNVERIFIED_FORMAT = 2

STORE_NAME = "gradients.zarr"
METRICS_NAME = "metrics.jsonl"
CONFIG_NAME = "config.json"
CHECKPOINT_NAME = "checkpoint.pt"
RUN_NAME = "run.json"  # the run's config when it writes no store (training only)
#: The most bytes a run.json may hold (settings and a caller's run_info: kilobytes).
RUN_CONFIG_MAX_BYTES = 64 << 20

#: What a run writes into its directory; ``overwrite`` removes exactly these.
RUN_ENTRIES = (
    CONFIG_NAME, CONFIG_NAME + ".partial", STORE_NAME, METRICS_NAME, CHECKPOINT_NAME,
    CHECKPOINT_NAME + ".partial", RUN_NAME, RUN_NAME + ".partial",
    "retrain.json",  # gradspec.optim.retrain's result: stale once the run is replaced
)


def state_digest(state: Any) -> str:
    """SHA-256 of a checkpoint's values (hex): every tensor's dtype, shape and bytes, every plain
    value's type and exact ``repr``, every container's kind, length and order (keys included).

    It is of what ``torch.load`` returns, not of the file: the values a resume trains on are
    the ones checked, whatever torch's container format does with them. A tensor is hashed as
    its storage's bytes and its view of them (shape, strides, offset), in place: no copy, and
    a view declaring a huge shape over a small storage is never materialised.
    """
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        kind = type(value)
        if isinstance(value, torch.Tensor):
            t = value.detach()
            t = t.cpu() if t.device.type != "cpu" else t
            # the storage as saved, and the view of it: a declared shape is never materialised
            storage = t.untyped_storage()
            digest.update(f"T{t.dtype}{tuple(t.shape)}{t.stride()}{t.storage_offset()}/{storage.nbytes()};".encode())
            if storage.nbytes():
                digest.update(torch.empty(0, dtype=torch.uint8).set_(storage).numpy())
        elif isinstance(value, dict):
            digest.update(f"D{len(value)};".encode())
            for key, item in value.items():
                feed(key)
                feed(item)
        elif isinstance(value, (list, tuple)):
            digest.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)};".encode())
            for item in value:
                feed(item)
        else:  # str, int, float, bool, None (unsafe_value allows nothing else)
            text = repr(value)
            digest.update(f"{kind.__name__}{len(text)}:{text};".encode())

    feed(state)
    return digest.hexdigest()


def _stamped(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the current format and its digest (over everything but ``digest``)."""
    body = {"format": CHECKPOINT_FORMAT, **{k: v for k, v in state.items() if k not in ("format", "digest")}}
    return {**body, "digest": state_digest(body)}


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` through a temporary file and an atomic rename.

    Raises:
        TypeError: ``state`` holds a value that ``torch.load(weights_only=True)`` would
            refuse (anything but tensors, dicts, lists, tuples, str, int, float, bool,
            None); the message names the entry, so the ``state_dict`` that made it can
            be fixed. Nothing is written.
    """
    path = Path(path)
    bad = unsafe_value(state)
    if bad:
        raise TypeError(f"checkpoint {bad}: a checkpoint holds only tensors, dicts, lists, tuples, str, "
                        "int, float, bool and None (so that it loads without unpickling objects); "
                        "store it as one of these in the state_dict that returns it")
    tmp = path.with_name(path.name + ".partial")
    unlink_planted(tmp)
    torch.save(_stamped(state), tmp)
    os.replace(tmp, path)


def _refused_global(exc: BaseException) -> str:
    """The object torch's restricted unpickler refused, as it names it (or '')."""
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    return f" ({found.group(1)})" if found else ""


def load_checkpoint(path: str | os.PathLike, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`; check its format, keys and values.

    The file is read with ``torch.load(weights_only=True)``: nothing in it can run code.

    Raises:
        FileNotFoundError: there is no checkpoint at ``path``.
        ValueError: the file holds pickled objects (refused, never unpickled), is
            damaged, of another format, lacks one of ``required``, or holds a value of
            the wrong type or shape; or it is a link to a file outside its run directory.
            One line that says what to do.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"{str(path)!r} is not a regular file (a folder, a FIFO or a device), not a "
                         "checkpoint: the run folder is damaged — start the run anew with --overwrite")
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {str(path)!r}: the run stopped before its first checkpoint and "
            "cannot be resumed; start it anew with --overwrite"
        )
    check_own_entry(path.parent, path.name)
    try:
        # weights_only: a checkpoint is tensors, state dicts and plain values; torch's restricted
        # unpickler refuses anything else, so a shared run folder can never run code here.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(
            f"{str(path)!r} holds pickled objects{_refused_global(exc)} other than tensors and plain values, "
            "which gradspec refuses to load (unpickling them could run code); it is not a checkpoint of "
            f"this gradspec (format {CHECKPOINT_FORMAT}): start the run anew with --overwrite"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"{str(path)!r} cannot be read ({type(exc).__name__}); it is damaged — "
                         "start the run anew with --overwrite") from None
    fmt = state.get("format") if isinstance(state, dict) else None
    if fmt not in (CHECKPOINT_FORMAT, _UNVERIFIED_FORMAT) or type(fmt) is not int:
        if type(fmt) is int and 0 < fmt < _UNVERIFIED_FORMAT:
            raise ValueError(
                f"{str(path)!r} is a checkpoint of format {fmt}, written by an older gradspec that pickled "
                f"its objects; this gradspec resumes formats {_UNVERIFIED_FORMAT}–{CHECKPOINT_FORMAT} only (no pickled "
                "objects): "
                "start the run anew with --overwrite, or finish it with the gradspec that started it"
            )
        if type(fmt) is int and fmt > CHECKPOINT_FORMAT:
            raise ValueError(f"{str(path)!r} is a checkpoint of format {fmt}, written by a newer gradspec; "
                             "upgrade gradspec to resume it")
        raise ValueError(f"{str(path)!r} is not a gradspec checkpoint (format {CHECKPOINT_FORMAT}); "
                         "start the run anew with --overwrite")
    if fmt == _UNVERIFIED_FORMAT and "digest" in state:
        # format 2 never carried a digest: one here is a format-3 checkpoint whose format was
        # changed, which would switch its check off (found by review: two flipped bits resumed
        # from a damaged weight)
        raise ValueError(f"{str(path)!r} is damaged: it says format {fmt} but carries a digest (format "
                         f"{CHECKPOINT_FORMAT}); start the run anew with --overwrite")
    if fmt == _UNVERIFIED_FORMAT:
        logger.warning("%s is a checkpoint of format %d, written before checkpoints carried a digest: its "
                       "values cannot be verified (a damaged file would be resumed from)", path, fmt)
    else:
        saved = state.pop("digest", None)
        if not isinstance(saved, str) or saved != state_digest(state):
            raise ValueError(f"{str(path)!r} is damaged: its values do not match the digest saved with them "
                             "(a changed byte); resume from nothing else — start the run anew with --overwrite")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} lacks {missing}; it is damaged — start the run anew")
    try:
        check_state(state)
    except ValueError as exc:
        raise ValueError(f"checkpoint {str(path)!r} is damaged: {exc}; start the run anew with "
                         "--overwrite") from None
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


# ------------------------------------------------------------------ run directories
def check_own_entry(out: str | os.PathLike, name: str) -> None:
    """Refuse a run entry that is a link to something outside its run directory ``out``.

    A run folder from someone else could otherwise make a resume read, truncate or
    append to a file anywhere (``metrics.jsonl -> ~/.bashrc``).

    Raises:
        ValueError: ``out/name`` is a symbolic link whose target is not inside ``out``.
    """
    entry = Path(out) / name
    if not entry.is_symlink():
        return
    target, root = entry.resolve(), Path(out).resolve()
    if target != root and root not in target.parents:
        raise ValueError(
            f"{str(entry)!r} is a link to {str(target)!r}, outside the run directory: a run's files must be "
            "its own (gradspec writes to them on --resume); replace the link by a copy of what it points to"
        )


def check_run_entries(out: str | os.PathLike) -> None:
    """:func:`check_own_entry` for every entry a run writes (:data:`RUN_ENTRIES` and its lock)."""
    from gradspec.store import LOCK_NAME

    for name in (*RUN_ENTRIES, LOCK_NAME):
        check_own_entry(out, name)


def _hint_accepts(hint: Any, value: Any) -> bool:
    """Whether the JSON ``value`` has the type a TrainConfig field annotated ``hint`` holds."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_hint_accepts(a, value) for a in args)
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is bool:
        return type(value) is bool
    if hint is int:
        return type(value) is int
    if hint is float:
        return type(value) in (int, float)
    if isinstance(hint, type) and issubclass(hint, str):  # str and the StrEnum choices
        return isinstance(value, str)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    if origin is tuple:  # tuple[str, ...], saved as a JSON list
        return isinstance(value, list) and all(_hint_accepts(args[0], v) for v in value)
    return False


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _parse_run_config(path: Path) -> TrainConfig:
    """``path`` (a config.json) as a TrainConfig, every field of the JSON type its annotation says."""
    from gradspec._files import NotRegularFile, read_regular

    try:  # a regular file only: a FIFO here hung collect (found by review)
        data = json.loads(read_regular(path, max_bytes=16 << 20).decode())
    except NotRegularFile as exc:
        raise ValueError(f"it is {exc}") from None
    except RecursionError:
        raise ValueError("it nests too deeply to be a run config") from None
    except (ValueError, OSError) as exc:
        raise ValueError(f"it is not JSON: {str(exc).splitlines()[0][:120]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"it holds {_json_kind(data)}, not an object of settings")
    hints = typing.get_type_hints(TrainConfig)
    for name, value in data.items():
        if name in hints and not _hint_accepts(hints[name], value):
            raise ValueError(f"setting {name!r} is {_json_kind(value)} ({str(value)[:40]!r}), not of type "
                             f"{str(hints[name]).replace('typing.', '')}")
    return TrainConfig.from_dict(data)


def read_run_config(out: str | os.PathLike) -> TrainConfig:
    """The saved settings of the run in ``out``.

    Raises:
        FileNotFoundError: ``out`` holds no run (no ``config.json``).
        ValueError: its ``config.json`` is not a gradspec run config (not JSON, not an
            object, a setting of the wrong type or value), or an entry of the run is a
            link out of ``out`` (:func:`check_run_entries`).
    """
    path = Path(out) / CONFIG_NAME
    if not path.is_file() and not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"no run to resume in {str(out)!r} (no {CONFIG_NAME}); drop --resume")
    check_run_entries(out)
    try:
        return _parse_run_config(path)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"{str(path)!r} is not the config of a gradspec run ({str(exc).splitlines()[0][:160]}); "
            f"{str(out)!r} is not a run directory gradspec can resume"
        ) from None


def is_run_dir(out: str | os.PathLike) -> bool:
    """Whether ``out`` holds a gradspec run (a ``config.json`` that parses as one)."""
    path = Path(out) / CONFIG_NAME
    try:
        _parse_run_config(path)
    except (OSError, ValueError, TypeError):
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
        ValueError: its lock file is a link out of ``out`` (:func:`check_own_entry`).
    """
    from gradspec.store import LOCK_NAME

    out = Path(out)
    if not out.exists():
        return False
    if not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} is a file, not a directory: choose a directory")
    check_own_entry(out, LOCK_NAME)  # the lock is written before anything is cleared
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


#: What a resume reads from the run config a run wrote, and the JSON types each may have.
_RUN_CONFIG_KINDS: dict[str, tuple[type, ...]] = {
    "run_id": (str, type(None)), "steps": (int, type(None)), "noise_multiplier": (int, float, type(None)),
    "collect": (dict, type(None)), "resumes": (list,), "run_info": (dict, type(None)),
}


def read_run_info(out: str | os.PathLike) -> dict[str, Any]:
    """What a caller recorded about the run in ``out`` (``train(run_info=...)``), {} if nothing.

    Raises:
        ValueError: the run config is damaged (see :func:`saved_run_config`).
    """
    return saved_run_config(Path(out)).get("run_info") or {}


def saved_run_config(out: Path) -> dict[str, Any]:
    """The run config a run wrote (the store's attributes, or run.json of a training-only run).

    Raises:
        ValueError: run.json exists but is not a JSON object, or an entry a resume reads
            (``run_id``, ``steps``, ``noise_multiplier``, ``collect``, ``resumes``, ``run_info``) has
            the wrong type.
    """
    from gradspec.store import GradientStore

    saved: Any = None
    source = out / STORE_NAME
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        saved = GradientStore.open(source).config
    if saved is None:
        source = out / RUN_NAME
        if not source.exists():
            return {}
        try:  # without blocking (a FIFO there hung the resume forever), a regular file only
            saved = json.loads(read_regular(source, max_bytes=RUN_CONFIG_MAX_BYTES))
        except RecursionError:
            saved = "deeply nested lists"
        except (OSError, ValueError) as exc:
            raise ValueError(f"{str(source)!r} cannot be read as JSON ({str(exc).splitlines()[0][:80]}); the "
                             "run is damaged — start it anew with --overwrite") from None
    damaged = f"the run config in {str(source)!r} is damaged — start the run anew with --overwrite"
    if not isinstance(saved, dict):
        raise ValueError(f"{damaged} (it holds {_json_kind(saved)}, not the run's settings)")
    for key, kinds in _RUN_CONFIG_KINDS.items():
        value = saved.get(key)
        if key in saved and (not isinstance(value, kinds) or isinstance(value, bool)):
            raise ValueError(f"{damaged} (its {key!r} is {_json_kind(value)})")
    return saved


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
    metrics = out / METRICS_NAME
    if not metrics.is_file() or metrics.stat().st_size < int(state["metrics_offset"]):
        raise ValueError(f"{str(metrics)!r} is missing or shorter than the checkpoint expects; the run is "
                         "damaged — start it anew with --overwrite")
    return store
