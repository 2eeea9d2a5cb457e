"""`gradspec pca` → `gradspec decay` at their boundaries: inputs that used to exit 0 with a
plausible wrong result (issue 13 §2). Each test says what happened before.

Every store here is small (≤ 100 rows, p ≤ 5000) and written through the library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import META_FIELDS, GradientStore, ParamLayout, SpectrumStore, update_attrs
from gradspec.store._manifest import MANIFEST_KEY

runner = CliRunner()

#: The model of the spectrum: p = 100.
SHAPES = [("enc.weight", (8, 10)), ("enc.bias", (10,)), ("head.weight", (2, 5))]
R = 100


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def ok(*args):
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    return res


def one_line_error(res, *fragments):
    assert res.exit_code != 0, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.output
    for f in fragments:
        assert f in lines[0], res.output
    assert "Traceback" not in res.output
    return lines[0]


def power_rows(r: int, p: int, seed: int = 0, rank: int | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = min(r, p) if rank is None else rank
    u, _ = np.linalg.qr(rng.standard_normal((r, n)))
    v, _ = np.linalg.qr(rng.standard_normal((p, n)))
    s = 10.0 * np.arange(1, n + 1) ** -0.8
    return ((u * s) @ v.T).astype(np.float32)


def make_store(path, h, shapes=SHAPES, *, config=None, seed=0, rows_per_chunk=8):
    layout = ParamLayout.from_shapes(shapes)
    store = GradientStore.create(
        path, layout=layout, config=config, rows_per_chunk=rows_per_chunk, cols_per_chunk=32
    )
    r = h.shape[0]
    meta = {name: np.zeros(r, dtype=dt) for name, dt in META_FIELDS.items()}
    meta["step"] = np.arange(r)
    meta["loss"] = np.random.default_rng(seed + 100).random(r).astype(np.float32)
    store.append(h, meta)
    return store


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 100-row store of the p = 100 model, its spectrum of all rows and of rows 0:60."""
    tmp = tmp_path_factory.mktemp("run")
    h = power_rows(R, 100)
    make_store(tmp / "grads.zarr", h, config={"n_train": 500, "steps": R, "seed": 0})
    ok("pca", tmp / "grads.zarr", "--k", 20, "--out", tmp / "all.zarr", "--no-progress")
    ok("pca", tmp / "grads.zarr", "--k", 20, "--out", tmp / "first60.zarr", "--rows", "0:60",
       "--no-progress")
    return {"tmp": tmp, "grads": tmp / "grads.zarr", "H": h.astype(np.float64),
            "all": tmp / "all.zarr", "first60": tmp / "first60.zarr"}


def heldout_G(report, name="heldout"):
    return np.asarray(report["rows"][name]["G_k"]["max"]), report["rows"][name]["G_k"]["ks"]


def dense_G(rows: np.ndarray, v: np.ndarray, ks) -> np.ndarray:
    return np.array([np.linalg.norm(rows - rows @ v[:, :k] @ v[:, :k].T, axis=1).max() for k in ks])


# ---------------------------------------------------------------- 1. layouts
@pytest.mark.parametrize(
    "shapes,fragment",
    [
        ([("conv.weight", (50, 100))], "has no parameter 'enc.weight'"),  # p = 5000, another model
        ([("a", (80,)), ("b", (10,)), ("c", (10,))], "has no parameter 'enc.weight'"),  # same p
        ([("enc.weight", (10, 8)), ("enc.bias", (10,)), ("head.weight", (2, 5))],
         "'enc.weight' with shape (10, 8), expected (8, 10)"),
        ([("enc.bias", (10,)), ("enc.weight", (8, 10)), ("head.weight", (2, 5))],
         "holds 'enc.bias' before 'enc.weight'"),
    ],
    ids=["other-model-p5000", "same-p-other-names", "transposed", "reordered"],
)
def test_decay_refuses_a_gradient_store_of_another_layout(run, tmp_path, shapes, fragment):
    """Before: the first 100 columns of the other store were read as if they were the model's."""
    p = sum(int(np.prod(s)) for _, s in shapes)
    make_store(tmp_path / "other.zarr", power_rows(30, p, seed=1), shapes)
    res = invoke("decay", run["first60"], "--out", tmp_path / "d", "--gradients",
                 tmp_path / "other.zarr", "--no-plots")
    one_line_error(res, fragment)
    assert not (tmp_path / "d" / "report.json").exists()


