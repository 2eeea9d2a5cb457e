"""An array's zarr.json must say what gradspec wrote: its data type, little-endian bytes and
no other codecs. The chunk checksums see the stored bytes only, so a changed encoding decoded
them into other numbers unnoticed (found by review: a big-endian sigma read as 3e-262 ... 2e+297
with "checksums checked: ok"; an int32 meta/loss printed as 1051435711)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradspec.linalg import pca
from gradspec.store import META_FIELDS, GradientStore, ParamLayout, SpectrumStore
from gradspec.store._integrity import StoreDamagedError


@pytest.fixture
def stores(tmp_path):
    rng = np.random.default_rng(0)
    meta = {name: np.zeros(12, dtype=dt) for name, dt in META_FIELDS.items()}
    g = tmp_path / "g.zarr"
    GradientStore.create(g, layout=ParamLayout.from_shapes([("w", (40,))]), rows_per_chunk=4).append(
        rng.standard_normal((12, 40)).astype(np.float32), meta)
    s = tmp_path / "s.zarr"
    pca(source=str(g), k=4, out=str(s))
    return g, s


def _edit(path, change):
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def _big_endian(meta):
    meta["codecs"][0]["configuration"]["endian"] = "big"


def _transpose(meta):
    meta["codecs"].insert(0, {"name": "transpose", "configuration": {"order": list(range(len(meta["shape"])))[::-1]}})


@pytest.mark.parametrize(("kind", "array", "change", "says"), [
    ("spectrum", "sigma", _big_endian, "big-endian"),
    ("spectrum", "U", _big_endian, "big-endian"),
    ("spectrum", "V", lambda m: m.update(data_type="int32"), "int32, not float32"),
    ("spectrum", "V", _transpose, "TransposeCodec"),
    ("gradients", "meta/loss", lambda m: m.update(data_type="int32"), "int32, not float32"),
    ("gradients", "meta/step", lambda m: m.update(data_type="float64"), "float64, not int64"),
    ("gradients", "grads", _big_endian, "big-endian"),
])
def test_an_array_of_another_encoding_is_damage(stores, kind, array, change, says):
    g, s = stores
    root, store = (s, SpectrumStore) if kind == "spectrum" else (g, GradientStore)
    _edit(root / array / "zarr.json", change)
    with pytest.raises((ValueError, StoreDamagedError), match=f"zarr.json of '{array}' is not as written: .*{says}"):
        store.open(root)
