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
