"""Opening gradspec Zarr groups with checks, shared by every store kind.

Every gradspec store is a Zarr v3 group whose attributes carry
``gradspec.kind`` ("gradients" or "spectrum") and ``gradspec.format`` (an
integer bumped on incompatible changes). On local disk, zarr's LocalStore
writes each object to a temporary file and renames it into place, so a chunk
or a metadata document is either the old or the new version, never torn; a
process killed mid-write leaves at most a stray ``*.partial`` file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from gradspec._files import json_sha256

KIND_KEY = "gradspec.kind"
#: The kinds of store gradspec writes (``gradspec.kind``); any other value is damage.
KNOWN_KINDS = ("gradients", "spectrum")
FORMAT_KEY = "gradspec.format"
FORMAT = 1
#: SHA-256 of every other attribute (:func:`attrs_digest`), rewritten with each change
#: (:func:`update_attrs`) and checked at every open: chunks carry a CRC-32C, the attributes
#: (row count, config, layout, σ's Frobenius norm...) carried nothing, so a flipped bit there
#: was read as data. A store written before it has none and opens with a warning.
DIGEST_KEY = "gradspec.attrs_sha256"

logger = logging.getLogger(__name__)


def is_url(path: str | os.PathLike) -> bool:
    return "://" in str(path)


def open_checked(path: str | os.PathLike, kind: str | None, mode: str = "r") -> zarr.Group:
    """Open the gradspec group at ``path`` and check that it is of ``kind`` (any when None).

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: ``path`` is not a gradspec store, or a store of another kind.
    """
    if mode not in ("r", "r+", "a"):
        raise ValueError(f"mode must be 'r' (read-only) or 'r+' (append), not {mode!r}")
    if not is_url(path):
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"no {kind or 'gradspec'} store at {str(path)!r}: check the path")
        if not (p / "zarr.json").is_file():
            raise ValueError(
                f"{str(path)!r} is not a gradspec store (no zarr.json); "
                f"pass the directory that `gradspec {'pca' if kind == 'spectrum' else 'collect'}` wrote"
            )
        odd = _irregular_metadata(p)
        if odd is not None:
            raise ValueError(f"{str(path)!r} is damaged: {odd!r} is not a regular file (zarr would wait on "
                             "a FIFO there forever); restore the store from a copy")
    try:
        group = zarr.open_group(store=str(path), mode="r" if mode == "r" else "r+")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as exc:
        raise ValueError(f"{str(path)!r} is not a gradspec store (not a Zarr v3 group)") from exc
    except (zarr.errors.ContainsArrayError, zarr.errors.NodeTypeValidationError) as exc:
        raise ValueError(
            f"{str(path)!r} is a Zarr array, not a gradspec store; pass the store's directory "
            f"(the one holding grads/ and meta/, or sigma/ and V/)"
        ) from exc
    except (ValueError, TypeError, RecursionError, zarr.errors.MetadataValidationError) as exc:  # bad zarr.json
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{str(path)!r} is not a readable gradspec store: its zarr.json is damaged ({first}); "
            f"restore it from a copy"
        ) from exc
    attrs = group.attrs.asdict()
    found = attrs.get(KIND_KEY)
    if found is None:
        raise ValueError(f"{str(path)!r} is a Zarr group but not a gradspec store (no {KIND_KEY})")
    if found not in KNOWN_KINDS:  # was: "upgrade gradspec" for what is, far likelier, an edit
        raise ValueError(
            f"{str(path)!r} is a gradspec store of unknown kind {found!r} (gradspec writes "
            f"{' and '.join(KNOWN_KINDS)} stores): its zarr.json is damaged; restore it from a copy"
        )
    if kind is not None and found != kind:
        raise ValueError(f"{str(path)!r} is a {found} store, not a {kind} store")
    fmt = attrs.get(FORMAT_KEY, 0)
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 0:
        raise ValueError(f"{str(path)!r} has {FORMAT_KEY} = {fmt!r}, not a format number; the store is damaged")
    if fmt > FORMAT:
        raise ValueError(
            f"{str(path)!r} has {FORMAT_KEY} = {fmt}, a format this gradspec does not know (it reads up "
            f"to {FORMAT}): its zarr.json is damaged, or a later gradspec wrote it"
        )
    digest = attrs.get(DIGEST_KEY)
    if digest is None:
        _warn_unverified(str(path))
    elif digest != attrs_digest(attrs):
        raise ValueError(f"{str(path)!r} is damaged: its attributes (zarr.json) do not match the digest "
                         f"written with them ({DIGEST_KEY}): a changed byte; restore the store from a copy")
    return group


def _irregular_metadata(root: Path) -> str | None:
    """The first ``zarr.json`` under ``root`` that is not a regular file (a FIFO, a directory, a
    device), else None. zarr opens an array's metadata with a plain blocking ``open``; its chunk
    folders (``c``) are not entered, so this costs one ``stat`` per array."""
    stack = [str(root)]
    while stack:
        here = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for entry in entries:
            if entry.name == "zarr.json":
                try:
                    mode = os.stat(entry.path).st_mode
                except OSError:
                    continue  # a dangling link: zarr reports it
                if not stat.S_ISREG(mode):
                    return os.path.relpath(entry.path, root)
            elif entry.name != "c" and entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return None


def attrs_digest(attrs: dict[str, Any]) -> str:
    """SHA-256 (hex) of ``attrs`` without :data:`DIGEST_KEY`, as canonical JSON (keys sorted)."""
    return json_sha256({k: v for k, v in attrs.items() if k != DIGEST_KEY})


def update_attrs(group: zarr.Group, changes: dict[str, Any], remove: tuple[str, ...] = ()) -> None:
    """Merge ``changes`` into the group's attributes (and drop ``remove``) with a new digest, in
    one write of its zarr.json (zarr replaces the file whole). Values must be JSON's own types
    (numpy scalars are refused here, not rounded differently by two encoders)."""
    new = {k: v for k, v in {**group.attrs.asdict(), **changes}.items() if k not in remove}
    new = json.loads(json.dumps(new, allow_nan=True))  # what a reader parses back: tuples are lists
    group.attrs.put({**new, DIGEST_KEY: attrs_digest(new)})


@functools.cache
def _warn_unverified(path: str) -> None:
    logger.warning("%s was written before gradspec stored a digest of its attributes: they cannot be "
                   "verified (its chunks still are)", path)


def create_group(path: str | os.PathLike, kind: str, attrs: dict[str, Any], overwrite: bool) -> zarr.Group:
    """Create a gradspec group; refuse to overwrite unless asked."""
    if not is_url(path):
        p = Path(path)
        if p.exists() and any(p.iterdir()) and not overwrite:
            raise FileExistsError(
                f"{str(path)!r} already exists; choose another path, pass --overwrite, "
                "or --resume to continue a run"
            )
    group = zarr.open_group(store=str(path), mode="w" if overwrite else "w-")
    update_attrs(group, {KIND_KEY: kind, FORMAT_KEY: FORMAT, **attrs})
    return group


def size_on_disk(path: str | os.PathLike) -> int | None:
    """Bytes under a local store directory (None for remote stores)."""
    if is_url(path):
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


# bfloat16 has no numpy dtype: it is stored as its raw 16 bits (uint16).


def to_disk_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rows -> the on-disk representation of ``dtype``."""
    if dtype == "float32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "float16":
        # torch's conversion (F16C) is exact IEEE round-to-nearest-even like numpy's, and
        # 40x faster on subnormal values (numpy: ~5 s for 32 rows of 1.8M entries near 4e-6).
        import torch

        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        return t.to(torch.float16).numpy()
    if dtype == "bfloat16":
        import torch

        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
        return t.view(torch.int16).numpy().view(np.uint16)
    raise ValueError(f"unknown gradient dtype {dtype!r}; choose float32, float16 or bfloat16")