def test_decay_reads_the_selected_parameters_of_a_larger_store(run, tmp_path):
    """A held-out store with more parameters is read at the columns of the spectrum's ones."""
    shapes = [("emb.weight", (7, 3)), *SHAPES[:2], ("mid.weight", (5,)), SHAPES[2]]
    h = power_rows(30, 21 + 100 + 5, seed=2)
    make_store(tmp_path / "big.zarr", h, shapes)
    ok("decay", run["first60"], "--out", tmp_path / "d", "--gradients", tmp_path / "big.zarr",
       "--no-plots")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    cols = np.r_[21:111, 116:126]  # enc.weight, enc.bias | head.weight
    assert report["sources"]["heldout"]["col_ranges"] == [[21, 111], [116, 126]]
    v = SpectrumStore.open(run["first60"]).read_v().astype(np.float64)
    got, ks = heldout_G(report)
    np.testing.assert_allclose(got, dense_G(h[:, cols].astype(np.float64), v, ks), rtol=1e-4)


def test_require_same_is_the_one_layout_check():
    a = ParamLayout.from_shapes(SHAPES)
    assert a.require_same(ParamLayout.from_shapes(SHAPES), what="x") == [(0, 100)]
    with pytest.raises(ValueError, match="the model has 1 parameter.* 'extra'"):
        a.require_same(ParamLayout.from_shapes([*SHAPES, ("extra", (3,))]), what="the model")
    sup = ParamLayout.from_shapes([("z", (4,)), *SHAPES])
    assert a.require_same(sup, what="x", subset=True) == [(4, 104)]


# ---------------------------------------------------------------- 2. held-out rows
@pytest.mark.parametrize(
    "spec,rows,fragments",
    [
        ("all", "50:200", ["--heldout-rows 50:200 lies outside the 100 committed rows"]),
        ("all", "50:100", ["overlap the rows 0:100 the spectrum was computed from",
                           "50 rows in both, 50:100"]),
        ("first60", "50:80", ["overlap the rows 0:60", "10 rows in both, 50:60"]),
        ("first60", "60:120", ["lies outside the 100 committed rows"]),
        ("first60", "-120:", ["lies outside"]),
    ],
    ids=["beyond-store", "all-in-sample", "partly-in-sample", "clipped", "negative"],
)
def test_heldout_rows_must_be_held_out(run, tmp_path, spec, rows, fragments):
    """Before: 50:200 of 100 rows all in the spectrum were clipped to 50:100, labelled held-out
    and called "the honest estimate"."""
    res = invoke("decay", run[spec], "--out", tmp_path / "d", "--heldout-rows", rows, "--no-plots")
    one_line_error(res, *fragments)


def test_heldout_rows_outside_the_spectrum_are_measured(run, tmp_path):
    ok("decay", run["first60"], "--out", tmp_path / "d", "--heldout-rows", "60:100", "--no-plots")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["sources"]["heldout"]["rows"] == {"start": 60, "stop": 100, "step": 1}
    assert report["sources"]["collected"]["n_rows"] == 60
    v = SpectrumStore.open(run["first60"]).read_v().astype(np.float64)
    got, ks = heldout_G(report)
    np.testing.assert_allclose(got, dense_G(run["H"][60:], v, ks), rtol=1e-4)


def test_a_copy_of_the_source_store_is_the_source(run, tmp_path):
    """Same run at another path (same config, same rows): its rows 0:60 are in-sample too."""
    shutil.copytree(run["grads"], tmp_path / "copy.zarr")
    res = invoke("decay", run["first60"], "--out", tmp_path / "d", "--gradients",
                 tmp_path / "copy.zarr", "--heldout-rows", "0:80", "--no-plots")
    one_line_error(res, "overlap the rows 0:60")
    # without --heldout-rows the copy's own rows are the collected ones, not "held-out"
    ok("decay", run["first60"], "--out", tmp_path / "d", "--gradients", tmp_path / "copy.zarr",
       "--no-plots")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert "heldout" not in report["rows"] and report["sources"]["collected"]["n_rows"] == 60
    assert any("holds the same run" in n for n in report["notes"])


