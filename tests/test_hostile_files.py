"""Files from someone else are data: every reader outside ``gradspec.store`` refuses a hostile
file with a one-line error and executes nothing (issue 25). ``docs/bad-inputs.md`` ("Readers
of files") lists each reader with its test here, in ``tests/train/test_checkpoint_safety.py``
(checkpoint.pt, config.json, run.json, links out of a run folder) and in
``tests/store/test_hostile_stores.py`` (the stores).

The payload is a real pickle whose ``__reduce__`` would create a marker file; each test
checks the marker is never created and the error is one line. Stores, spectra, reports and
sweeps are made by gradspec's own writers, then damaged.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from gradspec.optim import load_side_information, make_algorithm, retrain, sweep
from gradspec.optim._result import _digest as result_digest
from gradspec.plot import load_curve
from gradspec.store._zarr import DIGEST_KEY, attrs_digest
from gradspec.train._checkpoint import CHECKPOINT_FORMAT, load_checkpoint

from .optim._cases import config, lowrank_task


class _Payload:
    """Unpickling this runs ``os.system`` (creating a marker file): what a hostile file holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile(path: Path, marker: Path, **extra) -> Path:
    torch.save({"format": CHECKPOINT_FORMAT, **extra, "payload": _Payload(marker)}, path)
    return path


def _one_line(message: str) -> None:
    assert message and "\n" not in message.strip() and "Traceback" not in message, message


def test_a_hostile_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    with pytest.raises(ValueError) as err:
        load_checkpoint(_hostile(tmp_path / "checkpoint.pt", marker), required=("step",))
    assert not marker.exists()
    _one_line(str(err.value))
    assert "could run code" in str(err.value) and "--overwrite" in str(err.value)


LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "5", "--checkpoint-every", "4",
           "--no-progress"]


def test_collect_resume_of_a_run_with_a_hostile_checkpoint_runs_nothing(tmp_path):
    """`gradspec collect --resume --out <folder>` with a planted checkpoint.pt: exit 1, one line."""
    out, marker = tmp_path / "run", tmp_path / "marker"
    runner = CliRunner()
    first = runner.invoke(app, ["collect", "--out", str(out), "--steps", "8", "--stop-after", "4", *LOWRANK])
    assert first.exit_code == 0, first.output
    good = torch.load(out / "checkpoint.pt", weights_only=True)
    _hostile(out / "checkpoint.pt", marker, **{k: v for k, v in good.items() if k != "format"})
    res = runner.invoke(app, ["collect", "--out", str(out), "--resume"])
    assert res.exit_code != 0 and not marker.exists()
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "could run code" in lines[0], res.output


@pytest.mark.parametrize("algorithm, options", [
    ("dp-sgd", {}), ("pdp-sgd", {"rank": 2}), ("rpdp-sgd", {"rank": 2}),
    ("noisy-adagrad", {"rank": 2}), ("adadps", {}), ("dp-adam", {}),
])
def test_every_algorithms_checkpoint_loads_without_pickles(tmp_path, algorithm, options):
    """What the trainer and every optimizer hook save is tensors and plain values only, so
    resuming never needs the unrestricted unpickler."""
    retrain(config=config(steps=3), algorithm=make_algorithm(algorithm, **options), out=tmp_path,
            task=lowrank_task())
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["format"] == CHECKPOINT_FORMAT and state["step"] == 3
    loaded = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded.keys() == state.keys() - {"digest"} and loaded["hooks"].keys() == state["hooks"].keys()


