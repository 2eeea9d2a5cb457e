"""A store whose gradspec.kind names the other kind gives one line naming the claim and the
missing attribute (issue 25: `info` and `decay` printed only `error: gradspec.shape`)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

import gradspec
from cli.main import app
from gradspec.store import (
    META_FIELDS,
    GradientStore,
    ParamLayout,
    SpectrumStore,
    open_store,
    update_attrs,
)


@pytest.fixture
def stores(tmp_path):
    grads = tmp_path / "g.zarr"
    store = GradientStore.create(grads, layout=ParamLayout.from_shapes([("w", (30,))]))
    meta = {name: np.zeros(6, dtype=dtype) for name, dtype in META_FIELDS.items()}
    store.append(np.random.default_rng(0).standard_normal((6, 30)).astype(np.float32), meta)
    store.set_status("complete")
    gradspec.pca(source=grads, k=2, out=tmp_path / "s.zarr")
    return grads, tmp_path / "s.zarr"


@pytest.mark.parametrize("which, claim, opener, says", [
    (0, "spectrum", SpectrumStore.open, "says it is a spectrum store .* has no 'gradspec.shape'"),
    (1, "gradients", GradientStore.open, "says it is a gradients store .* has no 'gradspec.layout'"),
], ids=["gradients-says-spectrum", "spectrum-says-gradients"])
def test_a_relabelled_store_is_one_line_naming_the_claim(stores, which, claim, opener, says):
    path = stores[which]
    update_attrs(zarr.open_group(str(path), mode="r+"), {"gradspec.kind": claim})
    for call in (lambda: open_store(path), lambda: opener(path)):
        with pytest.raises(ValueError, match=says):
            call()
    res = CliRunner().invoke(app, ["info", str(path)])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and "gradspec." in lines[0], res.output


@pytest.mark.parametrize("which, command, says", [
    (1, ["pca", "{store}", "--k", "2", "--out", "{new}"], "is a spectrum store, not a gradients store"),
    (0, ["decay", "{store}", "--out", "{new}"], "is a gradients store, not a spectrum store"),
    (0, ["retrain", "--projector", "{store}", "--rank", "1", "--out", "{new}", "--steps", "1"],
     "is a gradients store, not a spectrum store"),
], ids=["pca-of-a-spectrum", "decay-of-gradients", "retrain-projector-of-gradients"])
def test_a_store_of_the_other_kind_is_one_line_naming_both_kinds(stores, tmp_path, which, command, says):
    args = [a.format(store=stores[which], new=tmp_path / "new") for a in command]
    res = CliRunner().invoke(app, args)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and says in lines[0], res.output
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("attr, value, says", [
    ("gradspec.kind", "gradientz", "is a gradspec store of unknown kind 'gradientz' (gradspec writes gradients "
                                   "and spectrum stores): its zarr.json is damaged; restore it from a copy"),
    ("gradspec.format", 7, "has gradspec.format = 7, a format this gradspec does not know (it reads up to 1): "
                           "its zarr.json is damaged, or a later gradspec wrote it"),
], ids=["kind", "format"])
def test_an_edited_kind_or_format_says_damaged_not_upgrade(stores, attr, value, says):
    """Issue 34 §6: an edited gradspec.kind was told to "upgrade gradspec"; the pca of it said
    "is a gradientz store, not a gradients store"."""
    grads, _ = stores
    zarr.open_group(str(grads), mode="r+").attrs[attr] = value
    openers = [open_store, GradientStore.open] + ([SpectrumStore.open] if attr == "gradspec.kind" else [])
    for call in (lambda o=o: o(grads) for o in openers):
        with pytest.raises(ValueError) as err:
            call()
        assert says in str(err.value) and "upgrade" not in str(err.value)
    for argv in (["info", str(grads)], ["pca", str(grads), "--k", "2", "--out", str(grads.parent / "x.zarr")]):
        res = CliRunner().invoke(app, argv)
        lines = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert res.exit_code == 2 and len(lines) == 1 and says in lines[0], res.output
