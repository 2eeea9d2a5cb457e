"""The spectrum store: round trips, streamed V writes, state, errors."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradspec.linalg import pca
from gradspec.store import GradientStore, ParamLayout, StoreDamagedError, update_attrs
from gradspec.store._spectrum import SpectrumStore


def test_round_trip(tmp_path):
    h = np.random.default_rng(0).standard_normal((30, 500))
    res = pca(source=h, k=7, method="gram", v_dtype="float64")
    out = tmp_path / "s.zarr"
    spec = SpectrumStore.create(
        out,
        r=30,
        p=500,
        k=7,
        method="gram",
        params=res.params,
        source=res.source,
        v_dtype="float64",
        v_chunk_rows=64,
    )
    with spec.v_sink() as sink:
        for i in range(0, 500, 90):  # unaligned with the 64-row chunks
            sink(i, res.V[i : i + 90])
    spec.finish(res)
    back = SpectrumStore.open(out)
    np.testing.assert_array_equal(back.sigma, res.sigma)
    np.testing.assert_array_equal(back.U, res.U)
    np.testing.assert_array_equal(back.read_v(), res.V)
    np.testing.assert_array_equal(np.concatenate([b for _, b in back.iter_v_blocks(100)]), res.V)
    for name in (
        "residuals",
        "residual_h",
        "residual_ht",
        "explained_variance_ratio",
        "cumulative_explained_variance",
    ):
        np.testing.assert_array_equal(back.array(name), getattr(res, name))
    summ = back.summary()
    assert summ["kind"] == "spectrum" and summ["status"] == "complete" and summ["k"] == 7
    assert summ["method"] == "gram" and summ["sigma_top"][0] == pytest.approx(res.sigma[0])
    assert back.V.chunks == (64, 7) and back.shape == (30, 500)
    assert back.attrs["gradspec.kind"] == "spectrum"


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cuts=st.lists(st.integers(1, 199), max_size=6, unique=True),
    chunk=st.integers(1, 80),
    k=st.integers(1, 5),
)
def test_streamed_writes_any_partition(tmp_path_factory, cuts, chunk, k):
    """Whatever the blocks V arrives in and the chunking, V reads back exactly."""
    v = np.random.default_rng(len(cuts)).standard_normal((200, k)).astype(np.float32)
    spec = SpectrumStore.create(
        tmp_path_factory.mktemp("s") / "s", r=10, p=200, k=k, method="gram", v_chunk_rows=chunk
    )
    edges = [0, *sorted(cuts), 200]
    order = list(zip(edges[:-1], edges[1:], strict=True))
    if len(cuts) % 2:
        order.reverse()  # blocks may also arrive out of order
    with spec.v_sink() as sink:
        for a, b in order:
            sink(a, v[a:b])
    np.testing.assert_array_equal(SpectrumStore.open(spec.path).read_v(), v)


def test_state_round_trip(tmp_path):
    spec = SpectrumStore.create(tmp_path / "s", r=10, p=50, k=3, method="orthogonal")
    assert spec.load_state() is None
    q = np.random.default_rng(0).standard_normal((10, 5))
    spec.save_state(
        {"iteration": 2, "q": q, "theta": np.arange(5.0), "history": [{"iteration": 1}]}
    )
    spec.save_state(
        {"iteration": 3, "q": q + 1, "theta": np.arange(5.0), "history": [{"iteration": 1}]}
    )
    st_ = SpectrumStore.open(tmp_path / "s").load_state()
    assert st_["iteration"] == 3 and st_["u"] is None and st_["history"] == [{"iteration": 1}]
    np.testing.assert_array_equal(st_["q"], q + 1)
    assert SpectrumStore.open(tmp_path / "s").summary()["iterations_done"] == 3


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="k must lie in"):
        SpectrumStore.create(tmp_path / "a", r=10, p=5, k=6, method="gram")
    with pytest.raises(FileNotFoundError, match="no spectrum store"):
        SpectrumStore.open(tmp_path / "missing")
    GradientStore.create(tmp_path / "g", layout=ParamLayout.from_shapes([("w", (4,))]))
    with pytest.raises(ValueError, match="is a gradients store, not a spectrum store"):
        SpectrumStore.open(tmp_path / "g")
    SpectrumStore.create(tmp_path / "b", r=10, p=5, k=2, method="gram")
    with pytest.raises(FileExistsError, match="already exists"):
        SpectrumStore.create(tmp_path / "b", r=10, p=5, k=2, method="gram")
    with pytest.raises(ValueError, match="read-only"):
        SpectrumStore.open(tmp_path / "b").v_sink()


# ---------------------------------------------------------------------- integrity
SPECTRUM_ARRAYS = ("V", "U", "sigma", "residuals", "residual_h", "residual_ht",
                   "explained_variance_ratio", "cumulative_explained_variance", "source_rows",
                   "row_sq_norms")


def complete_store(path, *, zero_rows=False):
    """A complete store: V in 8 chunks of 16 rows (the first all zero with ``zero_rows``)."""
    h = np.random.default_rng(1).standard_normal((12, 128))
    if zero_rows:
        h[:, :16] = 0.0
    res = pca(source=h, k=3, method="gram", v_dtype="float64")
    spec = SpectrumStore.create(path, r=12, p=128, k=3, method="gram", params=res.params,
                                source=res.source, source_rows=np.arange(12), v_dtype="float64",
                                v_chunk_rows=16)
    with spec.v_sink() as sink:
        sink(0, res.V)
    spec.finish(res)
    return SpectrumStore.open(path), res


def chunk_path(path, name, key="0"):
    return path / name / "c" / key


def every_accessor(spec):
    return {
        "sigma": lambda: spec.sigma,
        "U": lambda: spec.U,
        "V": lambda: spec.V,
        "read_v": lambda: spec.read_v(),
        "read_v-rows": lambda: spec.read_v(slice(0, 16)),
        "iter_v_blocks": lambda: list(spec.iter_v_blocks(40)),
        "source_rows": lambda: spec.source_rows,
        "row_sq_norms": lambda: spec.row_sq_norms,
        **{f"array-{n}": (lambda n=n: spec.array(n)) for n in SPECTRUM_ARRAYS[3:8]},
    }


def test_every_chunk_is_written_even_all_zero(tmp_path):
    """residual_ht of an exact method and V rows of untouched parameters are zero: still stored."""
    spec, res = complete_store(tmp_path / "s", zero_rows=True)
    assert spec.attrs["gradspec.all_chunks"] is True
    assert not res.residual_ht.any() and not res.V[:16].any()
    for name in SPECTRUM_ARRAYS:
        assert chunk_path(tmp_path / "s", name, "0/0" if name in ("V", "U") else "0").is_file(), name
    assert spec.find_damaged_chunks() == [] and spec.summary()["status"] == "complete"
    rep = spec.verify()
    assert rep["ok"] and rep["chunks"] == 8 + 1 + 1 + 5 + 1 + 1 and rep["unchecked"] == []


@pytest.mark.parametrize("name", SPECTRUM_ARRAYS)
def test_a_deleted_chunk_is_an_error_on_every_accessor(tmp_path, name):
    """Deleting sigma/c/0 used to read [0, 0, 0] with status complete."""
    path = tmp_path / "s"
    complete_store(path)
    key = "1/0" if name == "V" else "0/0" if name == "U" else "0"
    os.remove(chunk_path(path, name, key))
    spec = SpectrumStore.open(path)
    touched = {"V": ("V", "read_v", "iter_v_blocks"), "U": ("U",), "sigma": ("sigma",),
               "source_rows": ("source_rows",), "row_sq_norms": ("row_sq_norms",)}.get(name, (f"array-{name}",))
    for what, read in every_accessor(spec).items():
        if what in touched:
            with pytest.raises(StoreDamagedError, match=rf"chunk {name}/c/{key}, holding rows .* is missing"):
                read()
        else:
            read()  # what does not touch the chunk still reads
    if name == "V":
        assert spec.read_v(slice(0, 16)).shape == (16, 3)
    summ = spec.summary()
    assert summ["status"] == "damaged" and summ["recorded_status"] == "complete"
    assert [(d["array"], d["chunk"], d["problem"]) for d in summ["damaged_chunks"]] == [(name, f"c/{key}", "missing")]
    rep = spec.verify()
    assert not rep["ok"] and [d["array"] for d in rep["damaged"]] == [name]


@pytest.mark.parametrize("change", ["truncated", "too long"])
def test_a_chunk_of_the_wrong_size_is_an_error(tmp_path, change):
    path = tmp_path / "s"
    complete_store(path)
    f = chunk_path(path, "sigma")
    raw = f.read_bytes()
    f.write_bytes(raw[:16] if change == "truncated" else raw + raw[:8])
    spec = SpectrumStore.open(path)
    with pytest.raises(StoreDamagedError, match=rf"sigma/c/0.*is {change}: \d+ bytes, expected 28"):
        _ = spec.sigma
    assert spec.summary()["status"] == "damaged"
    assert spec.verify()["damaged"][0]["problem"].startswith(change)


def test_a_missing_array_or_a_wrong_shape_is_refused_at_open(tmp_path):
    path = tmp_path / "s"
    complete_store(path)
    import shutil

    shutil.rmtree(path / "sigma")
    with pytest.raises(StoreDamagedError, match="array 'sigma' is missing"):
        SpectrumStore.open(path)
    # still a spectrum store: --overwrite replaces it; without, it is refused naming the damage
    with pytest.raises(FileExistsError, match="array 'sigma' is missing.*--overwrite"):
        SpectrumStore.check_target(path, overwrite=False)
    assert SpectrumStore.check_target(path, overwrite=True) is True
    other = tmp_path / "t"
    complete_store(other)
    zarr.open_group(str(other), mode="r+")["U"].resize((12, 2))
    with pytest.raises(StoreDamagedError, match=r"U has shape \(12, 2\).*so \(12, 3\)"):
        SpectrumStore.open(other)


def test_finish_refuses_a_store_with_rows_of_v_never_written(tmp_path):
    h = np.random.default_rng(2).standard_normal((12, 128))
    res = pca(source=h, k=3, method="gram", v_dtype="float64")
    spec = SpectrumStore.create(tmp_path / "s", r=12, p=128, k=3, method="gram", v_dtype="float64",
                                v_chunk_rows=16)
    with spec.v_sink() as sink:
        sink(0, res.V[:64])  # rows 64.. never arrive
    with pytest.raises(StoreDamagedError, match=r"chunk V/c/4/0, holding rows 64\.\.79 of 128, is missing"):
        spec.finish(res)
    assert SpectrumStore.open(tmp_path / "s").status == "running"


def test_a_running_store_checks_its_saved_state(tmp_path):
    spec = SpectrumStore.create(tmp_path / "s", r=10, p=50, k=3, method="orthogonal")
    spec.save_state({"iteration": 1, "q": np.zeros((10, 5))})  # all zero: still stored
    os.remove(chunk_path(tmp_path / "s", "state/q", "0/0"))
    with pytest.raises(StoreDamagedError, match="state/q/c/0/0"):
        SpectrumStore.open(tmp_path / "s").load_state()
    rep = SpectrumStore.open(tmp_path / "s").verify()
    assert not rep["ok"] and rep["unchecked"] == ["V", "U", "sigma", *SPECTRUM_ARRAYS[3:8]]


def test_a_store_that_predates_all_chunks_warns(tmp_path, caplog):
    path = tmp_path / "s"
    complete_store(path)
    g = zarr.open_group(str(path), mode="r+")
    update_attrs(g, {}, remove=("gradspec.all_chunks",))
    os.remove(chunk_path(path, "V", "0/0"))
    spec = SpectrumStore.open(path)
    with caplog.at_level(logging.WARNING, logger="gradspec"):
        assert not spec.read_v(slice(0, 16)).any()
    assert "predates gradspec writing every chunk" in caplog.text
    summ = spec.summary()
    assert summ["status"] == "complete" and summ["damaged_chunks"][0]["chunk"] == "c/0/0"
    assert spec.verify()["absent_zero_chunks"] == 1
    chunk_path(path, "sigma").write_bytes(b"\0" * 8)  # a short chunk is damage in any store
    with pytest.raises(StoreDamagedError, match="truncated"):
        _ = spec.sigma


def test_info_reports_a_damaged_spectrum_store(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    path = tmp_path / "s"
    complete_store(path)
    runner = CliRunner()
    ok = runner.invoke(app, ["info", str(path), "--verify", "--no-progress"])
    assert ok.exit_code == 0, ok.output
    assert "verify" in ok.output and ": ok" in ok.output
    os.remove(chunk_path(path, "sigma"))
    bad = runner.invoke(app, ["info", str(path)])
    assert bad.exit_code == 1 and "DAMAGED" in bad.output and "sigma/c/0 (missing)" in bad.output
    checked = runner.invoke(app, ["info", str(path), "--verify", "--json"])
    assert checked.exit_code == 1
    rep = json.loads(checked.output)
    assert rep["status"] == "damaged" and rep["verify"]["damaged"][0]["array"] == "sigma"
