"""Each per-example row's own pre-clip norm, clip factor and norms per parameter (issue 22):
row-aligned through every write, commit, truncation and resume; damage to them is one line and
costs no gradient row; stores written before they existed still open, read and append."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from cli.main import app
from gradspec.collect import GradientRecorder
from gradspec.store import (
    META_FIELDS,
    BackgroundWriter,
    GradientStore,
    ParamLayout,
    StoreDamagedError,
    update_attrs,
)
from tests.store.test_checksums import drop_row_sums, restamp_rows

LAYOUT = ParamLayout.from_shapes([("w", (4, 3)), ("b", (4,)), ("v", (5,))])  # p = 21, 3 parameters
C = 1.0


def block(b: int, start: int, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``b`` clipped rows with their metadata; pre-clip norms differ per row and per seed."""
    rng = np.random.default_rng(seed * 1000 + start)
    raw = rng.standard_normal((b, LAYOUT.p)) * rng.uniform(0.05, 0.5, (b, 1))
    norms = np.linalg.norm(raw, axis=1)
    factors = np.minimum(1.0, C / norms)
    per_param = np.stack([np.linalg.norm(raw[:, s.offset : s.stop], axis=1) for s in LAYOUT.params], axis=1)
    meta = {k: np.arange(start, start + b) for k in META_FIELDS}
    meta.update(example_index=np.arange(start, start + b), pre_clip_norm=norms, clip_factor=factors,
                param_norms=per_param)
    return (raw * factors[:, None]).astype(np.float32), meta


def test_a_new_per_example_store_keeps_them_and_a_per_step_store_does_not(tmp_path):
    store = GradientStore.create(tmp_path / "e.zarr", layout=LAYOUT, per_example=True)
    assert store.has_example_norms and {"pre_clip_norm", "clip_factor"} <= set(store.meta_fields)
    steps = GradientStore.create(tmp_path / "s.zarr", layout=LAYOUT)
    assert not steps.has_example_norms and "pre_clip_norm" not in steps.meta_fields
    with pytest.raises(ValueError, match="one row per step") as err:
        steps.row_norms()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("background", [False, True])
def test_they_stay_aligned_with_the_rows_through_chunked_writes_and_a_truncation(tmp_path, background):
    """Blocks that straddle row chunks, a commit in the middle, a truncation back to an earlier
    commit (a resume from its checkpoint) and new rows written over the forgotten ones."""
    store = GradientStore.create(tmp_path / "g.zarr", layout=LAYOUT, per_example=True, rows_per_chunk=4)
    writer = BackgroundWriter(store, background=background, max_queue=2)
    want_rows, want_meta = [], []
    for start, b in ((0, 3), (3, 6), (9, 2)):
        rows, meta = block(b, start)
        writer.put(rows, meta)
        want_rows.append(rows)
        want_meta.append(meta)
        if start == 3:
            writer.commit()
    writer.close()
    assert store.n_rows == 11
    store.truncate(9)  # back to the commit after 9 rows: the last block is forgotten
    rows, meta = block(3, 9, seed=1)  # and replaced by other rows with other norms
    store.append(rows, meta)
    want_rows[-1], want_meta[-1] = rows, meta
    store.set_status("complete")

    s = GradientStore.open(tmp_path / "g.zarr")
    assert s.n_rows == 12
    np.testing.assert_array_equal(s.read(), np.concatenate(want_rows))
    for got, key in ((s.row_norms(), "pre_clip_norm"), (s.clip_factors(), "clip_factor"),
                     (s.param_norms(), "param_norms")):
        np.testing.assert_array_equal(got, np.concatenate([m[key] for m in want_meta]))  # float64, bit for bit
    np.testing.assert_array_equal(s.row_meta()["pre_clip_norm"], s.row_norms())
    np.testing.assert_array_equal(s.param_norms([2, 10]), s.param_norms()[[2, 10]])
    assert s.param_norms().shape == (12, 3) and s.param_norms().dtype == np.float64
    summary = s.summary()["example_norms"]
    norms = s.row_norms()
    assert summary["pre_clip_norm_median"] == float(np.median(norms))
    assert summary["pre_clip_norm_max"] == float(norms.max())
    assert summary["frac_clipped"] == float((norms > C).mean()) and 0 < summary["frac_clipped"] < 1


@pytest.mark.parametrize("change, words", [
    (lambda m: m.pop("param_norms"), "missing ['param_norms']"),
    (lambda m: m.pop("clip_factor"), "missing ['clip_factor']"),
    (lambda m: m.update(param_norms=m["param_norms"][:, :2]), "param_norms"),
    (lambda m: m["pre_clip_norm"].__setitem__(1, np.nan), "pre_clip_norm of row 1"),
    (lambda m: m["pre_clip_norm"].__setitem__(0, -1.0), "pre_clip_norm of row 0"),
    (lambda m: m["clip_factor"].__setitem__(2, 1.5), "clip_factor of row 2"),
    (lambda m: m["clip_factor"].__setitem__(2, 0.0), "clip_factor of row 2"),
    (lambda m: m["param_norms"].__setitem__((1, 2), np.inf), "param_norms of row 1"),
], ids=["no-param-norms", "no-factor", "param-norms-2-columns", "nan-norm", "negative-norm",
        "factor-above-1", "factor-0", "inf-param-norm"])
