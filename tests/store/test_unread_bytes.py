"""Bytes a store holds besides its checksummed chunks: the attributes in zarr.json carry a
SHA-256 (a flipped bit in the row count or in σ's Frobenius norm was read as data), and nothing
at a chunk's or a zarr.json's name that is not a regular file can hang a reader (a FIFO there
blocked ``read``, ``verify``, ``pca`` and ``info`` forever)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from cli.main import app
from gradspec.linalg import pca
from gradspec.store import (
    META_FIELDS,
    GradientStore,
    ParamLayout,
    SpectrumStore,
    StoreDamagedError,
    update_attrs,
)
from gradspec.store._integrity import ChunkPresence
from gradspec.store._zarr import DIGEST_KEY

from .._waits import returns_within


def _store(path, n=16, p=40):
    lay = ParamLayout.from_shapes([("a", (p // 2,)), ("b", (p - p // 2,))])
    store = GradientStore.create(path, layout=lay, rows_per_chunk=4, cols_per_chunk=16)
    data = np.random.default_rng(0).standard_normal((n, p)).astype(np.float32)
    store.append(data, {f: np.arange(n) for f in META_FIELDS})
    return data


def _flip(path, needle: bytes, at: int, bit: int) -> None:
    raw = bytearray(path.read_bytes())
    where = bytes(raw).find(needle)
    assert where >= 0 and bytes(raw).find(needle, where + 1) < 0, needle
    raw[where + at] ^= bit
    path.write_bytes(bytes(raw))




def test_a_flipped_bit_in_the_committed_row_count_is_refused(tmp_path):
    _store(tmp_path / "g")
    assert GradientStore.open(tmp_path / "g").n_rows == 16
    _flip(tmp_path / "g" / "zarr.json", b'"gradspec.rows": 16', len(b'"gradspec.rows": 1'), 0x02)  # 16 -> 14
    assert b'"gradspec.rows": 14' in (tmp_path / "g" / "zarr.json").read_bytes()
    with pytest.raises(ValueError, match="do not match the digest"):
        GradientStore.open(tmp_path / "g")
    res = CliRunner().invoke(app, ["pca", str(tmp_path / "g"), "--k", "2", "--out", str(tmp_path / "s.zarr"),
                                   "--no-progress"])
    assert res.exit_code != 0 and "do not match the digest" in res.output, res.output


def test_a_flipped_bit_in_a_spectrums_frobenius_norm_is_refused_before_decay_reads_it(tmp_path):
    _store(tmp_path / "g")
    pca(source=tmp_path / "g", k=3, out=tmp_path / "s.zarr")
    frob2 = SpectrumStore.open(tmp_path / "s.zarr").attrs["gradspec.frob2"]
    text = f'"gradspec.frob2": {frob2!r}'.encode()
    _flip(tmp_path / "s.zarr" / "zarr.json", text, len(b'"gradspec.frob2": '), 0x04)
    with pytest.raises(ValueError, match="do not match the digest"):
        SpectrumStore.open(tmp_path / "s.zarr")
    res = CliRunner().invoke(app, ["decay", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "d"), "--no-progress"])
    assert res.exit_code != 0 and "do not match the digest" in res.output, res.output


def test_every_write_of_the_attributes_keeps_the_digest_and_a_hand_edit_is_seen(tmp_path):
    _store(tmp_path / "g")
    store = GradientStore.open(tmp_path / "g", mode="r+")
    store.update_config(final_epsilon=1.5)  # a later write through gradspec: a new digest
    assert GradientStore.open(tmp_path / "g").config["final_epsilon"] == 1.5
    zarr.open_group(str(tmp_path / "g"), mode="r+").attrs["gradspec.config"] = {"final_epsilon": 0.5}
    with pytest.raises(ValueError, match="do not match the digest"):
        GradientStore.open(tmp_path / "g")
    update_attrs(zarr.open_group(str(tmp_path / "g"), mode="r+"), {})  # a deliberate edit, stamped anew
    assert GradientStore.open(tmp_path / "g").config == {"final_epsilon": 0.5}


def test_a_store_written_before_the_digest_opens_with_a_warning(tmp_path, caplog):
    data = _store(tmp_path / "g")
    group = zarr.open_group(str(tmp_path / "g"), mode="r+")
    group.attrs.put({k: v for k, v in group.attrs.asdict().items() if k != DIGEST_KEY})
    with caplog.at_level(logging.WARNING, logger="gradspec.store._zarr"):
        np.testing.assert_array_equal(GradientStore.open(tmp_path / "g").read(), data)
    assert "cannot be verified" in caplog.text


def _fifo_chunk(tmp_path):
    _store(tmp_path / "g")
    store = GradientStore.open(tmp_path / "g")
    chunk = ChunkPresence(store._arrays()["grads"]).path((1, 1))
    os.remove(chunk)
    os.mkfifo(chunk)  # no writer: a blocking open waits forever
    return store


def test_a_fifo_in_a_chunks_place_is_damage_not_a_hang(tmp_path):
    store = _fifo_chunk(tmp_path)
    assert store._direct is not None  # the fast chunk-file path
    _, err = returns_within(store.read)
    assert isinstance(err, (OSError, StoreDamagedError)) and "not a regular file" in str(err), err
    reports = []
    assert returns_within(lambda: reports.append(GradientStore.open(tmp_path / "g").verify()))[0] == "ok"
    assert not reports[0]["ok"] and [d["chunk"] for d in reports[0]["damaged"]] == ["c/1/1"], reports[0]


@pytest.mark.parametrize("where", ["grads/zarr.json", "meta/loss/zarr.json"])
def test_a_fifo_in_an_arrays_metadata_is_refused_not_waited_on(tmp_path, where):
    _store(tmp_path / "g")
    os.remove(tmp_path / "g" / where)
    os.mkfifo(tmp_path / "g" / where)
    _, err = returns_within(lambda: GradientStore.open(tmp_path / "g"))
    assert isinstance(err, ValueError) and where in str(err) and "not a regular file" in str(err), err
    kind, res = returns_within(lambda: CliRunner().invoke(app, ["info", str(tmp_path / "g")]))
    assert kind == "ok" and res.exit_code != 0 and "not a regular file" in res.output, res.output
