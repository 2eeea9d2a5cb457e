"""The real-text cache is checked at every load (issue 34 §3): a cached file that is not the
pinned bytes — cut short, its labels flipped, overwritten with random bytes, a FIFO — is
refused in one line naming the file and ``bash scripts/install.sh``, by the library and by
``gradspec collect --task text``, before anything is trained or written.

The damage is done to the real file when it is installed (checked against the pins in the
code); otherwise to a small file of the same layout pinned in their place, so the checks
always run."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.tasks import _reviews, _tweets, make_task
from gradspec.tasks._datacache import read_installed

MODULES = {"movie-reviews": (_reviews, "REVIEWS"), "tweets": (_tweets, "TWEETS_DATA")}


def _small(dataset: str) -> bytes:
    if dataset == "movie-reviews":
        rows = [f"{i}\t{(-1) ** i * 1.5}\tsnippet number {i}" for i in range(60)]
        return ("\r\n".join(rows) + "\r\n").encode()
    rows = ["sentiment,confidence,text", *(f"{('negative', 'positive')[i % 2]},1,tweet number {i}" for i in range(60))]
    return ("\r\n".join(rows) + "\r\n").encode("latin-1")


def _flip(dataset: str, payload: bytes) -> bytes:
    """Every label inverted: score signs (movie reviews), negative <-> positive (tweets, same size)."""
    if dataset == "movie-reviews":
        return re.sub(rb"\t(-?)(?=[0-9.]+\t)", lambda m: b"\t" if m.group(1) else b"\t-", payload)
    return payload.replace(b"negative,", b"\0,").replace(b"positive,", b"negative,").replace(b"\0,", b"positive,")


DAMAGE = {
    "truncated": lambda ds, b: b[: len(b) // 2],
    "signs-flipped": _flip,
    "random-bytes": lambda ds, b: np.random.default_rng(0).bytes(len(b)),  # the pinned size: the hash decides
}


@pytest.fixture(params=list(MODULES))
def cache(request, tmp_path, monkeypatch):
    """(dataset, its intact bytes, the cache folder): the real file when installed, else a pinned small one."""
    dataset = request.param
    module, attr = MODULES[dataset]
    data = getattr(module, attr)
    try:
        payload = read_installed(data)
    except ValueError:  # not installed (or damaged) here: pin a small file of the same layout
        payload = _small(dataset)
        monkeypatch.setattr(module, attr, dataclasses.replace(
            data, file_size=len(payload), file_sha256=hashlib.sha256(payload).hexdigest()))
    folder = tmp_path / "data"
    folder.mkdir()
    monkeypatch.setenv("GRADSPEC_DATA", str(folder))
    return dataset, payload, folder / data.file


def _options(dataset: str) -> dict:
    return {"dataset": dataset, "model": "tiny-bert", "n_eval": 8, "n_public": 4, "max_length": 8}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_is_refused_by_the_library_in_one_line(cache, damage):
    dataset, payload, path = cache
    bad = DAMAGE[damage](dataset, payload)
    assert bad != payload and (damage != "signs-flipped" or _flip(dataset, bad) == payload)
    path.write_bytes(bad)
    with pytest.raises(ValueError) as err:
        make_task("text", **_options(dataset))
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"the {dataset} data file {path} is damaged (")
    assert msg.endswith("run bash scripts/install.sh to fetch it again")
    size_differs = len(bad) != len(payload)
    assert ("bytes, not the" in msg) == size_differs and ("SHA-256" in msg) == (not size_differs)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_is_refused_by_collect_before_anything_is_written(cache, damage, tmp_path):
    dataset, payload, path = cache
    path.write_bytes(DAMAGE[damage](dataset, payload))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["collect", "--task", "text", "-t", f"dataset={dataset}", "-t", "model=tiny-bert",
                                   "--out", str(out), "--steps", "1", "--no-progress"])
    assert res.exit_code == 2, res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith(f"error: the {dataset} data file {path} is damaged (")
    assert line.endswith("run bash scripts/install.sh to fetch it again")
    assert not out.exists()


def test_the_intact_cache_loads_and_a_fifo_or_folder_in_its_place_is_refused_without_a_hang(cache):
    dataset, payload, path = cache
    path.write_bytes(payload)
    task = make_task("text", **_options(dataset))
    assert len(task.train) > 0
    path.unlink()
    os.mkfifo(path)  # no writer: a blocking open would wait forever
    with pytest.raises(ValueError, match=r"is damaged \(not a regular file\); run bash scripts/install.sh"):
        make_task("text", **_options(dataset))
    path.unlink()
    path.mkdir()  # was: "not installed (… is missing)"
    with pytest.raises(ValueError, match=r"is damaged \(not a regular file\); run bash scripts/install.sh"):
        make_task("text", **_options(dataset))