def test_a_hostile_side_information_file_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    pt = tmp_path / "side.pt"
    torch.save(_Payload(marker), pt)
    obj = tmp_path / "side.npy"
    np.save(obj, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
    wrong = tmp_path / "dict.pt"
    torch.save({"a": torch.ones(3)}, wrong)
    text = tmp_path / "side.txt"
    text.write_text("1 2 x")
    huge = tmp_path / "huge.npy"  # a header that declares 10^12 entries over 4 stored ones
    with open(huge, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
        f.write(np.ones(4).tobytes())
    view = tmp_path / "view.pt"  # a tensor of 10^12 entries over a storage of one (an expanded view)
    torch.save(torch.ones(1).expand(10**12), view)
    for path, why in ((pt, "could run code"), (obj, "Python objects"), (wrong, "not a tensor"),
                      (text, "x"), (huge, "greater than file size"), (view, "expanded view")):
        with pytest.raises(ValueError) as err:
            load_side_information(path, p=3)
        _one_line(str(err.value))
        assert why in str(err.value) and str(path) in str(err.value), str(err.value)
    assert not marker.exists()
    good = tmp_path / "good.pt"
    torch.save(torch.tensor([1.0, 2.0, 3.0]), good)
    assert load_side_information(good, p=3).tolist() == [1.0, 2.0, 3.0]


def test_hostile_model_weights_of_the_text_task_are_refused_and_run_nothing(tmp_path):
    """`-t model=DIR`: transformers reads DIR's pytorch_model.bin with weights_only=True."""
    from transformers import BertConfig

    from gradspec.tasks._textmodel import load_text_model

    marker, model = tmp_path / "marker", tmp_path / "model"
    BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
               intermediate_size=8).save_pretrained(model)
    torch.save({"bert.embeddings.word_embeddings.weight": _Payload(marker)}, model / "pytorch_model.bin")
    with pytest.raises(ValueError) as err:
        load_text_model(str(model))
    _one_line(str(err.value))
    assert "could run code" in str(err.value) and str(model) in str(err.value)
    assert not marker.exists()


# ------------------------------------------------------------------ sweeps: retrain.json, metrics.jsonl
@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweep")
    sweep(config=config(steps=2), algorithms=["dp-sgd"], seeds=[0], out=out)
    return out


@pytest.fixture
def shared_sweep(finished_sweep, tmp_path) -> Path:
    """The finished sweep as someone else's folder, copied here (its files record their old paths)."""
    out = tmp_path / "shared"
    shutil.copytree(finished_sweep, out)
    return out


def _again(out: Path):
    return sweep(config=config(steps=2), algorithms=["dp-sgd"], seeds=[0], out=out)


def test_a_reused_sweep_run_reads_its_own_files_not_the_paths_it_recorded(shared_sweep, tmp_path):
    run = shared_sweep / "dp-sgd-seed0"
    saved = json.loads((run / "retrain.json").read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "metrics.jsonl").write_text('{"step": 1, "eval_loss": 123.0}\n')
    saved.update(out=str(elsewhere), metrics=str(elsewhere / "metrics.jsonl"))
    (run / "retrain.json").write_text(_stamped(saved))
    rows = _again(shared_sweep)
    assert rows[0]["out"] == str(run)
    steps, values = load_curve(Path(rows[0]["out"]) / "metrics.jsonl", "eval_loss")
    assert 123.0 not in values.tolist() and len(steps) > 0


RESULTS = {
    "a-list": ("[1]", "not list"),
    "deeply-nested": ("[" * 100_000, "nests too deeply"),
    "not-json": ("{x", "not JSON"),
    "epsilon-a-string": ({"epsilon": "x"}, "'epsilon' is 'x'"),
    "steps-a-float": ({"steps": 2.5}, "'steps' is 2.5"),
    "metrics-not-numbers": ({"final_metrics": {"eval_loss": "low"}}, "'final_metrics' are not all numbers"),
    "no-algorithm": ({"algorithm": None}, "'algorithm' is None"),
    "settings-config-a-string": ({"settings": {"config": "x", "options": {}}}, "lack the config"),
}


@pytest.mark.parametrize("name", list(RESULTS))
def test_a_damaged_retrain_json_is_one_line_when_a_sweep_would_reuse_it(shared_sweep, name):
    change, words = RESULTS[name]
    path = shared_sweep / "dp-sgd-seed0" / "retrain.json"
    if isinstance(change, dict):
        change = _stamped({**json.loads(path.read_text()), **change})
    path.write_text(change)
    with pytest.raises(ValueError) as err:
        _again(shared_sweep)
    _one_line(str(err.value))
    assert words in str(err.value) and str(path) in str(err.value), str(err.value)


@pytest.mark.parametrize("text, words", [
    ('{"step": 1, "eval_loss": 0.5}\n[1, 2]\n', "line 2 is not a JSON object"),
    ('{"step": 1, "eval_loss": 0.5}\n{"step": "2", "eval_loss": 0.4}\n', "line 2 has step '2'"),
    ('{"step": 1, "eval_loss": [0.5]}\n', "line 1 has step 1 and eval_loss [0.5]"),
    ('{"step": 1, "eval_loss": 0.5}\n{"step": 2\n', "line 2 is not a JSON object"),
    ("[" * 100_000 + "\n", "line 1 is not a JSON object"),
])
def test_a_damaged_metrics_jsonl_is_one_line_for_the_figures(tmp_path, text, words):
    path = tmp_path / "metrics.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        load_curve(path, "eval_loss")
    _one_line(str(err.value))
    assert words in str(err.value) and str(path) in str(err.value), str(err.value)
    path.write_bytes(b'{"step": 1, "eval_loss": 0.5}\n\xff\xfe\n')
    with pytest.raises(ValueError, match="not UTF-8"):
        load_curve(path, "eval_loss")
    path.write_text('{"step": 1, "eval_loss": 0.5}\n\n{"step": 2, "loss": 3}\n{"step": 3, "eval_loss": 0.25}\n')
    steps, values = load_curve(path, "eval_loss")
    assert steps.tolist() == [1, 3] and values.tolist() == [0.5, 0.25]


# ------------------------------------------------------------------ spectra and decay reports
@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    """A run, its spectrum and its decay report, written by gradspec's own commands."""
    root = tmp_path_factory.mktemp("analysed")
    runner = CliRunner()
    for args in (["collect", "--out", root / "run", "--steps", "8", "--mode", "per-example", *LOWRANK],
                 ["pca", root / "run" / "gradients.zarr", "--k", "3", "--out", root / "spec.zarr", "--no-progress"],
                 ["decay", root / "spec.zarr", "--out", root / "decay", "--no-plots"]):
        res = runner.invoke(app, [str(a) for a in args])
        assert res.exit_code == 0, res.output
    return root


@pytest.fixture
def copy(analysed, tmp_path) -> Path:
    shutil.copytree(analysed, tmp_path / "a")
    return tmp_path / "a"


def _cli_fails(*args, words: str) -> str:
    res = CliRunner().invoke(app, [str(a) for a in args])
    lines = [line for line in res.output.splitlines() if line.strip() and not line.startswith(("INFO", "WARNING"))]
    assert res.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert words in lines[0], lines[0]
    return lines[0]


def _edit_json(path: Path, change) -> None:
    """Rewrite a JSON document after ``change``; a store's attributes get their digest stamped
    anew (a record that lies, written as gradspec writes: what its own checks must refuse)."""
    data = json.loads(path.read_text())
    change(data)
    if path.name == "zarr.json" and DIGEST_KEY in data.get("attributes", {}):
        data["attributes"][DIGEST_KEY] = attrs_digest(data["attributes"])
    if path.name == "report.json" and "digest" in data:  # a decay report's digest of its values
        from gradspec._files import json_sha256

        data["digest"] = json_sha256({k: v for k, v in data.items() if k != "digest"})
    path.write_text(json.dumps(data))


def _stamped(result: dict) -> str:
    """A retrain.json's text with the digest of its (edited) values, as gradspec writes one."""
    body = {k: v for k, v in result.items() if k != "digest"}
    return json.dumps({**body, "digest": result_digest(body)})


REPORTS = {
    "no-spectrum": (lambda r: r.pop("spectrum"), "it has no 'spectrum'"),
    "sigma-a-string": (lambda r: r["spectrum"].update(sigma="abc"), "could not convert string to float"),
    "rows-a-list": (lambda r: r.update(rows=[1]), "'list' object has no attribute 'items'"),
    "fit-a-list": (lambda r: r["spectrum"].update(fit_singular=[1]), "damaged or incomplete"),
}


@pytest.mark.parametrize("name", list(REPORTS))
def test_plot_of_a_damaged_decay_report_is_one_line(copy, name):
    change, words = REPORTS[name]
    report = copy / "decay" / "report.json"
    _edit_json(report, change)
    line = _cli_fails("plot", report, "--out", copy / "figures", words=words)
    assert str(report) in line and "gradspec decay" in line
    assert not (copy / "figures").exists() or not any((copy / "figures").iterdir())


def test_plot_of_a_deeply_nested_report_is_one_line(copy):
    report = copy / "decay" / "report.json"
    report.write_text("[" * 100_000)
    _cli_fails("plot", report, "--out", copy / "figures", words="nests too deeply")


@pytest.mark.parametrize("source, words", [
    ({"layout": {"a": 1}}, "records a damaged source layout"),
    ({"layout": [{"name": "weight", "shape": ["x"], "offset": 0, "numel": 40}]}, "records a damaged source layout"),
    ({"col_ranges": "x"}, "records a damaged source layout or column ranges"),
])
def test_retrain_with_a_spectrum_whose_source_record_is_damaged_is_one_line(copy, source, words):
    """`retrain --projector SPECTRUM` reads the spectrum's record of its columns' parameters."""
    spec = copy / "spec.zarr"
    _edit_json(spec / "zarr.json", lambda z: z["attributes"]["gradspec.source"].update(source))
    _cli_fails("retrain", "--out", copy / "rt", "--algorithm", "subspace", "--projector", spec, "--rank", "2",
               "--steps", "2", *[a for a in LOWRANK if a not in ("--checkpoint-every", "4")], words=words)
    assert not (copy / "rt" / "metrics.jsonl").exists()


@pytest.mark.parametrize("state, words", [
    ({"iteration": "x", "arrays": []}, "saved Krylov state is damaged (no 'basis')"),
])
def test_pca_resume_of_a_damaged_krylov_state_is_one_line(copy, state, words):
    gradients, out = copy / "run" / "gradients.zarr", copy / "k.zarr"
    pca_args = ["pca", gradients, "--k", "2", "--method", "krylov", "--iters", "2", "--out", out, "--no-progress"]
    assert CliRunner().invoke(app, [str(a) for a in pca_args]).exit_code == 0

    def interrupted(z):
        z["attributes"].update({"gradspec.status": "interrupted", "gradspec.state": state})

    _edit_json(out / "zarr.json", interrupted)
    _cli_fails(*pca_args, "--resume", words=words)


@pytest.mark.parametrize("task_config", [[1], {"train_ids": ["0", "1"]}, {"pool": 5}])
def test_a_source_store_recording_its_data_with_wrong_types_counts_as_unknown(copy, task_config):
    """retrain's DP caveat reads the spectrum's source store's task record: a record of the
    wrong types is treated as telling nothing (the basis counts as from the private data)."""
    from gradspec.optim._registry import spectrum_provenance

    gradients, spec = copy / "run" / "gradients.zarr", copy / "spec.zarr"
    _edit_json(spec / "zarr.json", lambda z: z["attributes"]["gradspec.source"].update(
        path=str(gradients), abspath=str(gradients)))
    assert spectrum_provenance(spec)["known"]
    _edit_json(gradients / "zarr.json", lambda z: z["attributes"]["gradspec.config"].update(task_config=task_config))
    prov = spectrum_provenance(spec)
    assert not prov["known"] and prov["train_ids"] is None


def test_retrain_resume_of_a_run_with_a_hostile_checkpoint_runs_nothing(tmp_path):
    """The library's other resume path: retrain(resume=True) reads the same checkpoint.pt."""
    out, marker = tmp_path / "run", tmp_path / "marker"
    retrain(config=config(steps=3), algorithm="dp-sgd", out=out, task=lowrank_task())
    good = torch.load(out / "checkpoint.pt", weights_only=True)
    _hostile(out / "checkpoint.pt", marker, **{k: v for k, v in good.items() if k != "format"})
    with pytest.raises(ValueError) as err:
        retrain(config=config(steps=6), algorithm="dp-sgd", out=out, task=lowrank_task(), resume=True)
    _one_line(str(err.value))
    assert "could run code" in str(err.value) and not marker.exists()
