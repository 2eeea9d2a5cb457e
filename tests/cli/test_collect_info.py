"""`gradspec collect` and `gradspec info` through typer's CliRunner, checked through the library."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import GradientStore

runner = CliRunner()

LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "5", "--checkpoint-every", "4",
           "--no-progress"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_collect_then_info(tmp_path):
    out = tmp_path / "run"
    res = invoke("collect", "--out", out, "--steps", 10, "--epsilon", 2.0, "--mode", "per-example", *LOWRANK)
    assert res.exit_code == 0, res.output
    store = GradientStore.open(out / "gradients.zarr")
    assert store.status == "complete" and store.per_example
    meta = store.row_meta()
    _, first = np.unique(meta["step"], return_index=True)
    assert store.p == 40 and store.n_rows == int(meta["batch_size"][first].sum())
    # lowrank gradients span exactly r = 3 dimensions
    s = np.linalg.svd(store.read().astype(np.float64), compute_uv=False)
    assert (s > 1e-6 * s[0]).sum() == 3
    cfg = store.config
    assert cfg["final_epsilon"] <= 2.0 + 1e-9 and cfg["collect"]["target_epsilon"] == 2.0
    assert f"({store.n_rows} rows)" in res.output

    info = invoke("info", out / "gradients.zarr")
    assert info.exit_code == 0, info.output
    assert f"{store.n_rows} rows x 40 columns" in info.output and "[complete]" in info.output
    as_json = json.loads(invoke("info", out / "gradients.zarr", "--json").output)
    assert as_json["shape"] == [store.n_rows, 40]


def test_resume_through_the_cli(tmp_path):
    """--resume continues from the last checkpoint (killed runs: tests/collect/test_kill_resume.py)."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert invoke("collect", "--out", a, "--steps", 8, *LOWRANK).exit_code == 0
    assert invoke("collect", "--out", b, "--steps", 8, "--stop-after", 5, *LOWRANK).exit_code == 0
    assert GradientStore.open(b / "gradients.zarr").status == "writing"
    res = invoke("collect", "--out", b, "--resume")
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(GradientStore.open(a / "gradients.zarr").read(),
                                  GradientStore.open(b / "gradients.zarr").read())
    # a damaged run (fewer committed rows than its checkpoint) is refused, not silently redone
    GradientStore.open(b / "gradients.zarr", mode="r+").truncate(3)
    res = invoke("collect", "--out", b, "--resume")
    assert res.exit_code != 0 and "damaged" in res.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["info", "{tmp}/missing"], "no gradspec store"),
        (["info", "{tmp}/plain"], "not a gradspec store"),
        (["info", "{tmp}/other.zarr"], "not a gradspec store"),
        (["collect", "--out", "{tmp}/x", "--mode", "sometimes"], "choose one of"),
        (["collect", "--out", "{tmp}/x", "--task", "nope"], "nope"),
        (["collect", "--out", "{tmp}/x", "--sigma", "1", "--epsilon", "2"], "not both"),
        (["collect", "--out", "{tmp}/x", "--resume"], "no run to resume"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    (tmp_path / "plain").mkdir()
    zarr.open_group(str(tmp_path / "other.zarr"), mode="w").attrs["x"] = 1
    res = invoke(*[a.format(tmp=tmp_path) for a in args])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], res.output
    assert "Traceback" not in res.output


def test_existing_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    assert invoke("collect", "--out", out, "--steps", 4, *LOWRANK).exit_code == 0
    before = GradientStore.open(out / "gradients.zarr").read()
    res = invoke("collect", "--out", out, "--steps", 4, *LOWRANK)
    assert res.exit_code != 0 and "--overwrite" in res.output
    np.testing.assert_array_equal(GradientStore.open(out / "gradients.zarr").read(), before)