def test_source_store_rewritten_since_pca(run, tmp_path):
    """Before: whatever rows now sat at the source path were analysed as the spectrum's rows."""
    shutil.copytree(run["grads"], tmp_path / "g.zarr")
    ok("pca", tmp_path / "g.zarr", "--k", 10, "--out", tmp_path / "s.zarr", "--no-progress")
    shutil.rmtree(tmp_path / "g.zarr")
    make_store(tmp_path / "g.zarr", power_rows(R, 100, seed=5), seed=5)  # another run, same path
    res = invoke("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--no-plots")
    one_line_error(res, "are not the rows the spectrum was computed from")
    shutil.rmtree(tmp_path / "g.zarr")
    make_store(tmp_path / "g.zarr", run["H"][:50].astype(np.float32))  # truncated
    res = invoke("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--no-plots")
    one_line_error(res, "has 50 committed rows", "rows 0:100")


def test_rows_of_a_store_still_being_written_are_the_rows_pca_used(tmp_path):
    """Before: `--rows 20:` on 60 committed rows was re-read as 20:100 once the store had grown."""
    h = power_rows(R, 100)
    store = make_store(tmp_path / "g.zarr", h[:60])
    ok("pca", tmp_path / "g.zarr", "--k", 10, "--rows", "20:", "--out", tmp_path / "s.zarr",
       "--no-progress")
    meta = {name: np.zeros(40, dtype=dt) for name, dt in META_FIELDS.items()}
    meta["step"] = np.arange(60, 100)
    GradientStore.open(store.path, mode="r+").append(h[60:], meta)
    ok("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--no-plots")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["sources"]["collected"]["rows"] == {"start": 20, "stop": 60, "step": 1}
    G = report["rows"]["collected"]["G_k"]["max"]
    assert G[0] == pytest.approx(np.linalg.norm(h[20:60].astype(float), axis=1).max(), rel=1e-6)


# ---------------------------------------------------------------- 3. rank-deficient H
@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_pca_beyond_the_numerical_rank_then_decay(tmp_path, precision):
    """Before: pca warned and exited 0 (float32: not even a warning, 15 noise directions), then
    decay failed with "basis columns are not unit vectors … pass check_orthonormal=False"."""
    h = power_rows(R, 100, rank=5)
    make_store(tmp_path / "g.zarr", h)
    res = ok("pca", tmp_path / "g.zarr", "--k", 50, "--out", tmp_path / "s.zarr", "--rows",
             "0:80", "--precision", precision, "--no-progress")
    assert "kept k=5 of --k 50: sigma_6" in res.output
    spec = SpectrumStore.open(tmp_path / "s.zarr")
    assert spec.k == 5 and spec.k_requested == 50 and spec.V.shape == (100, 5)
    assert spec.attrs["gradspec.rank_rtol"] > 0 and spec.params["k_reason"].startswith("sigma_6")
    np.testing.assert_allclose(spec.sigma, np.linalg.svd(h[:80].astype(float), compute_uv=False)[:5],
                               rtol=1e-5)
    ok("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--heldout-rows", "80:100",
       "--no-plots")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["sources"]["spectrum"]["k"] == 5 and len(report["spectrum"]["sigma"]) == 5
    # the held-out rows lie in the same 5-dimensional row space: G_5 ≈ 0
    assert report["rows"]["heldout"]["G_k"]["max"][-1] < 1e-3 * report["rows"]["heldout"]["G_k"]["max"][0]
    res = invoke("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--k-max", 20)
    one_line_error(res, "--k-max 20 is outside the 5 directions the spectrum stores")


