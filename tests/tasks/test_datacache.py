"""The shared real-text rules (``gradspec.tasks._datacache``): the cache is used without a
download, one dataset's failed fetch does not stop the others, each text is kept once."""

from __future__ import annotations

import subprocess

import pytest

from gradspec.tasks import _datacache
from gradspec.tasks._datacache import PackagedData, fetch, fetch_all, unique_labelled
from gradspec.tasks._realtext import REAL_TEXT


def _data(name: str) -> PackagedData:
    return PackagedData(name=name, requirement=f"{name}==1.0", filename=f"{name}.whl", sha256="0" * 64,
                        file=f"{name}.txt", read=lambda path: b"")


def test_each_text_once_in_first_order_and_texts_labelled_both_ways_dropped():
    texts, labels = unique_labelled([("a", 1), ("b", 0), ("a", 1), ("c", 1), ("b", 1), ("d", 0)])
    assert (texts, labels) == (["a", "c", "d"], [1, 1, 0])


def test_a_cached_file_is_used_without_a_download(tmp_path, monkeypatch):
    (tmp_path / "x.txt").write_text("data")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("downloaded"))
    assert fetch(_data("x"), tmp_path) == tmp_path / "x.txt"


def test_one_failed_fetch_leaves_the_others_and_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRADSPEC_DATA", str(tmp_path))
    (tmp_path / "ok.txt").write_text("data")

    def refuse(*args, **kwargs):
        raise subprocess.CalledProcessError(1, args[0])

    monkeypatch.setattr(_datacache.subprocess, "run", refuse)
    assert fetch_all([_data("missing"), _data("ok")]) == 1
    out, err = capsys.readouterr()
    assert out == f"ok: {tmp_path / 'ok.txt'}\n"
    assert err.startswith("install: missing data unavailable (CalledProcessError") and err.count("\n") == 1


def test_every_real_dataset_pins_a_distinct_file_and_hash():
    datas = [data for data, _ in REAL_TEXT.values()]
    assert sorted(REAL_TEXT) == ["movie-reviews", "tweets"]
    assert [d.name for d in datas] == list(REAL_TEXT)
    assert len({d.file for d in datas}) == len({d.sha256 for d in datas}) == len(datas)
    assert all("==" in d.requirement and len(d.sha256) == 64 for d in datas)
