"""The helpers every reproduction shares: statistics over seeds, the claims table, JSON."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from analyses._common import claims_markdown, installed_version, json_safe, seed_stats


def test_seed_stats_is_the_sample_mean_std_and_standard_error() -> None:
    values = [0.71, 0.74, 0.69, 0.80]
    s = seed_stats(values)
    assert s["n"] == 4
    assert s["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert s["std"] == pytest.approx(statistics.stdev(values), rel=1e-12)  # ddof 1
    assert s["se"] == pytest.approx(statistics.stdev(values) / 2, rel=1e-12)


@pytest.mark.parametrize("single", [math.nan, 0.0, None], ids=["nan", "zero", "none"])
def test_seed_stats_of_one_seed_uses_the_callers_convention(single) -> None:
    s = seed_stats([0.5], single=single)
    assert s["mean"] == 0.5 and s["n"] == 1
    if single is None or single == 0.0:
        assert s["std"] is single and s["se"] is single
    else:
        assert math.isnan(s["std"]) and math.isnan(s["se"])
    empty = seed_stats([], single=single)
    assert empty["n"] == 0 and math.isnan(empty["mean"])


def test_claims_markdown_takes_dicts_or_sequences() -> None:
    row = {"reproduced": "yes", "ours": "0.9 ± 0.1", "paper": "0.9", "claim": "a > b"}
    text = claims_markdown([row, ("c", "p", "o", "no")], ours="ours (mean ± std)")
    assert text.split("\n") == ["| claim | paper | ours (mean ± std) | reproduced? |", "|---|---|---|---|",
                                "| a > b | 0.9 | 0.9 ± 0.1 | yes |", "| c | p | o | no |"]
    norm = [("||g|| small", "p", "o", "yes")]
    assert claims_markdown(norm).endswith("| ||g|| small | p | o | yes |")
    assert claims_markdown(norm, pipes_to_slashes=True).endswith("| //g// small | p | o | yes |")


def test_json_safe_writes_non_finite_floats_as_null() -> None:
    x = {1: (np.float32(2.5), np.int64(3), float("inf")), "a": np.array([1.0, np.nan]), "p": Path("/x"),
         "b": True, "s": "t", "n": None}
    out = json_safe(x)
    assert out == {"1": [2.5, 3, None], "a": [1.0, None], "p": "/x", "b": True, "s": "t", "n": None}
    assert type(out["1"][1]) is int and type(out["1"][0]) is float
    json.dumps(out, allow_nan=False)  # strict JSON


def test_installed_version() -> None:
    assert installed_version("numpy") == np.__version__
    assert installed_version("no-such-distribution-xyz") is None
