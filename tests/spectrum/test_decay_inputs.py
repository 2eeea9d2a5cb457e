"""What decay is given that would have made a plausible wrong answer with exit code 0 (an audit):
a spectrum of sketched rows, measured as if the sketch were the gradients (Theorem 3.3's verdict
flipped against the same run collected unsketched), and another task's store passed as held-out
rows (the layout was the only check)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
BOW = ["--task", "bow", "-t", "n=400", "-t", "n_eval=100", "-t", "n_public=20", "-t", "vocab=30", "-t", "n_stop=3",
       "-t", "doc_len=10", "--batch-size", "20", "--lr", "0.1", "--optimizer", "sgd", "--eval-every", "0",
       "--checkpoint-every", "10", "--no-progress", "--steps", "30", "--noise-multiplier", "1"]


def _ok(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res


def test_decay_of_a_sketched_spectrum_measures_sigma_only_and_says_why(tmp_path):
    _ok("collect", "--out", tmp_path / "sk", *BOW, "--sketch", 40, "--sketch-blocks", 2)
    _ok("pca", tmp_path / "sk" / "gradients.zarr", "--k", 6, "--rows", "0:20", "--out", tmp_path / "s.zarr",
        "--no-progress")
    _ok("decay", tmp_path / "s.zarr", "--out", tmp_path / "d", "--no-plots", "--no-progress")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert not report.get("rows") and any("sketched rows" in n and "σ only" in n for n in report["notes"]), report
    res = runner.invoke(app, ["decay", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "d2"), "--heldout-rows",
                              "20:30", "--no-plots", "--no-progress"])
    assert res.exit_code != 0 and "sketches" in res.output, res.output


def test_held_out_rows_of_another_task_carry_a_note(tmp_path):
    common = ["--batch-size", "20", "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "0", "--no-progress",
              "--noise-multiplier", "1", "--steps", "20"]
    _ok("collect", "--out", tmp_path / "a", "--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", *common)
    _ok("collect", "--out", tmp_path / "b", "--task", "ballglm", "-t", "n=200", "-t", "d=40", *common)
    _ok("pca", tmp_path / "a" / "gradients.zarr", "--k", 3, "--out", tmp_path / "s.zarr", "--no-progress")
    _ok("decay", tmp_path / "s.zarr", "--gradients", tmp_path / "b" / "gradients.zarr", "--out", tmp_path / "d",
        "--no-plots", "--no-progress")
    notes = json.loads((tmp_path / "d" / "report.json").read_text())["notes"]
    assert any("task 'ballglm'" in n and "task 'lowrank'" in n for n in notes), notes
    # the same task's other run: no such note
    _ok("decay", tmp_path / "s.zarr", "--gradients", tmp_path / "a" / "gradients.zarr", "--out", tmp_path / "d2",
        "--no-plots", "--no-progress")
    assert not any("task '" in n for n in json.loads((tmp_path / "d2" / "report.json").read_text())["notes"])


def test_a_longer_run_of_the_same_seed_holds_out_only_its_new_rows(tmp_path):
    """Its first rows are the spectrum's own, bit for bit: counted as held out, they read as in-sample G_k."""
    common = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20", "--lr", "0.05",
              "--optimizer", "sgd", "--eval-every", "0", "--no-progress", "--noise-multiplier", "1", "--seed", "3"]
    _ok("collect", "--out", tmp_path / "a", *common, "--steps", "20")
    _ok("collect", "--out", tmp_path / "b", *common, "--steps", "32")
    _ok("pca", tmp_path / "a" / "gradients.zarr", "--k", 3, "--out", tmp_path / "s.zarr", "--no-progress")
    longer = tmp_path / "b" / "gradients.zarr"
    _ok("decay", tmp_path / "s.zarr", "--gradients", longer, "--out", tmp_path / "d", "--no-plots", "--no-progress")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["sources"]["heldout"]["n_rows"] == 12, report["sources"]
    assert any("20 of the rows" in n and "left out of the held-out rows" in n for n in report["notes"]), report["notes"]
    # the same, by the digest alone, when the source store is gone
    import shutil

    shutil.rmtree(tmp_path / "a")
    _ok("decay", tmp_path / "s.zarr", "--gradients", longer, "--out", tmp_path / "d2", "--no-plots", "--no-progress")
    again = json.loads((tmp_path / "d2" / "report.json").read_text())
    assert again["sources"]["heldout"]["n_rows"] == 12
    assert again["rows"]["heldout"] == report["rows"]["heldout"]
    res = runner.invoke(app, ["decay", str(tmp_path / "s.zarr"), "--gradients", str(longer), "--heldout-rows", "10:32",
                              "--out", str(tmp_path / "d3"), "--no-plots", "--no-progress"])
    assert res.exit_code != 0 and "rows the spectrum was computed from" in res.output, res.output


