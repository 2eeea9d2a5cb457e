"""The stores' readers with hostile files (issue 25): a gradient or spectrum store whose
``zarr.json`` documents or attributes lie about shape, dtype or layout, declare a huge shape,
nest without end, link a chunk out of the store, or hold values of the wrong JSON type.
Each gives a one-line ValueError naming the store, before anything is allocated, and
executes nothing. The stores are written by gradspec's own commands, then damaged.

Cases marked ``xfail(strict=True)`` are open findings for the stores' owner: what the store does
today is in each reason; fixing it turns the case into a failure (strict), so the mark goes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.store import GradientStore, RunLock, SpectrumStore, StoreDamagedError, open_store
from gradspec.store._zarr import DIGEST_KEY, attrs_digest

LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "5", "--no-progress"]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A per-example gradient store (143 x 40) and its k = 3 spectrum, from `collect` and `pca`."""
    root = tmp_path_factory.mktemp("stores")
    runner = CliRunner()
    for args in (["collect", "--out", root / "run", "--steps", "8", "--mode", "per-example", *LOWRANK],
                 ["pca", root / "run" / "gradients.zarr", "--k", "3", "--out", root / "spec.zarr", "--no-progress"]):
        res = runner.invoke(app, [str(a) for a in args])
        assert res.exit_code == 0, res.output
    return root


@pytest.fixture
def stores(made, tmp_path) -> tuple[Path, Path]:
    shutil.copytree(made, tmp_path / "s", symlinks=True)
    return tmp_path / "s" / "run" / "gradients.zarr", tmp_path / "s" / "spec.zarr"


def _edit(path: Path, change) -> None:
    """Rewrite the JSON document ``path`` after ``change(doc)``."""
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _attrs(store: Path, **values) -> None:
    """Attributes that lie, written as gradspec writes them (their digest stamped anew): what the
    checks of each attribute must refuse by themselves."""
    def change(doc):
        doc["attributes"].update(values)
        doc["attributes"][DIGEST_KEY] = attrs_digest(doc["attributes"])
    _edit(store / "zarr.json", change)


def _refused(fn, store: Path, *words: str) -> str:
    """``fn()`` raises a one-line ValueError (or StoreDamagedError) naming ``store`` and ``words``."""
    with pytest.raises((ValueError, StoreDamagedError)) as err:
        fn()
    msg = str(err.value)
    assert msg.strip() and "\n" not in msg.strip(), msg
    assert str(store) in msg and all(w in msg for w in words), msg
    return msg


def _info_one_line(store: Path, *words: str) -> None:
    res = CliRunner().invoke(app, ["info", str(store)])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert all(w in lines[0] for w in words), lines[0]


# ------------------------------------------------------------------ gradient stores: GradientStore.open / read
GRADIENT_LIES = {
    "grads-claims-more-columns": (lambda g: _edit(g / "grads" / "zarr.json", lambda d: d.update(shape=[d["shape"][0], 41])),
                                  "grads has shape"),
    "grads-claims-float64": (lambda g: _edit(g / "grads" / "zarr.json", lambda d: d.update(data_type="float64")),
                             "stored as float64 but the store says float32"),
    "layout-claims-another-shape": (lambda g: _attrs(g, **{"gradspec.layout": [
        {"name": "weight", "shape": [1, 41], "offset": 0, "numel": 41}]}), "p = 41 columns"),
    "layout-a-string": (lambda g: _attrs(g, **{"gradspec.layout": "weight"}), "no valid parameter layout"),
    "dtype-a-list": (lambda g: _attrs(g, **{"gradspec.dtype": ["float32"]}), "gradient dtype"),
    "rows-claims-10^15": (lambda g: _attrs(g, **{"gradspec.rows": 10**15}), "1000000000000000 rows are committed"),
    "rows-a-string": (lambda g: _attrs(g, **{"gradspec.rows": "143"}), "committed row count '143'"),
    "kind-a-list": (lambda g: _attrs(g, **{"gradspec.kind": ["gradients"]}), "unknown kind"),
    "format-a-string": (lambda g: _attrs(g, **{"gradspec.format": "1"}), "not a format number"),
    # each example's pre-clip norm, clip factor and norms per parameter (issue 22)
    "clip-factor-claims-float32": (lambda g: _edit(g / "meta" / "clip_factor" / "zarr.json",
                                                   lambda d: d.update(data_type="float32")),
                                   "meta/clip_factor' is not as written: its data type is float32, not float64"),
    "param-norms-claims-another-column-count": (lambda g: _edit(g / "param_norms" / "zarr.json",
                                                                lambda d: d.update(shape=[d["shape"][0], 7])),
                                                "param_norms has shape"),
    "pre-clip-norms-cut-short": (lambda g: _edit(g / "meta" / "pre_clip_norm" / "zarr.json",
                                                 lambda d: d.update(shape=[10])),
                                 "meta/pre_clip_norm holds only 10"),
    "example-norms-a-string": (lambda g: _attrs(g, **{"gradspec.example_norms": "yes"}), "gradspec.example_norms"),
    "example-norms-in-a-per-step-store": (lambda g: _attrs(g, **{"gradspec.per_example": False}),
                                          "holds one row per step"),
}


