"""A finished spectrum store's chunk manifest: a chunk of V, U or σ copied from another spectrum
store, or moved within one, is damage.

Before it, such a chunk carried its own valid CRC-32C: `read_v`, `V[...]`, `iter_v_blocks` and
`verify` returned another spectrum's directions with no error, and `retrain --projector` would
have trained in them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from gradspec.linalg import pca
from gradspec.store import StoreDamagedError, update_attrs
from gradspec.store._manifest import MANIFEST_KEY, record, stored_trailer
from gradspec.store._spectrum import SpectrumStore


def spectrum(path, seed=1, r=12, p=128, k=3):
    h = np.random.default_rng(seed).standard_normal((r, p))
    res = pca(source=h, k=k, method="gram", v_dtype="float64")
    spec = SpectrumStore.create(path, r=r, p=p, k=k, method="gram", params=res.params, source=res.source,
                                source_rows=np.arange(r), v_dtype="float64", v_chunk_rows=16)
    with spec.v_sink() as sink:
        sink(0, res.V)
    spec.finish(res)
    return SpectrumStore.open(path), res


def restamp(path):
    """Record a spectrum store's chunk manifest again, as the writer of its arrays' present values
    would have (for tests that change them with plain zarr; otherwise every read of a changed
    chunk is "not this store's")."""
    group = zarr.open_group(str(path), mode="r+")
    names = [n for n in group.attrs[MANIFEST_KEY] if n in group]
    update_attrs(group, {MANIFEST_KEY: record({n: group[n] for n in names})})


def chunk(path, name, key):
    return Path(path) / name / "c" / key


def readers(spec):
    return {"read_v": lambda: spec.read_v(), "V[...]": lambda: spec.V[30:40, :2],
            "iter_v_blocks": lambda: list(spec.iter_v_blocks(40))}


def test_the_manifest_records_the_crc_each_chunk_file_ends_with(tmp_path):
    spec, _ = spectrum(tmp_path / "s")
    man = spec.attrs[MANIFEST_KEY]
    assert set(man) >= {"V", "U", "sigma", "residuals", "source_rows"}
    assert len(man["V"]) == 8  # 128 rows in chunks of 16, one column chunk
    v = spec._arr("V")
    for i in range(8):
        raw = chunk(tmp_path / "s", "V", f"{i}/0").read_bytes()
        assert man["V"][i] == int.from_bytes(raw[-4:], "little") == stored_trailer(v, (i, 0))


def test_a_v_chunk_copied_from_another_spectrum_is_damage_on_every_read(tmp_path):
    spec, res = spectrum(tmp_path / "s")
    spectrum(tmp_path / "o", seed=2)
    for read in readers(spec).values():  # a healthy store reads
        read()
    assert spec.verify()["ok"]
    np.testing.assert_array_equal(spec.read_v(), res.V)
    shutil.copy(chunk(tmp_path / "o", "V", "2/0"), chunk(tmp_path / "s", "V", "2/0"))
    spec = SpectrumStore.open(tmp_path / "s")
    for name, read in readers(spec).items():
        with pytest.raises(StoreDamagedError, match=r"chunk V/c/2/0, holding rows 32\.\.47 of 128, is not this "
                           r"store's: its own checksum holds") as err:
            read()
        assert "\n" not in str(err.value), name
    assert spec.V[:32, :2].shape == (32, 2)  # reads that miss it still work
    rep = spec.verify()
    assert not rep["ok"] and [(d["array"], d["chunk"]) for d in rep["damaged"]] == [("V", "c/2/0")]
    assert rep["damaged"][0]["problem"].startswith("not this store's")


@pytest.mark.parametrize("name,key,read", [("sigma", "0", lambda s: s.sigma), ("U", "0/0", lambda s: s.U)])
def test_sigma_or_u_from_another_spectrum_is_damage(tmp_path, name, key, read):
    spectrum(tmp_path / "s")
    spectrum(tmp_path / "o", seed=2)
    shutil.copy(chunk(tmp_path / "o", name, key), chunk(tmp_path / "s", name, key))
    with pytest.raises(StoreDamagedError, match=rf"chunk {name}/c/{key}, .*is not this store's"):
        read(SpectrumStore.open(tmp_path / "s"))


def test_two_v_chunks_swapped_are_both_damage(tmp_path):
    spectrum(tmp_path / "s")
    a, b = chunk(tmp_path / "s", "V", "1/0"), chunk(tmp_path / "s", "V", "6/0")
    ta, tb = a.read_bytes(), b.read_bytes()
    a.write_bytes(tb)
    b.write_bytes(ta)
    spec = SpectrumStore.open(tmp_path / "s")
    with pytest.raises(StoreDamagedError, match=r"chunk V/c/1/0.*not this store's.*and 1 more damaged chunks"):
        spec.read_v()
    assert [d["chunk"] for d in spec.verify()["damaged"]] == ["c/1/0", "c/6/0"]


def test_a_spectrum_written_before_the_manifest_reads_as_before(tmp_path):
    _, res = spectrum(tmp_path / "s")
    update_attrs(zarr.open_group(str(tmp_path / "s"), mode="r+"), {}, remove=(MANIFEST_KEY,))
    old = SpectrumStore.open(tmp_path / "s")
    assert old._checks.manifest is None
    np.testing.assert_array_equal(old.read_v(), res.V)
    assert old.verify()["ok"]


def test_a_chunk_crc_is_read_from_a_store_that_is_not_local_disk():
    """The path remote stores take (a suffix read through the zarr store), on zarr's MemoryStore."""
    import google_crc32c
    from zarr.codecs import Crc32cCodec

    g = zarr.open_group(store=zarr.storage.MemoryStore(), mode="w")
    a = g.create_array("V", shape=(40, 3), chunks=(16, 3), dtype="float64", compressors=[Crc32cCodec()],
                       fill_value=0)
    a[:] = np.arange(120.0).reshape(40, 3)
    assert stored_trailer(a, (0, 0)) == google_crc32c.value(np.arange(48.0).tobytes())
    edge = np.zeros((16, 3))
    edge[:8] = np.arange(96.0, 120.0).reshape(8, 3)  # the last chunk, padded with the fill value
    assert stored_trailer(a, (2, 0)) == google_crc32c.value(edge.tobytes())
    assert record({"V": a})["V"][2] == stored_trailer(a, (2, 0))
    assert stored_trailer(a, (5, 0)) is None  # not stored
