"""Files a command writes into a user's ``--out`` directory: never over a file gradspec did not write.

`decay` and `plot` write fixed names (``report.json``, ``spectrum.png``, ...) into a
directory that may hold anything. Each records what it wrote, with a SHA-256 of the bytes,
in ``--out/.gradspec-written.json``; a later run may replace a file only if that record
says gradspec wrote it and its bytes are still the ones written (so rerunning into the same
directory works, and a file a user put there or edited since is theirs). Any other file
of a name the command would write is refused, with one line, unless ``--overwrite``. A
link is refused even then: writing through it would change a file elsewhere.

This is the rule `collect`, `pca` and `retrain` follow for their run directories and stores
(they refuse a directory holding anything that is not theirs), narrowed to file names:
`decay` and `plot` share a directory with whatever else is in it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

RECORD_NAME = ".gradspec-written.json"
_FORMAT = 1


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record(out: Path) -> dict[str, str]:
    """name -> sha256 of the files gradspec wrote in ``out`` (empty if none, or unreadable)."""
    path = out / RECORD_NAME
    if not path.is_file():  # a regular file only: a FIFO here hung plot and report (found by review)
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("format") == _FORMAT else None
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)}


def check_outputs(out: Path, names: Iterable[str], *, overwrite: bool) -> None:
    """Refuse (before any work) to write ``names`` into ``out`` over files gradspec did not write.

    Raises:
        FileExistsError: ``out`` is a file; or a name is a link or a directory; or (without
            ``overwrite``) a name exists and is not a file gradspec wrote there, unchanged.
        ValueError: ``out`` is, or lies inside, a Zarr store.
    """
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {str(out)!r} is a file, not a directory: choose a directory")
    _refuse_inside_a_store(out)
    if not out.exists():
        return
    record = _record(out)
    links, foreign = [], []
    for name in names:
        path = out / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            links.append(name)
        elif path.exists() and (name not in record or record[name] != _digest(path)):
            foreign.append(name)
    if links:
        raise FileExistsError(
            f"--out {str(out)!r} holds {', '.join(links)} as a link or directory, where a file would "
            "be written: remove it or choose another --out"
        )
    if foreign and not overwrite:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise FileExistsError(
            f"--out {str(out)!r} already holds {shown}, which gradspec did not write (or which changed "
            "since): pass --overwrite to replace them, or choose another --out"
        )


def _refuse_inside_a_store(out: Path) -> None:
    """A Zarr store (a spectrum or gradients store) is gradspec's own folder, not a place for
    report.json and figures (was: `decay SPEC --out SPEC/decay` wrote into the store's folder)."""
    path = out.resolve()
    for folder in (path, *path.parents):
        if (folder / "zarr.json").is_file():
            where = "is" if folder == path else "lies inside"
            raise ValueError(
                f"--out {str(out)!r} {where} the Zarr store {str(folder)!r}; choose a directory "
                "outside it"
            )


def record_outputs(out: Path, names: Iterable[str], *, replaces: Iterable[str] = ()) -> None:
    """Record the files ``names`` (just written into ``out``) as gradspec's, with their digests.

    ``replaces``: every name this command writes in some run; those an earlier run wrote (the
    record says so, bytes unchanged) that this one did not are removed, so a narrower rerun
    (`decay --spectrum-only`) leaves no figure of the analysis before it (found by review).
    """
    names = list(names)
    record = _record(out)
    for name in set(replaces) - set(names):
        path = out / name
        if name in record and path.is_file() and not path.is_symlink() and record[name] == _digest(path):
            path.unlink()
    for name in names:
        if (out / name).is_file():
            record[name] = _digest(out / name)
    record = {k: v for k, v in record.items() if (out / k).is_file()}
    tmp = out / f"{RECORD_NAME}.tmp"
    tmp.write_text(json.dumps({"format": _FORMAT, "files": dict(sorted(record.items()))}, indent=1))
    os.replace(tmp, out / RECORD_NAME)