@pytest.mark.parametrize("name", list(GRADIENT_LIES))
def test_a_gradient_store_whose_documents_lie_is_refused_in_one_line(stores, name):
    gradients, _ = stores
    change, words = GRADIENT_LIES[name]
    change(gradients)
    _refused(lambda: open_store(gradients), gradients, words)
    _info_one_line(gradients, words)


def test_a_gradient_store_declaring_more_rows_than_committed_reads_only_the_committed_ones(stores):
    """grads/ and meta/ may be longer than the committed rows (a killed writer leaves them so)."""
    gradients, _ = stores
    before = GradientStore.open(gradients).read()
    for name in ("grads", "meta/step"):
        _edit(gradients / name / "zarr.json", lambda d: d.update(shape=[10**15, *d["shape"][1:]]))
    store = GradientStore.open(gradients)
    assert store.n_rows == before.shape[0]
    np.testing.assert_array_equal(store.read(), before)


@pytest.mark.parametrize("document", ["zarr.json", "grads/zarr.json"])
def test_a_deeply_nested_zarr_json_is_one_line(stores, document):
    gradients, _ = stores
    (gradients / document).write_text("[" * 100_000)
    _refused(lambda: GradientStore.open(gradients), gradients, "damaged")


def test_a_huge_declared_chunk_shape_is_refused_before_allocating(stores):
    gradients, _ = stores
    _edit(gradients / "grads" / "zarr.json", lambda d: d.update(
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": [10**9, 40]}}))
    _refused(lambda: GradientStore.open(gradients).read(), gradients, "chunk")


def test_a_chunk_linked_out_of_the_store_is_refused(stores, tmp_path):
    gradients, _ = stores
    chunk = next(p for p in (gradients / "grads").rglob("*") if p.is_file() and p.name != "zarr.json")
    outside = tmp_path / "outside"
    shutil.copy(chunk, outside)
    chunk.unlink()
    chunk.symlink_to(outside)
    _refused(lambda: GradientStore.open(gradients).read(), gradients, "link")


def _replace_a_chunk(array: Path, kind: str, outside: Path) -> Path:
    """Put a symbolic link (to a copy of the chunk outside the store) or a directory in the place
    of one of ``array``'s chunks; return the chunk's path."""
    chunk = next(p for p in sorted(array.rglob("*")) if p.is_file() and p.name != "zarr.json")
    shutil.copy(chunk, outside)
    chunk.unlink()
    if kind == "link":
        chunk.symlink_to(outside)
    else:
        chunk.mkdir()
    return chunk


CHUNK_IN_PLACE = {"link": "symbolic link", "directory": "not a regular file"}


@pytest.mark.parametrize("compressor", [None, "zstd"])
@pytest.mark.parametrize("kind", list(CHUNK_IN_PLACE))
def test_a_chunk_that_is_a_link_or_a_directory_is_named_by_every_reader(tmp_path, kind, compressor):
    """A linked chunk was "ok" to ``info --verify`` while pca refused it; in a compressed store pca
    read through the link (exit 0); a directory in a chunk's place was "Is a directory: 7" to pca
    and "missing" to verify. Every reader now names what is there, in one line."""
    runner = CliRunner()
    run = tmp_path / "run"
    extra = ["--compressor", compressor] if compressor else []
    res = runner.invoke(app, [str(a) for a in ["collect", "--out", run, "--steps", "8", *extra, *LOWRANK]])
    assert res.exit_code == 0, res.output
    gradients = run / "gradients.zarr"
    _replace_a_chunk(gradients / "grads", kind, tmp_path / "outside")
    what = CHUNK_IN_PLACE[kind]
    _refused(lambda: GradientStore.open(gradients).read(), gradients, what)
    res = runner.invoke(app, ["pca", str(gradients), "--k", "2", "--out", str(tmp_path / "spec.zarr"), "--no-progress"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code != 0 and lines[-1].startswith("error:") and what in lines[-1], res.output
    assert "Is a directory" not in res.output, res.output
    report = GradientStore.open(gradients).verify()
    assert not report["ok"] and [what in d["problem"] for d in report["damaged"]] == [True], report
    res = runner.invoke(app, ["info", str(gradients), "--verify"])
    assert res.exit_code != 0 and what in res.output, res.output


@pytest.mark.parametrize("kind", list(CHUNK_IN_PLACE))
def test_a_spectrum_chunk_that_is_a_link_or_a_directory_is_refused(stores, tmp_path, kind):
    _, spectrum = stores
    _replace_a_chunk(spectrum / "V", kind, tmp_path / "outside")
    what = CHUNK_IN_PLACE[kind]
    report = SpectrumStore.open(spectrum).verify()
    assert not report["ok"] and any(what in d["problem"] for d in report["damaged"]), report
    _refused(lambda: np.asarray(SpectrumStore.open(spectrum).V[:]), spectrum, what)


def test_attributes_of_the_wrong_json_type_are_refused(stores):
    gradients, _ = stores
    _attrs(gradients, **{"gradspec.per_example": "no"})
    _refused(lambda: GradientStore.open(gradients), gradients, "per_example")


def test_a_config_attribute_that_is_not_an_object_is_named(stores):
    gradients, _ = stores
    _attrs(gradients, **{"gradspec.config": [1, 2]})
    _refused(lambda: GradientStore.open(gradients).config, gradients, "config")


# ------------------------------------------------------------------ spectrum stores: SpectrumStore.open / accessors
SPECTRUM_LIES = {
    "shape-claims-another-p": ({"gradspec.shape": [143, 41]}, "V has shape (40, 3)"),
    "k-claims-10^12": ({"gradspec.k": 10**12}, "k = 1000000000000"),
}


@pytest.mark.parametrize("name", list(SPECTRUM_LIES))
def test_a_spectrum_store_whose_attributes_lie_is_refused_in_one_line(stores, name):
    _, spectrum = stores
    values, words = SPECTRUM_LIES[name]
    _attrs(spectrum, **values)
    _refused(lambda: SpectrumStore.open(spectrum), spectrum, words)
    _info_one_line(spectrum, words)


def test_a_spectrum_array_declaring_a_huge_shape_is_refused_before_it_is_read(stores):
    _, spectrum = stores
    _edit(spectrum / "sigma" / "zarr.json", lambda d: d.update(shape=[10**15]))
    _refused(lambda: SpectrumStore.open(spectrum).sigma, spectrum, "sigma has shape (1000000000000000,)")


@pytest.mark.parametrize("attr, value, read", [
    ("gradspec.shape", "abc", lambda s: SpectrumStore.open(s)),
    ("gradspec.frob2", "big", lambda s: SpectrumStore.open(s).frob2),
    ("gradspec.source", [1], lambda s: SpectrumStore.open(s).source),
    ("gradspec.params", [1], lambda s: SpectrumStore.open(s).params),
])
def test_spectrum_attributes_of_the_wrong_json_type_are_named(stores, attr, value, read):
    _, spectrum = stores
    _attrs(spectrum, **{attr: value})
    _refused(lambda: read(spectrum), spectrum, attr)


def test_info_of_a_spectrum_whose_accuracy_is_not_an_object_is_one_line(stores):
    _, spectrum = stores
    _attrs(spectrum, **{"gradspec.accuracy": "x"})
    _info_one_line(spectrum, "accuracy")


def test_a_resume_state_that_is_not_an_object_is_one_line(stores):
    _, spectrum = stores
    _attrs(spectrum, **{"gradspec.status": "interrupted", "gradspec.state": [1, 2]})
    _refused(lambda: SpectrumStore.open(spectrum).load_state(), spectrum, "state")


def test_a_resume_state_naming_arrays_outside_its_folder_reads_nothing_there(stores):
    _, spectrum = stores
    _attrs(spectrum, **{"gradspec.status": "interrupted",
                        "gradspec.state": {"iteration": 1, "arrays": ["../V"]}})
    with pytest.raises(ValueError, match=r"'\.' or '\.\.' segments"):
        SpectrumStore.open(spectrum).load_state()


# ------------------------------------------------------------------ the run lock: RunLock
def test_a_garbled_lock_file_is_no_owner(tmp_path):
    lock = RunLock(tmp_path)
    for text in ('{"pid": [1, 2], "host": {"a": 1}}', "[1]", "not json"):
        lock.path.write_text(text)
        owner = lock.owner()
        assert isinstance(owner, dict)
    with lock:
        assert json.loads(lock.path.read_text())["pid"] > 0


def test_a_deeply_nested_lock_file_is_no_owner(tmp_path):
    lock = RunLock(tmp_path)
    lock.path.write_text("[" * 100_000)
    assert lock.owner() == {}


def test_a_lock_file_linked_out_of_its_folder_is_not_written_through(tmp_path):
    folder, victim = tmp_path / "run", tmp_path / "victim"
    folder.mkdir()
    victim.write_text("the user's own file")
    (folder / ".gradspec.lock").symlink_to(victim)
    lock = RunLock(folder)
    try:
        with pytest.raises((ValueError, OSError)):
            lock.acquire()
    finally:
        lock.release()
        assert victim.read_text() == "the user's own file"
