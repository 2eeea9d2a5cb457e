"""The operator and `pca` over a real gradient store, resume, and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from gradspec.linalg import GradientOperator, pca
from gradspec.store import META_FIELDS, GradientStore, ParamLayout
from gradspec.store._spectrum import SpectrumStore
from tests.linalg.cases import Case


def write_store(
    path, h: np.ndarray, *, rows_per_chunk=8, cols_per_chunk=96, commit=None
) -> GradientStore:
    lay = ParamLayout.from_shapes(
        [("enc.weight", (20, 10)), ("enc.bias", (50,)), ("head.weight", (h.shape[1] - 250,))]
    )
    s = GradientStore.create(
        path, layout=lay, rows_per_chunk=rows_per_chunk, cols_per_chunk=cols_per_chunk
    )
    n = h.shape[0]
    s.write_rows(0, h.astype(np.float32), {f: np.arange(n) for f in META_FIELDS})
    s.commit(commit if commit is not None else n)
    return s


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    h = Case("power", r=45, p=700, k=6, spectrum="power").matrix().astype(np.float32)
    path = tmp_path_factory.mktemp("g") / "grads.zarr"
    write_store(path, h)
    return path, h


@pytest.mark.parametrize(
    "rows",
    [None, slice(5, 40), slice(0, None, 2), [3, 1, 44, 20]],
    ids=["all", "slice", "stride", "indices"],
)
@pytest.mark.parametrize(
    "params", [None, "enc.*", ["head.weight", "enc.weight"]], ids=["all", "glob", "two"]
)
def test_store_operator_equals_in_memory(stored, rows, params):
    path, h = stored
    store = GradientStore.open(path)
    cols = None if params is None else store.layout.column_ranges(params)
    # float64 products: the read paths must agree to rounding (float32 products would differ
    # with the panel boundaries).
    a = GradientOperator(path, rows=rows, params=params, precision="float64")
    b = GradientOperator(h, rows=rows, col_ranges=cols, precision="float64")
    assert a.shape == b.shape
    np.testing.assert_allclose(a.gram(), b.gram(), rtol=1e-12, atol=1e-12)
    q = np.random.default_rng(0).standard_normal((a.shape[0], 3))
    np.testing.assert_allclose(a.hht(q), b.hht(q), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(a.rmatmat(q), b.rmatmat(q), rtol=1e-12, atol=1e-12)


def test_pca_writes_spectrum_store(stored, tmp_path):
    path, h = stored
    out = tmp_path / "spec.zarr"
    res = pca(source=path, k=6, method="gram", rows=slice(5, 40), params="enc.*", out=out)
    assert res.V is None
    spec = SpectrumStore.open(out)
    ref = h[5:40, :250].astype(np.float64)
    u, s, vt = np.linalg.svd(ref, full_matrices=False)
    np.testing.assert_allclose(spec.sigma, s[:6], rtol=1e-6)
    v = spec.read_v()
    np.testing.assert_allclose(np.abs(np.sum(v * vt[:6].T, axis=0)), 1, atol=1e-5)
    assert spec.summary()["kind"] == "spectrum" and spec.status == "complete"
    assert spec.source["path"] == str(path) and spec.params["params"] == "enc.*"
    assert spec.params["rows"] == {"start": 5, "stop": 40, "step": None}


def test_store_still_being_written_uses_committed_rows(tmp_path, caplog):
    h = np.random.default_rng(1).standard_normal((30, 400)).astype(np.float32)
    write_store(tmp_path / "g", h, commit=20)  # 10 rows written, not committed
    with caplog.at_level("INFO"):
        res = pca(source=tmp_path / "g", k=3, method="gram")
    np.testing.assert_allclose(
        res.sigma, np.linalg.svd(h[:20].astype(float), compute_uv=False)[:3], rtol=1e-6
    )
    assert "still being written: using its 20 committed rows" in caplog.text


def test_nan_in_store(tmp_path):
    h = np.ones((10, 400), dtype=np.float32)
    h[6, 300] = np.nan
    write_store(tmp_path / "g", h)
    with pytest.raises(ValueError, match="row 6"):
        pca(source=tmp_path / "g", k=2)


@pytest.mark.parametrize("method", ["orthogonal", "krylov"])
def test_iterative_run_resumes_at_last_completed_pass(tmp_path, monkeypatch, method):
    h = Case("power", r=40, p=300, k=5, spectrum="power").matrix()
    kw = {"orthogonal": {"iters": 6}, "krylov": {"iters": 5, "oversample": 2}}[method]
    full = pca(source=h, k=5, method=method, **kw)
    out = tmp_path / "spec.zarr"
    saves = []
    orig = SpectrumStore.save_state

    def interrupted(self, state):
        orig(self, state)
        saves.append(state["iteration"])
        if len(saves) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(SpectrumStore, "save_state", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pca(source=h, k=5, method=method, out=out, **kw)
    monkeypatch.setattr(SpectrumStore, "save_state", orig)
    assert SpectrumStore.open(out).summary()["iterations_done"] == 3
    res = pca(source=h, k=5, method=method, out=out, resume=True, **kw)
    # every pass the result rests on (issue 25: a resume recorded only its own call's)
    assert res.passes == full.passes and SpectrumStore.open(out).summary()["passes"] == full.passes
    assert [e["iteration"] for e in res.history] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(res.sigma, full.sigma, rtol=1e-12)
    np.testing.assert_allclose(SpectrumStore.open(out).read_v(), full.V, atol=1e-6)
    with pytest.raises(ValueError, match="already complete"):
        pca(source=h, k=5, method=method, out=out, resume=True, **kw)


def test_resume_with_other_settings_is_refused(tmp_path):
    h = Case("power", r=40, p=300, k=5, spectrum="power").matrix()
    out = tmp_path / "s"
    SpectrumStore.create(out, r=40, p=300, k=5, method="orthogonal", params={"k": 5, "seed": 1})
    with pytest.raises(ValueError, match="cannot resume .* seed"):
        pca(source=h, k=5, method="orthogonal", out=out, resume=True, seed=2)


def test_cli_pca(stored, tmp_path):
    from cli.pca import pca_command

    app = typer.Typer()
    app.command("pca")(pca_command)
    app.command("other")(lambda: None)
    path, h = stored
    out = tmp_path / "spec.zarr"
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "pca",
            str(path),
            "--k",
            "4",
            "--out",
            str(out),
            "--rows",
            "0:40",
            "--params",
            "enc.*",
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "method=gram" in r.output and "accuracy: max residual" in r.output
    r = runner.invoke(app, ["pca", str(path), "--k", "4", "--out", str(out)])
    assert r.exit_code != 0 and "already exists" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["pca", str(path), "--k", "999", "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "exceeds min(r, p)" in r.output
    r = runner.invoke(
        app, ["pca", str(path), "--k", "2", "--out", str(tmp_path / "y"), "--rows", "1-2"]
    )
    assert r.exit_code != 0 and "START:STOP" in r.output