# ---------------------------------------------------------------- 4. resume
@pytest.fixture
def interrupted(tmp_path, monkeypatch):
    """An orthogonal run interrupted (Ctrl-C) after 2 of 6 iterations, through the CLI."""
    h = power_rows(60, 100)
    make_store(tmp_path / "g.zarr", h)
    orig = SpectrumStore.save_state
    calls = []

    def save_then_interrupt(self, state):
        orig(self, state)
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(SpectrumStore, "save_state", save_then_interrupt)
    args = ["pca", tmp_path / "g.zarr", "--k", 6, "--method", "orthogonal", "--iters", 6,
            "--out", tmp_path / "s.zarr", "--no-progress"]
    res = invoke(*args)
    assert res.exit_code == 130, res.output
    monkeypatch.setattr(SpectrumStore, "save_state", orig)
    assert SpectrumStore.open(tmp_path / "s.zarr").status == "interrupted"
    return tmp_path, args


@pytest.mark.parametrize(
    "extra,names",
    [
        # The store holds float32: the default (auto) runs float32 products.
        (["--precision", "float64"], ["precision: saved 'float32', now 'float64'"]),
        (["--iters", 8], ["iters: saved 6, now 8"]),
        (["--tol", "1e-9"], ["tol: saved None, now 1e-09"]),
        (["--oversample", 3], ["oversample: saved 10, now 3"]),
        (["--seed", 1], ["seed: saved 0, now 1"]),
        (["--center"], ["center: saved False, now True"]),
        (["--params", "enc.*"], ["params: saved None, now ['enc.*']", "shape: saved (60, 100), now (60, 90)",
                                 "col_ranges: saved [[0, 100]], now [[0, 90]]"]),
        (["--precision", "float64", "--seed", 2], ["precision:", "seed:"]),
    ],
    ids=["precision", "iters", "tol", "oversample", "seed", "center", "params", "two"],
)
def test_resume_refuses_every_setting_that_changes_the_result(interrupted, extra, names):
    """Before: --precision (and tol, iters, column ranges) were not compared: the run silently
    finished in the new setting."""
    _, args = interrupted
    res = invoke(*args, "--resume", *extra)
    one_line_error(res, "cannot resume", *names)


def test_resume_with_the_same_settings_finishes_the_run(interrupted):
    tmp, args = interrupted
    ok(*args, "--resume")
    ok(*[a if a != tmp / "s.zarr" else tmp / "ref.zarr" for a in args])
    a, b = SpectrumStore.open(tmp / "s.zarr"), SpectrumStore.open(tmp / "ref.zarr")
    assert a.status == "complete" and "gradspec.error" not in a.attrs
    np.testing.assert_allclose(a.sigma, b.sigma, rtol=1e-12)


def test_resume_after_the_store_grew_names_the_rows(interrupted):
    """`--rows` unset means "all committed rows": more rows now is another H, not a resume."""
    tmp, args = interrupted
    meta = {name: np.zeros(10, dtype=dt) for name, dt in META_FIELDS.items()}
    GradientStore.open(tmp / "g.zarr", mode="r+").append(power_rows(10, 100, seed=9), meta)
    one_line_error(invoke(*args, "--resume"), "shape: saved (60, 100), now (70, 100)",
                   "rows: saved 0:60, now 0:70")


def test_a_plain_rerun_keeps_the_interrupted_runs_state_and_overwrite_replaces_it(interrupted):
    """Issue 34 §6 (data loss): a plain rerun deleted the saved state with only a warning, right after
    `info` had said `--resume` continues it, even a rerun of another gradients store."""
    tmp, args = interrupted
    out = tmp / "s.zarr"
    make_store(tmp / "other.zarr", power_rows(60, 100, seed=3))
    other = [a if a != tmp / "g.zarr" else tmp / "other.zarr" for a in args]
    for argv, whose in ((args, ""), (["pca", tmp / "other.zarr", "--k", 4, "--out", out], " of another gradients store")):
        one_line_error(invoke(*argv), f"holds the saved state of an unfinished orthogonal run{whose}",
                       "2 iteration(s) done: `gradspec pca ... --resume` continues it, --overwrite discards it")
        assert SpectrumStore.open(out).status == "interrupted"
        assert SpectrumStore.open(out).summary()["iterations_done"] == 2
    res = ok(*other, "--overwrite")
    assert SpectrumStore.open(out).status == "complete"
    assert SpectrumStore.open(out).source["abspath"] == str((tmp / "other.zarr").resolve())
    assert "--resume" not in res.output