def test_the_spectrum_rows_elsewhere_in_another_store_are_found_row_by_row(tmp_path):
    """The spectrum's rows at other indices of a store of another config (here 3 new rows, then the
    source's 20): found by their metadata while the source store is there, and left out."""
    import numpy as np

    from gradspec.store import GradientStore

    _ok("collect", "--out", tmp_path / "a", "--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3",
        "--batch-size", "20", "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "0", "--no-progress",
        "--noise-multiplier", "1", "--steps", "20")
    src = GradientStore.open(tmp_path / "a" / "gradients.zarr")
    rows, meta = src.read(), src.row_meta()
    fresh = np.random.default_rng(0).standard_normal((3, src.p)).astype(np.float32)
    new_meta = {name: np.concatenate([values[:3] + 1000, values]) for name, values in meta.items()}
    other = GradientStore.create(tmp_path / "c.zarr", layout=src.layout, config={**src.config, "note": "moved"},
                                 dtype=src.dtype, per_example=src.per_example)
    other.append(np.concatenate([fresh, rows]), new_meta)
    _ok("pca", tmp_path / "a" / "gradients.zarr", "--k", 3, "--out", tmp_path / "s.zarr", "--no-progress")
    _ok("decay", tmp_path / "s.zarr", "--gradients", tmp_path / "c.zarr", "--out", tmp_path / "d", "--no-plots",
        "--no-progress")
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["sources"]["heldout"]["n_rows"] == 3, report["sources"]
    assert any("20 of the rows" in n and "3:23" in n for n in report["notes"]), report["notes"]


def test_rows_with_the_spectrum_rows_metadata_but_other_gradients_stay_held_out(tmp_path):
    """Metadata alone does not make a row the spectrum's: the content is compared (bytes while the
    source store is there, pca's recorded row norms once it is gone)."""
    import shutil

    import numpy as np

    from gradspec.store import GradientStore

    _ok("collect", "--out", tmp_path / "a", "--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3",
        "--batch-size", "20", "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "0", "--no-progress",
        "--noise-multiplier", "1", "--steps", "20")
    src = GradientStore.open(tmp_path / "a" / "gradients.zarr")
    other = GradientStore.create(tmp_path / "c.zarr", layout=src.layout, config={**src.config, "note": "other"},
                                 dtype=src.dtype, per_example=src.per_example)
    other.append(np.random.default_rng(1).standard_normal((20, src.p)).astype(np.float32), src.row_meta())
    _ok("pca", tmp_path / "a" / "gradients.zarr", "--k", 3, "--out", tmp_path / "s.zarr", "--no-progress")
    for name in ("d", "d2"):
        _ok("decay", tmp_path / "s.zarr", "--gradients", tmp_path / "c.zarr", "--out", tmp_path / name,
            "--no-plots", "--no-progress")
        report = json.loads((tmp_path / name / "report.json").read_text())
        assert report["sources"]["heldout"]["n_rows"] == 20, report["sources"]
        assert not any("left out of the held-out rows" in n for n in report["notes"]), report["notes"]
        shutil.rmtree(tmp_path / "a", ignore_errors=True)  # the second time: pca's row norms are compared
