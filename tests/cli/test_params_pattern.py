"""`--params` patterns (``gradspec._layout.match_names``): an invalid ``re:`` pattern is one
line naming it, in `collect` and in `pca` (was: a re.error traceback)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import match_names

runner = CliRunner()
LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=20", "-t", "r=3", "--batch-size", "20",
           "--steps", "3", "--no-progress"]


def _one_error_line(res) -> str:
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_match_names_names_an_invalid_regex():
    assert match_names(["enc.weight", "enc.bias", "head.weight"], ["re:\\.weight$"]) == ["enc.weight", "head.weight"]
    with pytest.raises(ValueError, match=r"parameter pattern 're:\(' is not a valid regular expression \(.*\)"):
        match_names(["enc.weight"], ["*.bias", "re:("])


@pytest.mark.parametrize("pattern", ["re:[", "re:a(b", "re:*x"])
def test_collect_and_pca_refuse_an_invalid_regex_in_one_line(tmp_path, pattern):
    out = tmp_path / "run"
    line = _one_error_line(runner.invoke(app, ["collect", "--out", str(out), *LOWRANK, "--params", pattern]))
    assert f"parameter pattern '{pattern}' is not a valid regular expression" in line
    assert not out.exists() or not any(out.iterdir())
    res = runner.invoke(app, ["collect", "--out", str(out), *LOWRANK, "--params", "re:."])
    assert res.exit_code == 0, res.output
    spec = tmp_path / "spec.zarr"
    line = _one_error_line(runner.invoke(app, ["pca", str(out / "gradients.zarr"), "--k", "2", "--out", str(spec),
                                               "--params", pattern]))
    assert f"parameter pattern '{pattern}' is not a valid regular expression" in line
    assert not spec.exists()
