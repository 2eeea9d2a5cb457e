"""The spectrum store keeps ‖h_i‖² of the rows U describes (issue 36): what an exact spectrum's
in-sample G_k need beside U and σ, so that `gradspec decay` reads no H for them."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.linalg import pca
from gradspec.store import META_FIELDS, GradientStore, ParamLayout, SpectrumStore, StoreDamagedError


@pytest.fixture(scope="module")
def grads(tmp_path_factory):
    layout = ParamLayout.from_shapes([("w", (12, 10)), ("b", (10,))])
    rng = np.random.default_rng(1)
    h = (rng.standard_normal((40, layout.p)) * np.arange(1, layout.p + 1) ** -0.5).astype(np.float32)
    meta = {name: np.zeros(40, dtype=dt) for name, dt in META_FIELDS.items()}
    path = tmp_path_factory.mktemp("norms") / "g.zarr"
    GradientStore.create(path, layout=layout, cols_per_chunk=32).append(h, meta)
    return path, h.astype(np.float64)


@pytest.mark.parametrize("method, precision, rtol", [("gram", "float64", 1e-13), ("gram", "float32", 1e-5),
                                                     ("krylov", "float64", 1e-13)])
def test_pca_records_the_row_norms_of_its_rows(grads, tmp_path, method, precision, rtol):
    path, h = grads
    rows = np.array([3, 9, 4, 20, 21, 22, 30, 31, 35, 0, 1, 2])  # U's row order is this order
    res = pca(source=str(path), k=5, rows=rows, method=method, precision=precision, out=str(tmp_path / "s"))
    spec = SpectrumStore.open(tmp_path / "s")
    want = (h[rows] ** 2).sum(axis=1)
    np.testing.assert_allclose(spec.row_sq_norms, want, rtol=rtol)
    np.testing.assert_array_equal(spec.row_sq_norms, res.row_sq_norms)
    assert spec.row_sq_norms.sum() == pytest.approx(spec.frob2, rel=1e-12)  # the same first pass
    assert spec.verify()["ok"]


def test_a_store_without_row_norms_reads_none(grads, tmp_path):
    """Spectrum stores written before issue 36 have no row_sq_norms: None, and not damaged."""
    path, _ = grads
    pca(source=str(path), k=5, method="gram", out=str(tmp_path / "s"))
    spec = SpectrumStore.open(tmp_path / "s", mode="r+")
    del spec._group["row_sq_norms"]
    old = SpectrumStore.open(tmp_path / "s")
    assert old.row_sq_norms is None
    assert old.summary()["status"] == "complete" and old.verify()["ok"]


def test_row_norms_of_the_wrong_length_are_damage(grads, tmp_path):
    path, _ = grads
    pca(source=str(path), k=5, method="gram", out=str(tmp_path / "s"))
    spec = SpectrumStore.open(tmp_path / "s", mode="r+")
    del spec._group["row_sq_norms"]
    spec._group.create_array("row_sq_norms", shape=(7,), dtype="float64")[:] = 1.0
    with pytest.raises(StoreDamagedError, match=r"row_sq_norms has shape \(7,\)"):
        SpectrumStore.open(tmp_path / "s")
