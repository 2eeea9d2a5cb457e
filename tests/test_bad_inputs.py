"""Bad inputs, one table (issue 13 §4): inputs that were accepted, ran, and gave a plausible
wrong number (or a traceback) — for every command and public function.

Each row is ``(id, input, expected)``: a CLI command through typer's CliRunner (exit code and
a regex of its one ``error: ...`` line, which must say what to do), a library call (exception
type and a regex of its one-line message), or a documented behaviour (a check of what it
returns). ``docs/bad-inputs.md`` lists the rows by command. Rows marked xfail are bugs in
files this table does not fix; each says where.

Everything is tiny: gradient stores of at most 100 rows × 100 columns written with
gradspec's API, one spectrum computed once per module, the lowrank task for training.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from typer.testing import CliRunner

import gradspec as gs
from cli.main import app
from gradspec.spectrum import project_rows
from gradspec.store import META_FIELDS, GradientStore, ParamLayout

torch.set_num_threads(1)
runner = CliRunner()

SHAPES = [("enc.weight", (8, 10)), ("enc.bias", (10,)), ("head.weight", (2, 5))]  # p = 100
LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=20", "-t", "r=3", "--batch-size", "20",
           "--optimizer", "sgd", "--no-progress"]
RETRAIN = ["retrain", "--out", "{new}", "--task", "lowrank", "-t", "n=200", "-t", "d=20", "-t", "r=3",
           "--batch-size", "20", "--steps", "3", "--no-progress", "--no-train-metrics", "--no-plot"]
ACCOUNT = ["account", "--q", "0.01", "--steps", "10"]
BOUND = ["--n", "500", "--epsilon", "1", "--delta", "1e-3", "--diameter", "1"]


# ---------------------------------------------------------------------------- fixtures
def power_rows(r: int, p: int, seed: int = 0, rank: int | None = None) -> np.ndarray:
    """r × p rows with singular values 10·k^-0.8 (rank ``rank``, default full)."""
    rng = np.random.default_rng(seed)
    n = min(r, p) if rank is None else rank
    u, _ = np.linalg.qr(rng.standard_normal((r, n)))
    v, _ = np.linalg.qr(rng.standard_normal((p, n)))
    return ((u * (10.0 * np.arange(1, n + 1) ** -0.8)) @ v.T).astype(np.float32)


def make_store(path: Path, h: np.ndarray, shapes=SHAPES, config: dict | None = None) -> GradientStore:
    store = GradientStore.create(path, layout=ParamLayout.from_shapes(shapes), config=config,
                                 rows_per_chunk=8, cols_per_chunk=32)
    meta = {name: np.zeros(h.shape[0], dtype=dt) for name, dt in META_FIELDS.items()}
    meta["step"] = np.arange(h.shape[0])
    store.append(h, meta)
    store.set_status("complete")
    return store


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, Any]:
    """Every input the table refers to, built once: paths by name, plus a few arrays."""
    tmp = tmp_path_factory.mktemp("bad")
    run = {"n_train": 500, "steps": 100, "seed": 0, "final_epsilon": 3.0, "delta": 1e-3}
    make_store(tmp / "grads.zarr", power_rows(100, 100), config=run)
    gs.pca(source=str(tmp / "grads.zarr"), k=20, rows=slice(0, 60), out=tmp / "spec.zarr")
    make_store(tmp / "rank5.zarr", power_rows(20, 100, seed=1, rank=5))
    make_store(tmp / "zeros.zarr", np.zeros((10, 100), np.float32))
    nan = power_rows(10, 100, seed=2)
    nan[4, 7] = np.nan
    make_store(tmp / "nan.zarr", nan)
    make_store(tmp / "other.zarr", power_rows(30, 100, seed=3), [("a", (80,)), ("b", (20,))])
    damaged = make_store(tmp / "damaged.zarr", power_rows(20, 100, seed=4))
    chunk = next(p for p in sorted((Path(damaged.path) / "grads" / "c").rglob("*")) if p.is_file())
    chunk.unlink()
    flipped = make_store(tmp / "flipped.zarr", power_rows(20, 100, seed=5))
    first = Path(flipped.path) / "grads" / "c" / "0" / "0"
    first.write_bytes(bytes(b ^ (i == 40) for i, b in enumerate(first.read_bytes())))  # one bit of row 0
    res = invoke("decay", tmp / "spec.zarr", "--out", tmp / "decay", "--no-plots")
    assert res.exit_code == 0, res.output
    report = json.loads((tmp / "decay" / "report.json").read_text())
    (tmp / "future.json").write_text(json.dumps({**report, "format": "gradspec.decay-report/99"}))
    (tmp / "plain.json").write_text(json.dumps({"epsilon": 3.0}))
    (tmp / "lines.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (tmp / "file.txt").write_text("not a directory")
    (tmp / "notes").mkdir()
    (tmp / "notes" / "todo.txt").write_text("mine")
    zarr.create_array(str(tmp / "array.zarr"), shape=(3,), dtype="f4")
    (tmp / "corrupt.zarr").mkdir()
    (tmp / "corrupt.zarr" / "zarr.json").write_text("{not json")
    paths = {p.name.split(".")[0]: p for p in tmp.iterdir()}
    rng = np.random.default_rng(0)
    h = rng.standard_normal((30, 100))
    v = np.linalg.svd(h, full_matrices=False)[2].T[:, :10]
    return {**{k: str(v) for k, v in paths.items()}, "tmp": tmp, "H": h, "V": v}


def invoke(*args: Any):
    return runner.invoke(app, [str(a) for a in args])


# ---------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Row:
    """One bad input.

    ``cli``: argv of a command (``{name}`` placeholders: the fixture's paths, ``{new}`` a path
    that does not exist yet). ``call``: a library call ``fx -> value``. ``error``: regex of the
    one-line message (with ``code`` the CLI exit code, or ``exc`` the exception type);
    ``check``: the documented behaviour instead (``check(result, fx)`` asserts it).
    """

    id: str
    cli: list[str] | None = None
    call: Callable[[dict], Any] | None = None
    error: str | None = None
    code: int = 2
    exc: type[BaseException] = ValueError
    check: Callable[[Any, dict], None] | None = None
    xfail: str | None = None
    marks: tuple = field(default_factory=tuple)


def cli(id: str, argv: list[str], error: str | None = None, *, code: int = 2,
        check: Callable | None = None, xfail: str | None = None) -> Row:
    return Row(id, cli=argv, error=error, code=code, check=check, xfail=xfail)


def lib(id: str, call: Callable[[dict], Any], error: str | None = None, *,
        exc: type[BaseException] = ValueError, check: Callable | None = None,
        xfail: str | None = None) -> Row:
    return Row(id, call=call, error=error, exc=exc, check=check, xfail=xfail)


def _ok(*fragments: str) -> Callable[[Any, dict], None]:
    """A CLI row that must exit 0 and print every fragment."""

    def check(res, fx):
        assert res.exit_code == 0, res.output
        for f in fragments:
            assert f in res.output, res.output
    return check


def _report(res, fx) -> dict:
    assert res.exit_code == 0, res.output
    return json.loads((Path(fx["new"]) / "report.json").read_text())


K = np.arange(1, 21)
Y = 2.0 * K**-0.8
G_KS, G = np.array([0, 1, 2, 4, 8]), np.array([1.0, 0.5, 0.3, 0.2, 0.1])
PRIV = {"n": 1000, "epsilon": 1.0, "delta": 1e-5, "diameter": 1.0}


def _bound(**kw):
    return gs.restricted_lipschitz_bound(**{"ks": G_KS, "G": G, "dim": 100, **PRIV, **kw})


def _proj(fx, blocks=None, basis=None, **kw):
    return project_rows(blocks if blocks is not None else [(0, fx["H"])],
                        fx["V"] if basis is None else basis, **kw)


def _calibrated(target):
    run = {"sample_rate": 0.01, "steps": 100, "delta": 1e-5, "method": "rdp"}
    sigma = gs.calibrate_noise_multiplier(target_epsilon=target, **run)
    return target, gs.compute_epsilon(noise_multiplier=sigma, **run)


def _pe(kind: str):
    from torch import nn

    torch.manual_seed(0)
    batch = {"x": torch.randn(5, 4), "y": torch.tensor([0, 1, 2, 0, 1])}

    def ce(out, b):
        return nn.functional.cross_entropy(out, b["y"], reduction="none")

    if kind == "mean-loss":
        pe = gs.PerExampleGradients(nn.Sequential(nn.Linear(4, 3)), lambda c, b: c(b["x"]),
                                    lambda out, b: ce(out, b).mean(), ["0.weight"])
        return pe(batch)
    if kind == "batchnorm":
        model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
        return gs.PerExampleGradients(model, lambda c, b: c(b["x"]), ce, ["2.weight"],
                                      backend="hooks", train_mode=True)

    def coupled(call, b):  # right shapes and sum, but every row depends on the whole batch
        out = call(b["x"])
        return out - 0.5 * out.mean(0, keepdim=True)

    pe = gs.PerExampleGradients(nn.Sequential(nn.Linear(4, 3)), coupled, ce, ["0.weight"],
                                backend="hooks")
    return pe(batch)


ROWS: list[Row] = [
    # -------------------------------------------------------------- account
    cli("account-q-above-1", ["account", "--noise-multiplier", "1", "--q", "1.5", "--steps", "10", "--delta", "1e-5"],
        r"--q must be in \(0, 1\], got 1\.5"),
    cli("account-delta-1", [*ACCOUNT, "--noise-multiplier", "1", "--delta", "1"], r"delta must be in \(0, 1\), e\.g\. n \*\* -1\.1"),
    cli("account-steps-0", ["account", "--noise-multiplier", "1", "--q", "0.01", "--steps", "0", "--delta", "1e-5"],
        r"steps must be >= 1, got 0"),
    cli("account-sigma-negative", [*ACCOUNT, "--noise-multiplier", "-1", "--delta", "1e-5"],
        r"noise_multiplier must be finite and >= 0 \(0 = non-private\)"),
    cli("account-epochs-nan", ["account", "--noise-multiplier", "1", "--q", "0.01", "--epochs", "nan", "--delta", "1e-5"],
        r"--epochs must be > 0, got nan"),
    cli("account-method-typo", [*ACCOUNT, "--noise-multiplier", "1", "--delta", "1e-5", "--method", "pldd"],
        r"unknown accounting method 'pldd'; choose one of: pld, rdp, rdp-classic"),
    cli("account-sigma-and-epsilon", [*ACCOUNT, "--noise-multiplier", "1", "--epsilon", "1", "--delta", "1e-5"],
        r"give exactly one of --noise-multiplier .* or --epsilon"),
    cli("account-epsilon-unreachable-large", [*ACCOUNT, "--epsilon", "1e9", "--delta", "1e-5"],
        r"target_epsilon=1e\+09 is met even with noise_multiplier < 0\.01; .* lower it"),
    cli("account-epsilon-unreachable-small", ["account", "--epsilon", "0.01", "--q", "1", "--steps", "10000000",
                                              "--delta", "1e-5", "--method", "rdp"],
        r"needs noise_multiplier > 1e\+06; raise the target, or lower the sample rate"),
    cli("account-epsilon-steps-beyond-pld", ["account", "--epsilon", "1", "--q", "0.01", "--steps", "1000000000",
                                            "--delta", "1e-5"],
        r"^error: calibrating the noise multiplier for epsilon = 1 by PLD over 1,000,000,000 steps needs more "
        r"than the 16,777,216 loss points PLD allows; use method 'rdp' \(--method rdp\)"),
    cli("account-delta-above-1-over-n", [*ACCOUNT, "--noise-multiplier", "1", "--n", "100", "--delta", "0.5"],
        r"--delta 0\.5 is not below 1/n = 0\.01 \(n = 100\).* give a smaller --delta"),
    cli("account-sigma-tiny", [*ACCOUNT, "--noise-multiplier", "0.001", "--delta", "1e-5"],
        r"noise_multiplier=0\.001 is below 0\.01: .* use noise_multiplier=0 for a non-private run"),
    cli("account-sigma-tiny-rdp", [*ACCOUNT, "--noise-multiplier", "1e-300", "--delta", "1e-5", "--method", "rdp"],
        r"noise_multiplier=1e-300 is below 0\.01"),
    cli("account-sigma-huge", [*ACCOUNT, "--noise-multiplier", "1e300", "--delta", "1e-5"],
        r"noise_multiplier=1e\+300 is too large for the accountant to evaluate"),
    cli("account-sigma-0-is-non-private", [*ACCOUNT, "--noise-multiplier", "0", "--delta", "1e-5"],
        check=_ok("epsilon           inf")),
    lib("compute-epsilon-accountant-typo",
        lambda fx: gs.compute_epsilon(noise_multiplier=1, sample_rate=0.01, steps=10, delta=1e-5, method="rpd"),
        r"unknown accounting method 'rpd'; choose one of: pld, rdp, rdp-classic"),
    lib("compute-epsilon-steps-float",
        lambda fx: gs.compute_epsilon(noise_multiplier=1, sample_rate=0.01, steps=10.0, delta=1e-5),
        r"steps must be an integer, got 10\.0", exc=TypeError),
    lib("calibrate-small-target-is-tight", lambda fx: _calibrated(0.002),
        check=lambda r, fx: (r[0] * (1 - 1e-3) <= r[1] <= r[0]) or pytest.fail(f"epsilon {r[1]} for target {r[0]}")),
    lib("default-delta-n-1", lambda fx: gs.default_delta(1), r"n \(the training-set size\) must be >= 2"),
    lib("compute-epsilon-pld-tiny-delta",
        lambda fx: gs.compute_epsilon(noise_multiplier=1, sample_rate=0.01, steps=10, delta=1e-15),
        check=lambda eps, fx: math.isfinite(eps) or pytest.fail(f"epsilon {eps}")),
    # -------------------------------------------------------------- collect
    cli("collect-out-is-a-file", ["collect", "--out", "{file}", "--steps", "3", *LOWRANK],
        r"is a file, not a directory: choose a directory"),
    cli("collect-resume-and-overwrite", ["collect", "--out", "{new}", "--resume", "--overwrite"],
        r"give one of them"),
    cli("collect-resume-nothing", ["collect", "--out", "{new}", "--resume"], r"no run to resume"),
    cli("collect-overwrite-foreign-dir", ["collect", "--out", "{notes}", "--overwrite", "--steps", "3", *LOWRANK],
        r"not a gradspec run directory"),
    cli("collect-larger-epsilon-without-resume",
        ["collect", "--out", "{new}", "--steps", "3", "--allow-larger-epsilon", *LOWRANK], r"applies to --resume"),
    cli("collect-stop-after-0", ["collect", "--out", "{new}", "--stop-after", "0", *LOWRANK],
        r"--stop-after must be >= 1"),
    cli("collect-delta-above-1-over-n", ["collect", "--out", "{new}", "--steps", "3", "--delta", "0.5", *LOWRANK],
        r"delta = 0\.5 is not below 1/n = 0\.005 .* give a smaller --delta"),
    cli("collect-every-covers-run", ["collect", "--out", "{new}", "--steps", "4", "--every", "4", *LOWRANK],
        r"stores step 0 only"),
    cli("collect-compressor-typo", ["collect", "--out", "{new}", "--steps", "3", "--compressor", "lz4", *LOWRANK],
        r"unknown compressor 'lz4'; choose none, zstd or blosc"),
    cli("collect-no-clip-private", ["collect", "--out", "{new}", "--steps", "3", "--no-clip", *LOWRANK],
        r"private training needs clipping: drop --no-clip or set --noise-multiplier 0"),
    cli("collect-epsilon-nan", ["collect", "--out", "{new}", "--steps", "3", "--epsilon", "nan", *LOWRANK],
        r"target epsilon must be a finite number, got nan"),
    cli("collect-task-option-typo", ["collect", "--out", "{new}", "--steps", "3", *LOWRANK, "-t", "bogus=1"],
        r"unknown option\(s\) \['bogus'\] for task 'lowrank'; valid options are"),
    cli("collect-task-option-twice", ["collect", "--out", "{new}", "--steps", "3", *LOWRANK, "-t", "r=5"],
        r"task option 'r' is given twice \(-t r=3, -t r=5\); give it once"),
    cli("collect-sigma-nan", ["collect", "--out", "{new}", "--steps", "3", "--noise-multiplier", "nan", *LOWRANK],
        r"noise multiplier.*finite"),
    cli("collect-epochs-inf", ["collect", "--out", "{new}", "--epochs", "inf", *LOWRANK],
        r"epochs must be .*finite"),
    cli("collect-lr-nan", ["collect", "--out", "{new}", "--steps", "3", "--lr", "nan", *LOWRANK],
        r"learning rate must be .*finite"),
    lib("task-option-not-a-number", lambda fx: gs.make_task("lowrank", n="abc", d=5, r=2),
        r"\bn\b.*integer"),
    lib("task-name-typo", lambda fx: gs.make_task("lowrnk"),
        r"unknown task 'lowrnk'; choose one of \['ballglm', 'bow', 'cnn', 'geomedian', 'lowrank', 'sparselinear', 'text'\]"),
    lib("per-example-batch-mean-loss", lambda fx: _pe("mean-loss"), r"one value per example.*reduction='none'"),
    lib("per-example-batchnorm-train-mode", lambda fx: _pe("batchnorm"),
        r"BatchNorm1d layer '1'.*train_mode=False"),
    lib("per-example-rows-coupled", lambda fx: _pe("coupled"), r"'0\.weight'.*differ from each example.*vmap"),
    # -------------------------------------------------------------- info and stores
    cli("info-missing", ["info", "{tmp}/nowhere"], r"no gradspec store"),
    cli("info-plain-dir", ["info", "{notes}"], r"not a gradspec store \(no zarr\.json\)"),
    cli("info-damaged-chunk", ["info", "{damaged}"], code=1,
        check=lambda res, fx: (res.exit_code == 1 and "DAMAGED" in res.output) or pytest.fail(res.output)),
    cli("info-verify-flipped-byte", ["info", "{flipped}", "--verify", "--no-progress"], code=1,
        check=lambda res, fx: (res.exit_code == 1 and "grads/c/0/0  rows 0..7  corrupt: its bytes do not "
                               "match their crc32c checksum" in res.output) or pytest.fail(res.output)),
    cli("pca-flipped-byte", ["pca", "{flipped}", "-k", "2", "--out", "{new}", "--no-progress"],
        r"chunk grads/c/0/0, holding committed rows 0\.\.7 of 20, is corrupt: .*crc32c.*restore the file"),
    cli("info-zarr-array", ["info", "{array}"], r"not a gradspec store"),
    cli("info-corrupt-zarr-json", ["info", "{corrupt}"], r"zarr\.json"),
    lib("store-float16-overflow", lambda fx: _append_f16(fx),
        r"exceed float16's largest value \(65504\) .* --dtype bfloat16 or float32"),
    lib("store-status-typo", lambda fx: GradientStore.open(fx["grads"], mode="r+").set_status("done"),
        r"unknown store status 'done'; choose one of writing, complete"),
    lib("store-reversed-slice-is-empty", lambda fx: GradientStore.open(fx["grads"]).read(rows=slice(20, 10)),
        r"the row selection 20:10 selects no rows of the \d+ committed rows"),
    lib("store-rows-beyond-committed", lambda fx: GradientStore.open(fx["grads"]).read(rows=slice(0, 10**6)),
        r"the row selection 0:1000000 lies outside the \d+ committed rows"),
    lib("store-rows-repeated", lambda fx: GradientStore.open(fx["grads"]).row_meta([1, 1]),
        r"repeats row index 1 .* pass each row once"),
    # -------------------------------------------------------------- pca
    cli("pca-rows-beyond-store", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--rows", "50:200"],
        r"--rows 50:200 lies outside the 100 committed rows"),
    cli("pca-k-above-rank", ["pca", "{rank5}", "--k", "10", "--out", "{new}", "--no-progress"],
        check=_ok("kept k=5 of --k 10")),
    cli("pca-zero-matrix", ["pca", "{zeros}", "--k", "3", "--out", "{new}"], r"H is zero"),
    cli("pca-nan-rows", ["pca", "{nan}", "--k", "3", "--out", "{new}"],
        r"H has NaN or inf in 1 selected row\(s\), e\.g\. row 4 .* exclude them with --rows"),
    cli("pca-gram-iters", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--method", "gram", "--iters", "3"],
        r"method gram \(as requested\) does not use --iters"),
    cli("pca-krylov-tol", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--method", "krylov", "--tol", "1e-6"],
        r"method krylov \(as requested\) does not use --tol"),
    cli("pca-krylov-depth-0", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--method", "krylov", "--iters", "0"],
        r"--iters must be >= 1 \(an integer\), got 0"),
    cli("pca-orthogonal-tol-negative", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--method", "orthogonal",
                                        "--tol", "-1"], r"--tol must be a finite number >= 0, got -1"),
    cli("pca-oversample-negative", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--method", "orthogonal",
                                    "--oversample", "-1"], r"--oversample must be an integer >= 0, got -1"),
    cli("pca-memory-0", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--memory", "0"],
        r"--memory must be a positive size such as 4G, got '0'"),
    cli("pca-memory-too-small", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--memory", "100K"],
        r"needs 18\.8 MiB, over the memory budget for blocks in flight, 50\.0 KiB \(pca gives them half of --memory\)"),
    cli("pca-seed-negative", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--method", "orthogonal",
                              "--seed", "-1"], r"--seed must be an integer >= 0, got -1"),
    cli("pca-scheduler-tf32", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--scheduler", "tcp://nowhere:1",
                               "--precision", "tf32"], r"precision 'tf32' needs a CUDA device"),
    cli("pca-out-exists", ["pca", "{grads}", "--k", "5", "--out", "{spec}"], r"--overwrite"),
    cli("pca-overwrite-input", ["pca", "{grads}", "--k", "5", "--out", "{grads}", "--overwrite"],
        r"is or contains the gradient store being read .* choose another --out"),
    cli("pca-resume-complete", ["pca", "{grads}", "--k", "20", "--rows", "0:60", "--out", "{spec}", "--resume"],
        r"already complete; nothing to resume \(use --overwrite to redo it\)"),
    cli("pca-unconverged-warns", ["pca", "{grads}", "--k", "5", "--out", "{new}", "--method", "orthogonal",
                                  "--oversample", "0", "--no-progress"],
        check=_ok("warning: max residual", "have not converged", "raise --iters")),
    lib("pca-col-ranges-overlap", lambda fx: gs.pca(source=fx["H"], k=3, col_ranges=[(0, 30), (10, 40)]),
        r"column ranges \(0, 30\) and \(10, 40\) overlap: columns 10\.\.29 would count twice"),
    lib("pca-rows-repeated", lambda fx: gs.pca(source=fx["H"], k=3, rows=np.array([0, 0, 1, 2, 3])),
        r"--rows repeats row index 0 .* pass each row once"),
    lib("pca-rows-boolean-mask", lambda fx: gs.pca(source=fx["H"], k=3, rows=np.ones(30, bool)),
        r"--rows got a boolean mask; pass row indices \(numpy\.flatnonzero\(mask\)\)"),
    lib("pca-k-bool", lambda fx: gs.pca(source=fx["H"], k=True), r"k must be a positive integer, got True"),
    lib("pca-v-dtype-int", lambda fx: gs.pca(source=fx["H"], k=3, v_dtype="int32"),
        r"v_dtype must be float32 or float64, got 'int32'"),
    lib("krylov-pca-depth-0", lambda fx: gs.krylov_pca(gs.GradientOperator(fx["H"]), k=3, iters=0),
        r"iters must be >= 1 \(the Krylov depth\), got 0"),
    # -------------------------------------------------------------- decay
    cli("decay-epsilon-nan", ["decay", "{spec}", "--out", "{new}", "--no-plots", *BOUND[:2], "--epsilon", "nan",
                              *BOUND[4:]], r"epsilon must be a finite number, got nan"),
    cli("decay-epsilon-inf", ["decay", "{spec}", "--out", "{new}", "--no-plots", *BOUND[:2], "--epsilon", "inf",
                              *BOUND[4:]], r"epsilon must be a finite number, got inf"),
    cli("decay-diameter-inf", ["decay", "{spec}", "--out", "{new}", "--no-plots", *BOUND[:6], "--diameter", "inf"],
        r"diameter D must be a finite number, got inf"),
    cli("decay-bounds-partial", ["decay", "{spec}", "--out", "{new}", "--epsilon", "1"],
        r"the bounds need all of --n, --epsilon, --delta and --diameter"),
    cli("decay-bandwidth-inf", ["decay", "{spec}", "--out", "{new}", "--no-plots", "--bandwidth", "inf"],
        r"bandwidth must be scott, silverman or a finite number > 0, got inf"),
    cli("decay-format-before-analysis", ["decay", "{spec}", "--out", "{new}", "--format", "jpg"],
        r"unknown format\(s\) \['jpg'\]; choose png, pdf or svg",
),
    cli("decay-fit-range-one-point", ["decay", "{spec}", "--out", "{new}", "--fit-range", "5:5"],
        r"--fit-range 5:5 is outside .* choose A:B with 1 <= A < B <= 20"),
    cli("decay-fit-range-two-points", ["decay", "{spec}", "--out", "{new}", "--fit-range", "4:5"],
        r"a power-law fit needs at least 3 positive values"),
    cli("decay-fit-range-beyond-k", ["decay", "{spec}", "--out", "{new}", "--fit-range", "1:50"],
        r"--fit-range 1:50 is outside the 20 singular values"),
    cli("decay-k-max-beyond-k", ["decay", "{spec}", "--out", "{new}", "--k-max", "50"],
        r"--k-max 50 is outside the 20 directions the spectrum stores; choose 1\.\.20"),
    cli("decay-dim-below-p", ["decay", "{spec}", "--out", "{new}", *BOUND, "--dim", "50"],
        r"--dim 50 is below p = 100"),
    cli("decay-n-differs-from-run", ["decay", "{spec}", "--out", "{new}", "--n", "400", *BOUND[2:]],
        r"--n 400 differs from the 500 training examples .* pass --n 500"),
    cli("decay-heldout-beyond-store", ["decay", "{spec}", "--out", "{new}", "--heldout-rows", "90:200"],
        r"--heldout-rows 90:200 lies outside the 100 committed rows"),
    cli("decay-heldout-overlaps-spectrum", ["decay", "{spec}", "--out", "{new}", "--heldout-rows", "50:70"],
        r"--heldout-rows 50:70 overlap the rows 0:60 the spectrum was computed from"),
    cli("decay-gradients-other-layout", ["decay", "{spec}", "--out", "{new}", "--gradients", "{other}"],
        r"has no parameter 'enc\.weight'"),
    cli("decay-spectrum-only-with-gradients", ["decay", "{spec}", "--out", "{new}", "--spectrum-only",
                                               "--gradients", "{grads}"],
        r"--spectrum-only reads no gradients; drop --gradients"),
    cli("decay-out-is-zarr", ["decay", "{spec}", "--out", "{grads}"], r"is a Zarr store; choose a directory"),
    cli("decay-out-inside-a-store", ["decay", "{spec}", "--out", "{spec}/decay", "--no-plots"],
        r"--out '.*spec\.zarr/decay' lies inside the Zarr store '.*spec\.zarr'; choose a directory outside it"),
    cli("decay-tail-typo", ["decay", "{spec}", "--out", "{new}", "--tail", "fitt"],
        r"unknown --tail 'fitt'; choose one of: hold, fit, zero"),
    cli("decay-delta-above-half-flagged", ["decay", "{spec}", "--out", "{new}", "--no-plots", *BOUND[:4],
                                           "--delta", "0.9", *BOUND[6:]],
        check=lambda res, fx: ("hypotheses not met: delta_in_(0,1/2]" in res.output
                               and not _report(res, fx)["rows"]["collected"]["bounds"]["empirical"]
                               ["hypotheses"]["delta_in_(0,1/2]"]) or pytest.fail(res.output)),
    cli("decay-k-max-2-no-G-fit", ["decay", "{spec}", "--out", "{new}", "--no-plots", "--k-max", "2"],
        check=lambda res, fx: (_report(res, fx)["rows"]["collected"]["G_k_decay"] is None
                               and "no G_k fit" in res.output) or pytest.fail(res.output)),
    cli("decay-dim-above-p-what-if", ["decay", "{spec}", "--out", "{new}", "--no-plots", *BOUND, "--dim", "100000"],
        check=lambda res, fx: (_report(res, fx)["rows"]["collected"]["bounds"]["empirical"]["settings"]["dim"]
                               == 100000) or pytest.fail(res.output)),
    lib("decay-heldout-rows-repeated",
        lambda fx: gs.decay_analysis(spectrum=fx["spec"], heldout_rows=np.array([70, 70, 71])),
        r"--heldout-rows repeats row index 70 .*count twice .* pass each row once"),
    # -------------------------------------------------------------- plot
    cli("plot-json-not-a-report", ["plot", "{plain}", "--out", "{new}"],
        r"is not a report\.json of `gradspec decay`; .* \(no format field"),
    cli("plot-report-future-format", ["plot", "{future}", "--out", "{new}"],
        r"\(format 'gradspec\.decay-report/99'; this gradspec reads 'gradspec\.decay-report/1'\)"),
    cli("plot-jsonl", ["plot", "{lines}", "--out", "{new}"], r"is not a report\.json .* \(it is not JSON\)"),
    cli("plot-gradient-store", ["plot", "{grads}", "--out", "{new}"], r"is a gradients store, not a spectrum store"),
    cli("plot-out-inside-a-store", ["plot", "{spec}", "--out", "{grads}/figures"],
        r"lies inside the Zarr store '.*grads\.zarr'; choose a directory outside it"),
    cli("plot-labels-count", ["plot", "{decay}", "{spec}", "--out", "{new}", "--label", "a"],
        r"got 1 --label for 2 inputs; give one per input or none"),
    cli("plot-same-names", ["plot", "{decay}", "{decay}", "--out", "{new}"],
        r"labels must differ, got \['decay', 'decay'\]; pass --label for each input"),
    # -------------------------------------------------------------- retrain
    cli("retrain-epsilon-unreachable", [*RETRAIN, "-a", "dp-sgd", "--epsilon", "1e9"],
        r"target_epsilon=1e\+09 is met even with noise_multiplier < 0\.01"),
    cli("retrain-option-ignored", [*RETRAIN, "-a", "dp-sgd", "--projector", "random"],
        r"--projector applies to .* not to dp-sgd: it would be ignored"),
    cli("retrain-ranks-ignored", [*RETRAIN, "--sweep", "-a", "dp-sgd", "--ranks", "2,3"],
        r"--ranks applies to .* not to dp-sgd: it would be ignored"),
    cli("retrain-sweep-seed-twice", [*RETRAIN, "--sweep", "-a", "dp-sgd", "--seeds", "0,0"],
        r"seeds lists 0 twice; give each value once"),
    cli("retrain-sweep-sigma-twice", [*RETRAIN, "--sweep", "-a", "dp-sgd", "--noise-multipliers", "1,1.0"],
        r"noise_multipliers lists 1\.0 twice; give each value once"),
    cli("retrain-sweep-only-option", [*RETRAIN, "-a", "dp-sgd", "--seeds", "1,2"], r"--seeds is for --sweep"),
    cli("retrain-sigma-and-epsilon", [*RETRAIN, "-a", "dp-sgd", "--noise-multiplier", "1", "--epsilon", "1"],
        r"give --noise-multiplier or --epsilon, not both"),
    cli("retrain-no-public-split", [*RETRAIN, "-a", "pdp-sgd", "--rank", "2", "-t", "n_public=0"],
        r"has no public split .* -t n_public=M"),
    cli("retrain-public-size-above-split", [*RETRAIN, "-a", "adadps", "--public-size", "500"],
        r"public set size m=500 must be in \[1, 100\]"),
    cli("retrain-projector-other-p", [*RETRAIN, "-a", "subspace", "--rank", "2", "--projector", "{spec}"],
        r"the basis has 100 rows but the run trains 20 parameters"),
    cli("retrain-rank-above-p", [*RETRAIN, "-a", "subspace", "--rank", "500", "--projector", "random"],
        r"rank k=500 exceeds the 20 trained parameters"),
    cli("retrain-complement-all-dimensions", [*RETRAIN, "-a", "complement", "--rank", "20", "--projector", "random"],
        r"-a complement with k = 20 removes all 20 trained dimensions: .*noise alone; choose k < 20"),
    lib("retrain-noise-seed-repeats-gradient-noise",
        lambda fx: gs.retrain(config=gs.CollectConfig(task="lowrank", steps=2), algorithm="noisy-adagrad",
                              options={"noise_seed": 2}, out=Path(fx["new"])),
        r"noise_seed=2 is the seed of the gradient noise \(run seed \+ 2\)"),
    lib("algorithm-option-typo", lambda fx: gs.make_algorithm("dp-sgd", rnk=5),
        r"unknown option\(s\) \['rnk'\] for algorithm 'dp-sgd'"),
    # -------------------------------------------------------------- spectrum functions
    lib("fit-power-law-nan", lambda fx: gs.fit_power_law(K, np.where(K == 5, np.nan, Y)),
        r"y holds 1 NaN/inf value\(s\), first at k = 5"),
    lib("fit-power-law-inf-k", lambda fx: gs.fit_power_law(np.r_[K[:-1], np.inf], Y), r"k holds NaN or inf"),
    lib("fit-power-law-2d", lambda fx: gs.fit_power_law(K, np.c_[Y, Y]), r"y must be 1-D, got shape \(20, 2\)"),
    lib("fit-power-law-all-negative", lambda fx: gs.fit_power_law(K, -Y),
        r"needs at least 3 positive values .* \(20 non-positive left out\)"),
    lib("fit-power-law-zeros-dropped", lambda fx: gs.fit_power_law(K, np.where(K > 10, 0.0, Y)),
        check=lambda f, fx: (f.n_dropped == 10 and abs(f.c - 0.8) < 1e-9) or pytest.fail(str(f))),
    lib("fit-power-law-increasing", lambda fx: gs.fit_power_law(K, K**0.5),
        check=lambda f, fx: abs(f.c + 0.5) < 1e-9 or pytest.fail(str(f))),
    lib("fit-spectrum-unsorted", lambda fx: gs.fit_spectrum(Y[::-1]),
        r"sigma must be sorted in decreasing order \(rank 1 first\)"),
    lib("fit-spectrum-2d", lambda fx: gs.fit_spectrum(np.c_[Y, Y]), r"sigma must be 1-D, got shape \(20, 2\)"),
    lib("fit-spectrum-nan", lambda fx: gs.fit_spectrum(np.where(K == 3, np.nan, Y)), r"sigma holds NaN or inf"),
    lib("explained-variance-unsorted", lambda fx: gs.explained_variance(Y[::-1]),
        r"sigma must be sorted in decreasing order"),
    lib("explained-variance-nan", lambda fx: gs.explained_variance(np.r_[Y, np.nan]),
        r"sigma must hold finite singular values >= 0"),
    lib("explained-variance-total-inf", lambda fx: gs.explained_variance(Y, total_energy=math.inf),
        r"the total energy ‖H‖_F² must be finite and > 0, got inf"),
    lib("explained-variance-total-too-small", lambda fx: gs.explained_variance(Y, total_energy=1.0),
        r"exceeds the total energy 1; wrong ‖H‖_F²\?"),
    lib("spectral-density-bandwidth-inf", lambda fx: gs.spectral_density(Y, bandwidth=math.inf),
        r"bandwidth must be scott, silverman or a finite number > 0, got inf"),
    lib("spectral-density-grid-1", lambda fx: gs.spectral_density(Y, grid_size=1),
        r"grid_size must be an integer >= 2, got 1"),
    lib("bound-dim-below-measured-rank", lambda fx: _bound(dim=4),
        r"dim = 4 is below the largest measured rank 8"),
    lib("bound-G-negative", lambda fx: _bound(G=-G), r"G must hold finite values >= 0"),
    lib("bound-G-rising", lambda fx: _bound(G=G[::-1]),
        r"G rises from G_0 = 0\.1 to G_1 = 0\.2; restricted-Lipschitz coefficients do not increase"),
    lib("bound-epsilon-nan", lambda fx: _bound(epsilon=math.nan), r"epsilon must be a finite number, got nan"),
    lib("bound-ks-not-integer", lambda fx: _bound(ks=np.array([0, 1.5, 2, 4, 8])), r"ks must be integer ranks"),
    lib("bound-no-G0", lambda fx: _bound(ks=G_KS + 1), r"G must include G_0 \(k = 0\)"),
    lib("bound-delta-above-half-flagged", lambda fx: _bound(delta=0.9),
        check=lambda b, fx: (b.hypotheses["delta_in_(0,1/2]"] is False) or pytest.fail(str(b.hypotheses))),
    lib("lipschitz-blocks-overlap",
        lambda fx: _proj(fx, blocks=[(0, fx["H"][:, :50]), (0, fx["H"][:, :50])], check_orthonormal=False),
        r"column blocks \[0, 50\) and \[0, 50\) overlap: columns would count twice"),
    lib("lipschitz-p-mismatch", lambda fx: _proj(fx, blocks=[(0, fx["H"][:, :90])]),
        r"the column blocks cover 90 columns but the basis has 100 rows"),
    lib("lipschitz-basis-not-unit", lambda fx: _proj(fx, basis=2 * fx["V"]),
        r"basis columns are not unit vectors .* rerun `gradspec pca`"),
    lib("lipschitz-basis-dependent", lambda fx: _proj(fx, basis=fx["V"][:, [0, 0, 1]]),
        r"the basis columns are linearly dependent"),
    lib("lipschitz-basis-nan", lambda fx: _proj(fx, basis=np.where(np.arange(100)[:, None] == 5, np.nan, fx["V"])),
        r"the basis V holds NaN/inf \(column 1\)"),
    lib("lipschitz-rows-nan", lambda fx: _proj(fx, blocks=[(0, np.where(fx["H"] > 2.5, np.nan, fx["H"]))]),
        r"gradient row\(s\) hold NaN/inf \(first: row 2 of the selection\)"),
    lib("lipschitz-ks-not-integer", lambda fx: _proj(fx, ks=[0, 1.7, 3]), r"ks must be integer ranks"),
    lib("lipschitz-rank-beyond-basis", lambda fx: _proj(fx, ks=[0, 11]),
        r"ranks must lie in \[0, 10\] \(the stored singular vectors\)"),
    lib("restricted-lipschitz-no-rows", lambda fx: gs.restricted_lipschitz(_proj(fx, blocks=[(0, fx["H"][:0])])),
        r"no gradient rows to estimate G_k from"),
]


def _append_f16(fx):
    store = GradientStore.create(Path(fx["new"]), layout=ParamLayout.from_shapes([("w", (4, 5))]),
                                 dtype="float16", rows_per_chunk=4, cols_per_chunk=8)
    meta = {name: np.zeros(2, dtype=dt) for name, dt in META_FIELDS.items()}
    store.append(np.full((2, 20), 1e5, np.float32), meta)


def _params():
    out = []
    for row in ROWS:
        marks = [pytest.mark.xfail(strict=True, reason=row.xfail)] if row.xfail else []
        out.append(pytest.param(row, id=row.id, marks=marks))
    return out


def test_row_ids_are_unique():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids))
    for r in ROWS:
        assert (r.cli is None) != (r.call is None), r.id
        assert (r.error is None) != (r.check is None), r.id


@pytest.mark.parametrize("row", _params())
def test_bad_input(row: Row, fx, tmp_path):
    paths = {**{k: v for k, v in fx.items() if isinstance(v, str)}, "tmp": str(fx["tmp"]),
             "new": str(tmp_path / "new")}
    if row.cli is not None:
        res = invoke(*[a.format(**paths) for a in row.cli])
        assert "Traceback" not in res.output, res.output
        if row.check is not None:
            row.check(res, paths)
            return
        assert res.exit_code == row.code, (res.exit_code, res.output, res.exception)
        lines = [ln for ln in res.output.strip().splitlines() if ln.startswith("error:")]
        assert len(lines) == 1, res.output
        assert re_search(row.error, lines[0]), lines[0]
        return
    ctx = {**fx, **paths}
    if row.check is not None:
        row.check(row.call(ctx), ctx)
        return
    with pytest.raises(row.exc) as err:
        row.call(ctx)
    message = str(err.value)
    assert "\n" not in message, message
    assert re_search(row.error, message), message


def re_search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


def test_decay_format_error_leaves_no_report(fx, tmp_path):
    """Before: report.json was written, then --format jpg failed."""
    res = invoke("decay", fx["spec"], "--out", tmp_path / "d", "--format", "jpg")
    assert res.exit_code == 2 and not (tmp_path / "d").exists()


def test_sweep_twice_listed_seed_runs_nothing(fx, tmp_path):
    """Before: the second seed-0 run reused the first's directory; the summary held it twice."""
    res = invoke(*[a.format(new=tmp_path / "sw") for a in RETRAIN], "--sweep", "-a", "dp-sgd", "--seeds", "0,0")
    assert res.exit_code == 2 and not (tmp_path / "sw" / "summary.csv").exists()
    shutil.rmtree(tmp_path / "sw", ignore_errors=True)
