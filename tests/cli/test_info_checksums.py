"""`gradspec info --verify`, `pca` and `decay` on stores with one flipped byte in a chunk.

Before per-chunk checksums, such a byte decoded to another value (uncompressed and zstd stores
alike): `info --verify` said ok and `pca` used it with exit 0.
"""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import GradientStore
from tests.store.test_checksums import drop_row_sums

runner = CliRunner()

LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "0", "--checkpoint-every", "20",
           "--no-progress", "--steps", "40"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def flip(path, at=None):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(raw))


def one_error_line(res):
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    return errors[0]


@pytest.fixture(scope="module", params=["none", "zstd"])
def run(request, tmp_path_factory):
    """A finished 40-step run (two row chunks of 32) and its top-3 spectrum."""
    out = tmp_path_factory.mktemp(f"run-{request.param}")
    res = invoke("collect", "--out", out, "--compressor", request.param, *LOWRANK)
    assert res.exit_code == 0, res.output
    res = invoke("pca", out / "gradients.zarr", "-k", 3, "--out", out / "spectrum.zarr", "--no-progress")
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture
def copy(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def test_a_healthy_store_says_its_chunks_carry_checksums(copy):
    for store in ("gradients.zarr", "spectrum.zarr"):
        res = invoke("info", copy / store, "--verify", "--no-progress")
        assert res.exit_code == 0, res.output
        assert "checksum crc32c on every chunk" in res.output and "checksums checked: ok" in res.output


def test_a_flipped_byte_in_a_gradient_chunk_is_found_and_pca_refuses(copy):
    flip(copy / "gradients.zarr" / "grads" / "c" / "1" / "0")
    res = invoke("info", copy / "gradients.zarr", "--verify", "--no-progress")
    assert res.exit_code == 1 and "1 damaged chunk(s)" in res.output
    assert "grads/c/1/0  rows 32..39  corrupt: its bytes do not match their crc32c checksum" in res.output
    # before: pca read the changed value and exited 0
    res = invoke("pca", copy / "gradients.zarr", "-k", 2, "--out", copy / "again.zarr", "--no-progress")
    assert res.exit_code == 2
    line = one_error_line(res)
    assert "chunk grads/c/1/0, holding committed rows 32..39 of 40, is corrupt" in line
    assert "restore the file from a copy" in line


def test_a_flipped_byte_in_a_metadata_chunk_marks_the_store_damaged(copy):
    flip(copy / "gradients.zarr" / "meta" / "loss" / "c" / "0", at=20)
    res = invoke("info", copy / "gradients.zarr")  # plain info reads the metadata: damage shows
    assert res.exit_code == 1 and "[damaged]" in res.output and "meta/loss/c/0" in res.output


def test_a_flipped_byte_in_a_spectrum_chunk_is_found_and_decay_refuses(copy):
    flip(copy / "spectrum.zarr" / "V" / "c" / "0" / "0")
    res = invoke("info", copy / "spectrum.zarr", "--verify", "--no-progress")
    assert res.exit_code == 1 and "V/c/0/0  rows 0..39" in res.output and "crc32c" in res.output
    flip(copy / "spectrum.zarr" / "sigma" / "c" / "0", at=3)
    res = invoke("decay", copy / "spectrum.zarr", "--out", copy / "decay")
    assert res.exit_code == 2
    assert "chunk sigma/c/0, holding rows 0..2 of 3, is corrupt" in one_error_line(res)


def test_a_store_written_before_checksums_says_a_flip_cannot_be_found(tmp_path, monkeypatch):
    import gradspec.store._checksum as checksum

    # gradspec before checksums: the codec chain ended with the bytes codec (or the compressor)
    monkeypatch.setattr(checksum, "checksum_codecs", lambda compressors=None: list(compressors or []) or None)
    res = invoke("collect", "--out", tmp_path / "run", *LOWRANK)
    monkeypatch.undo()
    assert res.exit_code == 0, res.output
    store = tmp_path / "run" / "gradients.zarr"
    drop_row_sums(store)  # it predates them too
    assert GradientStore.open(store).summary()["checksums"]["checksummed"] == []
    res = invoke("info", store, "--verify", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "checksum none: written before gradspec checksummed its chunks; a changed byte" in res.output
    assert "no checksums (a changed byte cannot be detected): ok" in res.output
    assert "rowsums  none: written before gradspec recorded its rows' checksums" in res.output
    flip(store / "grads" / "c" / "1" / "0")  # what the line warns of: nothing can tell
    assert invoke("info", store, "--verify", "--no-progress").exit_code == 0


def test_a_chunk_copied_from_another_run_is_found_and_pca_refuses(copy, tmp_path):
    """Before row checksums the copied chunk's own CRC held: info --verify said ok and pca used
    another run's gradients with exit 0."""
    zstd = '"zstd"' in (copy / "gradients.zarr" / "grads" / "zarr.json").read_text()
    res = invoke("collect", "--out", tmp_path / "other", "--compressor", "zstd" if zstd else "none", *LOWRANK,
                 "--seed", 1)
    assert res.exit_code == 0, res.output
    res = invoke("info", copy / "gradients.zarr")
    assert "rowsums  each row's crc32c per column chunk" in res.output
    for chunk in ("0/0", "1/0"):  # a whole row chunk, and the last one (rows 32..39 of its 32)
        shutil.copy(tmp_path / "other" / "gradients.zarr" / "grads" / "c" / chunk,
                    copy / "gradients.zarr" / "grads" / "c" / chunk)
    res = invoke("info", copy / "gradients.zarr", "--verify", "--no-progress")
    assert res.exit_code == 1 and "2 damaged chunk(s)" in res.output, res.output
    assert "grads/c/1/0  rows 32..39  not this store's" in res.output
    res = invoke("pca", copy / "gradients.zarr", "-k", 2, "--out", copy / "again.zarr", "--no-progress")
    assert res.exit_code == 2
    assert "chunk grads/c/0/0, holding committed rows 0..31 of 40, is not this store's" in one_error_line(res)
    # and a spectrum's: σ and V of the other run's top-3 spectrum (its chunk manifest)
    res = invoke("pca", tmp_path / "other" / "gradients.zarr", "-k", 3, "--out", tmp_path / "other" / "spec",
                 "--no-progress")
    assert res.exit_code == 0, res.output
    for name, key in (("sigma", "0"), ("V", "0/0")):
        shutil.copy(tmp_path / "other" / "spec" / name / "c" / key, copy / "spectrum.zarr" / name / "c" / key)
    assert "manifest each chunk's crc32c recorded when pca finished" in invoke("info", copy / "spectrum.zarr").output
    res = invoke("info", copy / "spectrum.zarr", "--verify", "--no-progress")
    assert res.exit_code == 1 and "V/c/0/0  rows 0..39  not this store's" in res.output, res.output
    res = invoke("decay", copy / "spectrum.zarr", "--out", copy / "decay")
    assert res.exit_code == 2
    assert "chunk sigma/c/0, holding rows 0..2 of 3, is not this store's" in one_error_line(res)