def from_disk_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """On-disk rows -> float32."""
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    if dtype == "float16" and x.dtype == np.float16:
        # A table of all 65,536 values: exact, and unlike numpy's cast (which takes 3-5x
        # longer on subnormal values) the same speed for every value.
        return _float16_table()[x.view(np.uint16)]
    return x.astype(np.float32, copy=False)


@functools.cache
def _float16_table() -> np.ndarray:
    return np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def disk_numpy_dtype(dtype: str) -> str:
    return {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}[dtype]


def missing_attribute(path: str | os.PathLike, kind: str, err: KeyError) -> ValueError:
    """The one-line error for a store whose ``gradspec.kind`` claims ``kind`` but which lacks
    that kind's attributes (another kind's store relabelled, or a damaged one)."""
    name = err.args[0] if err.args else "?"
    return ValueError(
        f"{str(path)!r} says it is a {kind} store ({KIND_KEY}) but has no {name!r} attribute: it is "
        "another kind of store relabelled, or a damaged one"
    )


#: The bytes-to-bytes codecs gradspec writes after the (little-endian) bytes codec.
_WRITTEN_CODECS = frozenset({"ZstdCodec", "BloscCodec", "Crc32cCodec"})


def encoding_problem(arr: zarr.Array, dtype: Any = None) -> str | None:
    """What in an array's ``zarr.json`` gradspec never writes, or None: a data type other than
    ``dtype`` (when given), a byte order other than little-endian, an array-to-array codec (a
    transpose) or another codec. The chunk checksums see the stored bytes only, so a changed
    encoding would decode them into other numbers unnoticed (found by review: a big-endian
    sigma read as 3e-262 ... 2e+297 with "checksums checked: ok")."""
    meta = getattr(arr, "metadata", None)
    codecs = list(getattr(meta, "codecs", ()) or ())
    if dtype is not None and np.dtype(arr.dtype) != np.dtype(dtype):
        return f"its data type is {arr.dtype}, not {np.dtype(dtype)}"
    if getattr(getattr(meta, "data_type", None), "endianness", "little") not in ("little", None):
        return "its data type is not little-endian"
    if not codecs:  # zarr v2 metadata: not what gradspec writes, left to the other checks
        return None
    first = codecs[0]
    if type(first).__name__ != "BytesCodec":
        return f"its first codec is {type(first).__name__}, not the bytes codec"
    endian = getattr(first, "endian", None)
    if endian is not None and getattr(endian, "value", endian) != "little":
        return f"its bytes codec is {getattr(endian, 'value', endian)}-endian"
    other = [type(c).__name__ for c in codecs[1:] if type(c).__name__ not in _WRITTEN_CODECS]
    return f"it declares codecs gradspec does not write ({', '.join(other)})" if other else None
