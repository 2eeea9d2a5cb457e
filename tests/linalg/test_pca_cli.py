"""`gradspec pca`'s summary (the check that ran, the rates, the kernel) and its new options."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import SpectrumStore
from tests.linalg.cases import Case
from tests.linalg.test_store_backed import write_store

runner = CliRunner()


@pytest.fixture(scope="module")
def grads(tmp_path_factory):
    h = Case("power", r=45, p=700, k=6, spectrum="power").matrix().astype(np.float32)
    path = tmp_path_factory.mktemp("g") / "grads.zarr"
    write_store(path, h)
    return path


def _pca(grads, out, *args):
    return runner.invoke(app, ["pca", str(grads), "--k", "4", "--out", str(out), "--no-progress", *args])


def test_summary_says_which_check_ran_and_the_rates(grads, tmp_path):
    r = _pca(grads, tmp_path / "a.zarr", "--kernel", "numpy-syrk")
    assert r.exit_code == 0, r.output
    assert "check: cheap, 16 Gaussian probes of H·V: residual_h bounds hold jointly with probability 0.999" in r.output
    assert ": ok" in r.output and "Gram eigen-residual" in r.output
    assert "rates: gram 0." in r.output and "GFLOP/s" in r.output and "GB/s read; project" in r.output
    assert "gram kernel: numpy-syrk (as requested)" in r.output
    saved = SpectrumStore.open(tmp_path / "a.zarr")
    assert saved.params["kernel"] == "numpy-syrk" and saved.params["verify"] == "cheap"
    assert [e["pass"] for e in saved.params["rates"]] == ["gram", "project"]


def test_verify_full_and_none(grads, tmp_path):
    r = _pca(grads, tmp_path / "f.zarr", "--verify", "full")
    assert r.exit_code == 0, r.output
    assert "check: full, the products H·V and VᵀV, measured; residual_ht measured: Hᵀ·U in float64: ok" in r.output
    assert SpectrumStore.open(tmp_path / "f.zarr").accuracy["check"] == "full"
    r = _pca(grads, tmp_path / "n.zarr", "--no-verify")
    assert r.exit_code == 0 and "check: none, no check" in r.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--iters", "40"], "error: method gram (chosen by --method auto) does not use --iters"),
        (["--kernel", "mkl"], "error: unknown Gram kernel 'mkl'; choose one of: auto, numpy-syrk"),
        (["--verify", "some"], "error: unknown verify mode 'some'; choose one of: cheap, full, none"),
        (["--verify", "full", "--no-verify"], "error: --no-verify and --verify full contradict each other"),
    ],
    ids=["auto-gram-iters", "kernel", "verify", "verify-twice"],
)
def test_bad_options_are_one_line(grads, tmp_path, args, message):
    r = _pca(grads, tmp_path / "x.zarr", *args)
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output
    assert [line for line in r.output.splitlines() if not line.startswith("INFO ")] == [
        next(line for line in r.output.splitlines() if line.startswith("error: "))]