def test_a_plain_rerun_keeps_the_state_of_a_killed_run(interrupted):
    """A run killed by SIGKILL stays `running`, its writer gone: `info` says `--resume` continues
    it, and a plain rerun must not delete what it would continue."""
    import socket

    tmp, args = interrupted
    out = tmp / "s.zarr"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that is no process now
    update_attrs(zarr.open_group(str(out), mode="r+"),
                 {"gradspec.status": "running", "gradspec.owner": {"host": socket.gethostname(), "pid": child.pid}})
    assert "--resume` continues it" in SpectrumStore.open(out).summary()["writer"]
    one_line_error(invoke(*args), "holds the saved state of an unfinished orthogonal run, 2 iteration(s) done")
    assert SpectrumStore.open(out).summary()["iterations_done"] == 2
    ok(*args, "--resume")
    assert SpectrumStore.open(out).status == "complete"


# ---------------------------------------------------------------- 5. failed runs
def test_a_failed_pca_leaves_nothing_in_the_way(tmp_path):
    """Before: NaN rows left a `[running]` store and the rerun said "already exists"."""
    h = power_rows(40, 100)
    h[[7, 21]] = np.nan
    make_store(tmp_path / "g.zarr", h)
    for _ in range(2):
        res = invoke("pca", tmp_path / "g.zarr", "--k", 5, "--out", tmp_path / "s.zarr",
                     "--no-progress")
        one_line_error(res, "NaN or inf in 2 selected row(s), e.g. row 7")
        assert not (tmp_path / "s.zarr").exists()
    ok("pca", tmp_path / "g.zarr", "--k", 5, "--out", tmp_path / "s.zarr", "--rows", "22:",
       "--no-progress")


def test_a_failed_overwrite_keeps_the_complete_store(tmp_path):
    """--overwrite replaces a complete store only when the new run completes."""
    h = power_rows(40, 100)
    make_store(tmp_path / "g.zarr", h)
    ok("pca", tmp_path / "g.zarr", "--k", 5, "--out", tmp_path / "s.zarr", "--no-progress")
    before = SpectrumStore.open(tmp_path / "s.zarr").sigma
    bad = h.copy()
    bad[3] = np.inf
    make_store(tmp_path / "bad.zarr", bad)
    res = invoke("pca", tmp_path / "bad.zarr", "--k", 5, "--out", tmp_path / "s.zarr",
                 "--overwrite", "--no-progress")
    one_line_error(res, "NaN or inf")
    spec = SpectrumStore.open(tmp_path / "s.zarr")
    assert spec.status == "complete"
    np.testing.assert_array_equal(spec.sigma, before)
    assert sorted(os.listdir(tmp_path)) == [".s.zarr.lock", "bad.zarr", "g.zarr", "s.zarr"]  # + its writers' lock
    ok("pca", tmp_path / "g.zarr", "--k", 3, "--out", tmp_path / "s.zarr", "--overwrite",
       "--no-progress")
    assert SpectrumStore.open(tmp_path / "s.zarr").k == 3
    assert sorted(os.listdir(tmp_path)) == [".s.zarr.lock", "bad.zarr", "g.zarr", "s.zarr"]  # + its writers' lock


