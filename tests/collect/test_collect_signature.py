"""`collect` takes `train`'s keywords (one owner of the list) with a recorder as its sink."""

from __future__ import annotations

import inspect

import pytest

from gradspec.collect import collect
from gradspec.train import train


def test_collect_shows_the_trainers_keywords_with_the_store_on():
    mine, trainers = inspect.signature(collect), inspect.signature(train)
    assert list(mine.parameters) == [n for n in trainers.parameters if n != "sink"]
    for name, param in mine.parameters.items():
        want = trainers.parameters[name]
        assert (param.kind, param.annotation) == (want.kind, want.annotation), name
        assert param.default == (True if name == "write_store" else want.default), name
    assert mine.return_annotation == trainers.return_annotation


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"out": "x", "stpes": 3}, "collect() got an unexpected keyword argument 'stpes'"),
        ({}, "collect() missing a required argument: 'out'"),
        ({"out": "x", "sink": None}, "collect() writes through a GradientRecorder"),
    ],
    ids=["unknown-keyword", "no-out", "own-sink"],
)
def test_bad_keywords_are_refused_before_anything_runs(tmp_path, options, message):
    if "out" in options:
        options = {**options, "out": tmp_path / "run"}
    with pytest.raises(TypeError) as err:
        collect(None, **options)
    assert str(err.value).startswith(message)
    assert not (tmp_path / "run").exists()
