"""A 16-bit store reports what the conversion lost, and warns when it matters."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import zarr

from gradspec.store import META_FIELDS, BackgroundWriter, GradientStore, ParamLayout
from gradspec.store._precision import conversion_stats
from gradspec.store._zarr import from_disk_dtype, to_disk_dtype

P = 3000


def meta(b, start=0):
    return {f: np.arange(start, start + b) for f in META_FIELDS}


def grads(n, scale, seed=0):
    """Gradient-like rows: a few directions plus noise, entries of size ``scale``."""
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((3, P))
    h = rng.standard_normal((n, 3)) @ basis + 0.3 * rng.standard_normal((n, P))
    return (scale * h / np.abs(h).mean()).astype(np.float32)


def reference(x: np.ndarray, dtype: str) -> dict:
    """The report computed straight from its definition."""
    back = (torch.from_numpy(x).bfloat16() if dtype == "bfloat16" else torch.from_numpy(x).half()).float().numpy()
    tiny = np.finfo(np.float16).tiny if dtype == "float16" else np.finfo(np.float32).tiny
    nz = x != 0
    err = np.linalg.norm((back - x).astype(np.float64), axis=1)
    norm = np.linalg.norm(x.astype(np.float64), axis=1)
    return {
        "nonzero": int(nz.sum()),
        "underflowed": int((nz & (back == 0)).sum()),
        "subnormal": int(((back != 0) & (np.abs(back) < tiny)).sum()),
        "rel_error": float(np.linalg.norm(err) / np.linalg.norm(norm)),
        "max_row_rel_error": float((err / norm).max()),
    }


def write(path, x, dtype, batches=4):
    lay = ParamLayout.from_shapes([("w", (P,))])
    s = GradientStore.create(path, layout=lay, dtype=dtype, rows_per_chunk=8)
    w = BackgroundWriter(s, background=False)
    for i, part in enumerate(np.array_split(x, batches)):
        w.put(part, meta(len(part), i * 100))
        w.commit()
    w.close()
    return GradientStore.open(path)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("scale", [4e-6, 1e-2])
def test_the_report_equals_its_definition(tmp_path, dtype, scale):
    x = grads(40, scale)
    x[3, :100] = 0  # exact zeros are not losses
    s = write(tmp_path / "g", x, dtype)
    rep = s.dtype_report
    ref = reference(x, dtype)
    for key in ("nonzero", "underflowed", "subnormal"):
        assert rep[key] == ref[key], key
    np.testing.assert_allclose(rep["rel_error"], ref["rel_error"], rtol=1e-4)
    np.testing.assert_allclose(rep["max_row_rel_error"], ref["max_row_rel_error"], rtol=1e-4)
    assert rep["entries"] == 40 * P and rep["rows"] == 40
    # the same report is in the attributes, for readers of the raw store
    attrs = zarr.open_group(str(tmp_path / "g")).attrs["gradspec.dtype_report"]
    assert attrs["underflowed"] == rep["underflowed"] and attrs["rows"] == 40


def test_float16_gradients_of_scale_4e_6_are_reported_and_warned_once(tmp_path, caplog):
    x = grads(64, 4e-6)
    with caplog.at_level(logging.WARNING, logger="gradspec.store"):
        s = write(tmp_path / "g", x, "float16", batches=8)
    rep = s.dtype_report
    assert rep["underflowed_share"] > 1e-3 and rep["rel_error"] > 1e-3
    assert caplog.text.count("flushed") == 1 and "--dtype float32" in caplog.text
    assert s.summary()["dtype_report"] == rep


@pytest.mark.parametrize("dtype,scale", [("bfloat16", 4e-6), ("float16", 1e-2), ("bfloat16", 1e-2)])
def test_no_warning_when_the_losses_are_the_dtypes_plain_rounding(tmp_path, caplog, dtype, scale):
    with caplog.at_level(logging.WARNING, logger="gradspec.store"):
        s = write(tmp_path / "g", grads(32, scale), dtype)
    assert caplog.text == ""
    assert s.dtype_report["underflowed"] == 0 or s.dtype_report["underflowed_share"] < 1e-4


def test_a_truncated_store_reports_only_its_rows(tmp_path):
    """Resuming from an earlier checkpoint rewrites rows: the report must not count them twice."""
    a, b, c = grads(16, 4e-6, 1), grads(16, 1e-2, 2), grads(8, 4e-6, 3)
    lay = ParamLayout.from_shapes([("w", (P,))])
    s = GradientStore.create(tmp_path / "g", layout=lay, dtype="float16", rows_per_chunk=8)
    s.append(a, meta(16))
    s.append(b, meta(16, 16))
    s.truncate(16)
    s.append(c, meta(8, 16))
    rep = GradientStore.open(tmp_path / "g").dtype_report
    ref = reference(np.concatenate([a, c]), "float16")
    assert rep["rows"] == 24 and rep["underflowed"] == ref["underflowed"] and rep["nonzero"] == ref["nonzero"]
    np.testing.assert_allclose(rep["rel_error"], ref["rel_error"], rtol=1e-4)
    assert zarr.open_group(str(tmp_path / "g")).attrs["gradspec.dtype_report"]["rows"] == 24


def test_values_beyond_float16_are_refused_not_stored_as_inf(tmp_path):
    lay = ParamLayout.from_shapes([("w", (P,))])
    s = GradientStore.create(tmp_path / "g", layout=lay, dtype="float16")
    x = grads(4, 1e-2)
    x[2, 7] = 1e5
    with pytest.raises(ValueError, match="1 finite gradient entries exceed float16.*--dtype bfloat16"):
        s.append(x, meta(4))
    assert GradientStore.open(tmp_path / "g").n_rows == 0


def test_non_finite_input_is_not_counted_as_rounding(tmp_path):
    x = grads(3, 1e-2)
    x[1, 5] = np.nan
    stats, overflowed = conversion_stats(x, to_disk_dtype(x, "float16"), "float16")
    assert overflowed == 0 and stats[1, 3] == 0 and np.isfinite(stats).all() and stats[0, 3] > 0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_conversions_round_trip_every_16_bit_value(dtype):
    """The fast float16 paths (torch one way, a table the other) agree with numpy on all 65,536 values."""
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    disk = bits.view(np.float16) if dtype == "float16" else bits
    x = from_disk_dtype(disk.reshape(256, 256), dtype)
    if dtype == "float16":
        np.testing.assert_array_equal(x, disk.reshape(256, 256).astype(np.float32))
    finite = np.isfinite(x)
    again = to_disk_dtype(np.where(finite, x, 0), dtype)
    np.testing.assert_array_equal(again.view(np.uint16)[finite], bits.reshape(256, 256)[finite])