def test_a_failure_after_a_saved_pass_keeps_a_resumable_store(tmp_path, monkeypatch):
    h = power_rows(60, 100)
    make_store(tmp_path / "g.zarr", h)
    orig = SpectrumStore.save_state

    def disk_fails(self, state):
        orig(self, state)
        if state["iteration"] == 2:
            raise OSError("simulated: disk I/O error")

    monkeypatch.setattr(SpectrumStore, "save_state", disk_fails)
    args = ["pca", tmp_path / "g.zarr", "--k", 6, "--method", "krylov", "--iters", 3,
            "--out", tmp_path / "s.zarr", "--no-progress"]
    one_line_error(invoke(*args), "disk I/O error")
    monkeypatch.setattr(SpectrumStore, "save_state", orig)
    spec = SpectrumStore.open(tmp_path / "s.zarr")
    assert spec.status == "failed" and "disk I/O error" in spec.attrs["gradspec.error"]
    res = ok(*args, "--resume")
    assert SpectrumStore.open(tmp_path / "s.zarr").status == "complete"
    # every pass the result rests on: the 4 passes of the Krylov space (2 of them before the
    # failure) and the V pass (issue 25: a resume used to record only its own call's 3)
    assert "5 passes" in res.output and SpectrumStore.open(tmp_path / "s.zarr").summary()["passes"] == 5


def test_a_killed_run_is_replaced_but_a_live_one_is_not(tmp_path):
    h = power_rows(40, 100)
    make_store(tmp_path / "g.zarr", h)
    SpectrumStore.create(tmp_path / "s.zarr", r=40, p=100, k=5, method="gram")  # this process
    res = invoke("pca", tmp_path / "g.zarr", "--k", 5, "--out", tmp_path / "s.zarr")
    one_line_error(res, "already exists", f"pid {os.getpid()}")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")
    update_attrs(g, {"gradspec.owner": {**g.attrs["gradspec.owner"], "pid": int(dead.stdout)}})
    ok("pca", tmp_path / "g.zarr", "--k", 5, "--out", tmp_path / "s.zarr", "--no-progress")


@pytest.mark.parametrize("target", ["source", "inside", "parent", "other-dir"])
def test_overwrite_never_deletes_what_is_not_a_spectrum(tmp_path, target):
    """Before: --overwrite wiped any directory at --out (zarr mode "w"), the input store included."""
    h = power_rows(40, 100)
    make_store(tmp_path / "run" / "g.zarr", h)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    out = {"source": tmp_path / "run" / "g.zarr", "inside": tmp_path / "run" / "g.zarr" / "s",
           "parent": tmp_path / "run", "other-dir": tmp_path / "notes"}[target]
    res = invoke("pca", tmp_path / "run" / "g.zarr", "--k", 5, "--out", out, "--overwrite")
    one_line_error(res, "choose another --out")
    assert GradientStore.open(tmp_path / "run" / "g.zarr").n_rows == 40
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


# ---------------------------------------------------------------- more of the same class
@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--k-max", 21], "--k-max 21 is outside the 20 directions"),
        (["--k-max", 21, "--spectrum-only"], "--k-max 21 is outside the 20 directions"),
        (["--fit-range", "1:500"], "--fit-range 1:500 is outside the 20 singular values"),
        (["--n", 100, "--epsilon", 2, "--delta", "1e-5", "--diameter", 1],
         "--n 100 differs from the 500 training examples"),
        (["--n", 500, "--epsilon", 2, "--delta", "1e-5", "--diameter", 1, "--dim", 50],
         "--dim 50 is below p = 100"),
        (["--spectrum-only", "--heldout-rows", "60:100"], "--spectrum-only reads no gradients"),
    ],
    ids=["k-max", "k-max-spectrum-only", "fit-range", "n", "dim", "spectrum-only-heldout"],
)
def test_decay_settings_that_do_not_fit_the_spectrum(run, tmp_path, args, fragment):
    res = invoke("decay", run["first60"], "--out", tmp_path / "d", "--no-plots", *args)
    one_line_error(res, fragment)


def test_decay_of_an_unfinished_spectrum_is_refused(tmp_path):
    SpectrumStore.create(tmp_path / "s.zarr", r=40, p=100, k=5, method="gram")
    res = invoke("decay", tmp_path / "s.zarr", "--out", tmp_path / "d")
    one_line_error(res, "is not complete (status 'running')")


