"""`gradspec info` on stores whose source does not know every row's per-example norms."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import GradientStore, ParamLayout


def _store(path, norms):
    layout = ParamLayout.from_shapes([("w", (3, 2))])
    store = GradientStore.create(path, layout=layout, config={"max_grad_norm": 1.0})
    n = len(norms)
    meta = {"step": np.arange(n), "epoch": np.zeros(n, "int32"), "loss": np.ones(n, "float32"),
            "batch_size": np.full(n, 4, "int32"), "norm_mean": np.asarray(norms, "float32"),
            "norm_max": 2 * np.asarray(norms, "float32"),
            "frac_clipped": np.where(np.isnan(norms), np.nan, 0.5).astype("float32")}
    store.append(np.ones((n, 6), "float32"), meta)
    store.set_status("complete")
    return store


def test_unknown_norms_are_said_to_be_unknown_not_nan(tmp_path):
    store = _store(tmp_path / "g.zarr", [np.nan, np.nan])
    rows = store.summary()["rows"]
    assert rows["grad_norm_mean"] is None and rows["rows_with_norms"] == 0
    res = CliRunner().invoke(app, ["info", str(tmp_path / "g.zarr")])
    assert res.exit_code == 0, res.output
    assert "grad norms not recorded by this source" in res.output and "nan" not in res.output


def test_statistics_use_the_rows_that_have_norms(tmp_path):
    store = _store(tmp_path / "g.zarr", [1.0, np.nan, 3.0])
    rows = store.summary()["rows"]
    assert rows["grad_norm_mean"] == 2.0 and rows["grad_norm_max"] == 6.0
    assert rows["frac_clipped_mean"] == 0.5 and rows["rows_with_norms"] == 2
    res = CliRunner().invoke(app, ["info", str(tmp_path / "g.zarr")])
    assert "grad norm mean 2 max 6  clipped 50% (2 rows with norms)" in res.output, res.output


def test_a_clipped_share_that_is_no_fraction_is_not_printed_as_a_percentage(tmp_path):
    """Issue 34 §6: the synthetic benchmark store wrote the row numbers into every metadata field
    and `info` printed `clipped 99950%`."""
    store = GradientStore.create(tmp_path / "h.zarr", layout=ParamLayout.from_shapes([("w", (3, 2))]),
                                 config={"max_grad_norm": 1.0})
    meta = {"step": np.arange(2000), "epoch": np.zeros(2000, "int32"), "loss": np.ones(2000, "float32"),
            "batch_size": np.full(2000, 4, "int32"), "norm_mean": np.ones(2000, "float32"),
            "norm_max": np.ones(2000, "float32"), "frac_clipped": np.arange(2000, dtype="float32")}
    store.append(np.ones((2000, 6), "float32"), meta)
    store.set_status("complete")
    res = CliRunner().invoke(app, ["info", str(tmp_path / "h.zarr")])
    assert res.exit_code == 0, res.output
    assert "%" not in res.output, res.output
    assert "clipped share unknown (meta/frac_clipped averages 999.5, not a fraction in [0, 1])" in res.output


def test_the_synthetic_benchmark_store_records_no_norms_rather_than_row_numbers(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from bench_pca import make_store
    finally:
        sys.path.pop(0)
    make_store(tmp_path / "b.zarr", 40, 300, 5)
    res = CliRunner().invoke(app, ["info", str(tmp_path / "b.zarr")])
    assert res.exit_code == 0, res.output
    assert "steps 0..39" in res.output and "grad norms not recorded by this source" in res.output, res.output