def test_writing_norms_no_clipping_gives_is_refused_and_writes_nothing(tmp_path, change, words):
    store = GradientStore.create(tmp_path / "g.zarr", layout=LAYOUT, per_example=True)
    store.append(*block(2, 0))
    rows, meta = block(3, 2)
    change(meta)
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        store.write_rows(2, rows, meta)
    assert store.n_rows == 2 and store.row_norms().shape == (2,)


def _old(path) -> None:
    """Make ``path`` what a per-example store written before issue 22 is: no attribute, no arrays."""
    group = zarr.open_group(str(path), mode="r+")
    update_attrs(group, {}, remove=("gradspec.example_norms",))
    for name in ("meta/pre_clip_norm", "meta/clip_factor", "param_norms"):
        shutil.rmtree(path / name)
    drop_row_sums(path)  # they came later still


def test_a_store_written_before_them_opens_reads_and_resumes_without_them(tmp_path):
    layout = ParamLayout.from_shapes([("w", (6,))])
    with GradientRecorder(out=tmp_path, layout=layout, per_example=True, max_grad_norm=C) as rec:
        rec.record_examples(grads=np.ones((3, 6), "float32"), step=0, loss=1.0)
    path = tmp_path / "gradients.zarr"
    _old(path)
    store = GradientStore.open(path)
    before = store.read()
    assert not store.has_example_norms and store.n_rows == 3 and "pre_clip_norm" not in store.row_meta()
    with pytest.raises(ValueError, match="written before gradspec kept them") as err:
        store.clip_factors()
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert store.summary()["example_norms"] is None and store.verify()["ok"]
    res = CliRunner().invoke(app, ["info", str(path)])
    assert res.exit_code == 0 and "norms    per example: not kept" in res.output, res.output

    with GradientRecorder(out=tmp_path, layout=layout, per_example=True, max_grad_norm=C, resume=True) as rec:
        rec.record_examples(grads=np.full((2, 6), 2.0, "float32"), step=1, loss=1.0)  # the new code, the old format
    store = GradientStore.open(path)
    assert store.n_rows == 5 and not store.has_example_norms and store.verify()["ok"]
    np.testing.assert_array_equal(store.read(rows=slice(0, 3)), before)


@pytest.fixture
def written(tmp_path):
    store = GradientStore.create(tmp_path / "g.zarr", layout=LAYOUT, per_example=True)
    for start in (0, 4):
        store.append(*block(4, start))
    store.set_status("complete")
    return tmp_path / "g.zarr"


@pytest.mark.parametrize("name, index, value, problem", [
    ("meta/pre_clip_norm", 5, np.nan, "non_finite"),
    ("meta/clip_factor", 2, np.inf, "non_finite"),
    ("param_norms", (6, 1), np.nan, "non_finite"),
    ("meta/clip_factor", 3, 1.25, "out_of_range"),
    ("meta/pre_clip_norm", 0, -2.0, "out_of_range"),
])
def test_a_value_no_clipping_gives_is_one_line_and_the_rows_still_read(written, name, index, value, problem):
    rows = GradientStore.open(written).read()
    arr = zarr.open_array(str(written / name), mode="r+")
    arr[index] = value
    restamp_rows(written)  # as a writer that stored the value would have (else "not this store's")
    store = GradientStore.open(written)
    np.testing.assert_array_equal(store.read(), rows)  # nothing lost
    readers = {"meta/pre_clip_norm": store.row_norms, "meta/clip_factor": store.clip_factors,
               "param_norms": store.param_norms}
    read = readers.pop(name)
    row = index[0] if isinstance(index, tuple) else index
    with pytest.raises(StoreDamagedError) as err:
        read()
    msg = str(err.value)
    assert "\n" not in msg and str(written) in msg and f"{name} of committed row {row}" in msg, msg
    for other in readers.values():
        assert other().shape[0] == 8  # the other arrays still read
    report = store.verify()
    assert not report["ok"] and report[problem][name]["rows"] == [row]
    res = CliRunner().invoke(app, ["info", str(written)])
    assert res.exit_code == 1 and f"{name} of committed row {row}" in res.output, res.output
    res = CliRunner().invoke(app, ["info", "--verify", "--no-progress", str(written)])
    assert res.exit_code == 1 and name in res.output, res.output


def test_an_array_cut_short_is_damage_named_in_one_line(written):
    zarr.open_array(str(written / "meta" / "clip_factor"), mode="r+").resize((5,))
    with pytest.raises(StoreDamagedError, match="8 rows are committed but meta/clip_factor holds only 5") as err:
        GradientStore.open(written)
    assert "\n" not in str(err.value)


def test_info_shows_them_in_one_line(written):
    res = CliRunner().invoke(app, ["info", str(written)])
    assert res.exit_code == 0, res.output
    norms = GradientStore.open(written).row_norms()
    line = next(x for x in res.output.splitlines() if x.startswith("norms"))
    assert (f"pre-clip median {np.median(norms):.3g} max {norms.max():.3g}, "
            f"clipped {(norms > C).mean():.1%} of 8 rows") in line, line


def test_a_verify_from_a_row_checks_the_norm_ranges_of_those_rows_only(written):
    """A resume verifies the chunk it appends to (``verify(start=...)``): the norms' range check
    reads the rows from there on, not every row, and names them by their index in the store."""
    arr = zarr.open_array(str(written / "meta" / "clip_factor"), mode="r+")
    arr[3], arr[6] = 1.25, 1.5
    restamp_rows(written)
    store = GradientStore.open(written)
    assert store.verify()["out_of_range"]["meta/clip_factor"]["rows"] == [3, 6]
    assert store.verify(start=5)["out_of_range"]["meta/clip_factor"]["rows"] == [6]