def test_heldout_rows_need_a_readable_store(run, tmp_path):
    """Before: with the source store gone, --heldout-rows was dropped and decay exited 0."""
    shutil.copytree(run["grads"], tmp_path / "g.zarr")
    ok("pca", tmp_path / "g.zarr", "--k", 10, "--rows", "0:60", "--out", tmp_path / "s.zarr",
       "--no-progress")
    shutil.rmtree(tmp_path / "g.zarr")
    res = invoke("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--heldout-rows", "60:100")
    one_line_error(res, "--heldout-rows needs a gradient store", "--gradients")


def test_decay_of_an_older_spectrum_with_zeroed_directions(run, tmp_path):
    """Older pca runs stored unresolved directions as zero columns: decay uses the nonzero ones."""
    shutil.copytree(run["first60"], tmp_path / "s.zarr")
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")
    g["sigma"][15:] = 0.0
    g["V"][:, 15:] = 0.0
    update_attrs(g, {}, remove=(MANIFEST_KEY,))  # they kept no chunk manifest either
    ok("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--heldout-rows", "60:100",
       "--no-plots")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert len(report["spectrum"]["sigma"]) == 15
    assert report["rows"]["heldout"]["G_k"]["ks"][-1] == 15
    assert any("only the first 15 have sigma > 0" in n for n in report["notes"])


def test_decay_summary_says_what_its_numbers_rest_on(run, tmp_path):
    """Before: in-sample bounds and bounds outside the theorems' hypotheses read like the rest."""
    res = ok("decay", run["first60"], "--out", tmp_path / "d", "--no-plots", "--heldout-rows",
             "60:100", "--n", 500, "--epsilon", 2, "--delta", 0.9, "--diameter", 1)
    lines = {ln.split(":")[0]: ln for ln in res.output.splitlines()}
    assert "[in-sample G_k: optimistic]" in lines["bound_collected_empirical"]
    assert "[in-sample G_k: optimistic]" not in lines["bound_heldout_empirical"]
    assert "hypotheses not met: delta_in_(0,1/2]" in lines["bound_heldout_empirical"]


def test_decay_of_a_parameter_subset_says_so(run, tmp_path):
    ok("pca", run["grads"], "--k", 10, "--rows", "0:60", "--params", "enc.*", "--out",
       tmp_path / "s.zarr", "--no-progress")
    ok("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--heldout-rows", "60:100",
       "--no-plots")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert any("covers 90 of the 100 columns" in n for n in report["notes"])
    v = SpectrumStore.open(tmp_path / "s.zarr").read_v().astype(np.float64)
    got, ks = heldout_G(report)
    np.testing.assert_allclose(got, dense_G(run["H"][60:, :90], v, ks), rtol=1e-4)


def test_decay_finds_the_source_by_its_resolved_path(run, tmp_path, monkeypatch):
    """Before: a relative source path was opened from the current directory, whatever was there."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copytree(run["grads"], tmp_path / "a" / "g.zarr")
    make_store(tmp_path / "b" / "g.zarr", power_rows(R, 100, seed=3), seed=3)
    monkeypatch.chdir(tmp_path / "a")
    ok("pca", "g.zarr", "--k", 10, "--rows", "0:60", "--out", tmp_path / "s.zarr", "--no-progress")
    monkeypatch.chdir(tmp_path / "b")
    ok("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--no-plots")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["rows"]["collected"]["G_k"]["max"][0] == pytest.approx(
        np.linalg.norm(run["H"][:60], axis=1).max(), rel=1e-6)


def test_decay_out_must_not_be_a_store(run, tmp_path):
    shutil.copytree(run["first60"], tmp_path / "s.zarr")
    res = invoke("decay", tmp_path / "s.zarr", "--out", tmp_path / "s.zarr", "--spectrum-only")
    one_line_error(res, "is a Zarr store")
    assert not (tmp_path / "s.zarr" / "report.json").exists()


def test_plot_of_an_older_spectrum_with_zeroed_directions(run, tmp_path):
    shutil.copytree(run["first60"], tmp_path / "s.zarr")
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="r+")
    g["sigma"][15:] = 0.0
    update_attrs(g, {}, remove=(MANIFEST_KEY,))  # it kept no chunk manifest either
    ok("plot", tmp_path / "s.zarr", "--out", tmp_path / "f", "--format", "png")
