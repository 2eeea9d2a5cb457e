"""A run folder from someone else is data: its checkpoint, config.json, run.json and links are
checked before anything is restored or written, and every refusal is one line (issue 25).

The pickle payload itself (a ``__reduce__`` that would create a marker file) is in
``tests/test_hostile_files.py``; here are the other ways a checkpoint or a run folder can lie.
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
from gradspec._files import write_text_atomic
from gradspec.collect import collect, is_run_dir, read_run_config
from gradspec.store import LOCK_NAME
from gradspec.train._checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    load_checkpoint,
    save_checkpoint,
    saved_run_config,
    state_digest,
)

from ..optim._cases import config, lowrank_task

REQUIRED = ("step", "rows", "model", "optimizer", "metrics_offset", "layout")
runner = CliRunner()


def _one_line(message: str) -> None:
    assert message.strip() and "\n" not in message.strip() and "Traceback" not in message, message


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run stopped after 4 of 8 steps (resumable), made by the trainer itself (Adam: moments)."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    collect(config(steps=8, optimizer="adam", lr=0.01, sampling="shuffle"), task=lowrank_task(), out=out,
            stop_after=4)
    return out


@pytest.fixture
def run(stopped_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(stopped_run, out)
    return out


def _edit(run: Path, change) -> Path:
    """Rewrite the run's checkpoint after ``change(state)``, keeping its format and stamping the
    digest of the changed values (a hand-made checkpoint, not a damaged one: what the schema
    check must refuse by itself)."""
    path = run / CHECKPOINT_NAME
    state = torch.load(path, weights_only=True)
    state.pop("digest")
    change(state)
    torch.save({**state, "digest": state_digest(state)}, path)
    return path


def _resume_fails(run: Path, *words: str) -> str:
    """`gradspec collect --resume` exits 1 line, non-zero, naming ``words``."""
    res = runner.invoke(app, ["collect", "--out", str(run), "--resume", "--no-progress"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


# ------------------------------------------------------------------ what the checkpoint holds
def test_the_trainers_checkpoint_is_current_format_and_loads(run):
    state = load_checkpoint(run / CHECKPOINT_NAME, required=REQUIRED)
    assert state["format"] == CHECKPOINT_FORMAT == 3 and state["step"] == 4
    assert state["sampler"]["perm"] is not None  # a shuffled run: its permutation is checked too


def test_save_refuses_a_value_that_would_need_unpickling(tmp_path):
    path = tmp_path / CHECKPOINT_NAME
    for value, named in ((np.float64(0.5), "numpy.float64"), ({"rng": np.random.default_rng(0)}, "Generator"),
                         ({1.5: 0}, "key 1.5"), (torch.device("cpu"), "torch.device")):
        with pytest.raises(TypeError) as err:
            save_checkpoint(path, {"step": 1, "hooks": {"x": value}})
        _one_line(str(err.value))
        assert "state['hooks']['x']" in str(err.value) and named in str(err.value), str(err.value)
        assert not path.exists() and not path.with_name(path.name + ".partial").exists()
    save_checkpoint(path, {"step": 1, "hooks": {"x": [1, 2.5, "a", None, True, (torch.ones(2),)]}})
    assert torch.load(path, weights_only=True)["hooks"]["x"][0] == 1


def test_an_old_format_checkpoint_is_refused_saying_what_to_do(run):
    path = _edit(run, lambda s: s.update(format=1))
    with pytest.raises(ValueError) as err:
        load_checkpoint(path)
    _one_line(str(err.value))
    assert "format 1" in str(err.value) and "older gradspec" in str(err.value) and "--overwrite" in str(err.value)
    _resume_fails(run, "format 1", "--overwrite")


@pytest.mark.parametrize("fmt, words", [(4, ("newer gradspec", "upgrade")), ("3", ("not a gradspec checkpoint",)),
                                        (True, ("not a gradspec checkpoint",)), (None, ("not a gradspec",))])
def test_a_checkpoint_of_another_or_no_format_is_refused(run, fmt, words):
    path = _edit(run, lambda s: s.update(format=fmt))
    with pytest.raises(ValueError) as err:
        load_checkpoint(path)
    _one_line(str(err.value))
    assert all(w in str(err.value) for w in words), str(err.value)


def _flip_in_file(path: Path, needle: bytes, at: int, bit: int) -> None:
    raw = bytearray(path.read_bytes())
    where = bytes(raw).find(needle)
    assert where > 0 and bytes(raw).find(needle, where + 1) < 0, "the bytes to flip are not unique in the file"
    raw[where + at] ^= bit
    path.write_bytes(bytes(raw))


def test_a_flipped_bit_in_a_weight_is_refused_not_resumed_from(run):
    """torch checks no checksum of a checkpoint's tensors: one flipped bit of a weight loaded and
    the resume trained on from it with exit code 0."""
    path = run / CHECKPOINT_NAME
    state = load_checkpoint(path, required=REQUIRED)
    weight = next(iter(state["model"].values())).contiguous().numpy().tobytes()
    _flip_in_file(path, weight, 2, 0x40)
    assert not torch.equal(torch.load(path, weights_only=True)["model"][next(iter(state["model"]))],
                           next(iter(state["model"].values())))  # the flip reached the values
    with pytest.raises(ValueError) as err:
        load_checkpoint(path, required=REQUIRED)
    _one_line(str(err.value))
    assert "damaged" in str(err.value) and "digest" in str(err.value) and "--overwrite" in str(err.value)
    _resume_fails(run, "damaged", "digest")


def test_a_flipped_bit_in_the_noise_multiplier_is_refused(run):
    """One bit turned the pickled σ = 1.0 into 0.5: the resume trained at half the noise with exit 0."""
    import pickletools
    import struct
    import zipfile

    path = run / CHECKPOINT_NAME
    sigma = load_checkpoint(path)["noise_multiplier"]
    with zipfile.ZipFile(path) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    floats = [arg for op, arg, _ in pickletools.genops(pkl) if op.name == "BINFLOAT"]
    assert sigma in floats
    packed = b"G" + struct.pack(">d", sigma)
    raw = path.read_bytes()
    at = raw.rfind(packed)  # the top-level entry is pickled last among equal floats
    assert at > 0
    changed = bytearray(raw)
    changed[at + 2] ^= 0x10
    path.write_bytes(bytes(changed))
    # the exponent's last bit: σ/2 or 2σ, which the settings and accountant would have used
    assert torch.load(path, weights_only=True)["noise_multiplier"] in (sigma / 2, 2 * sigma)
    with pytest.raises(ValueError, match="digest"):
        load_checkpoint(path)
    _resume_fails(run, "damaged", "digest")


def test_a_format_2_checkpoint_without_a_digest_still_resumes_with_a_warning(run, caplog):
    path = run / CHECKPOINT_NAME
    state = torch.load(path, weights_only=True)
    state.pop("digest")
    torch.save({**state, "format": 2}, path)
    with caplog.at_level("WARNING", logger="gradspec.train._checkpoint"):
        loaded = load_checkpoint(path, required=REQUIRED)
    assert loaded["step"] == 4 and "cannot be verified" in caplog.text
    res = runner.invoke(app, ["collect", "--out", str(run), "--resume", "--no-progress"])
    assert res.exit_code == 0, res.output


def test_a_format_3_checkpoint_relabelled_format_2_is_damage(run):
    """The format changed to 2 would switch the digest check off; a digest there says it was 3
    (found by review: with a weight flipped too, the resume trained from the damaged weight)."""
    path = run / CHECKPOINT_NAME
    state = torch.load(path, weights_only=True)
    torch.save({**state, "format": 2}, path)
    with pytest.raises(ValueError, match="says format 2 but carries a digest"):
        load_checkpoint(path, required=REQUIRED)


def test_the_digest_sees_every_value_and_its_kind():
    base = {"a": torch.arange(4, dtype=torch.float32), "b": [1, 2.0, "x", None, True], "c": {1: (torch.ones(0),)}}
    same = {"a": torch.arange(4, dtype=torch.float32), "b": [1, 2.0, "x", None, True], "c": {1: (torch.ones(0),)}}
    assert state_digest(base) == state_digest(same)
    variants = [
        {**base, "a": torch.arange(4, dtype=torch.float64)},  # same values, another dtype
        {**base, "a": torch.arange(4, dtype=torch.float32).reshape(2, 2)},  # another shape
        {**base, "b": [1, 2, "x", None, True]},  # 2.0 -> 2
        {**base, "b": [1, 2.0, "x", None, 1]},  # True -> 1
        {**base, "b": (1, 2.0, "x", None, True)},  # list -> tuple
        {**base, "c": {"1": (torch.ones(0),)}},  # int key -> str key
        {"b": base["b"], "a": base["a"], "c": base["c"]},  # order
    ]
    flipped = torch.arange(4, dtype=torch.float32)
    flipped.view(torch.int32)[2] ^= 1  # the last bit of one float
    variants.append({**base, "a": flipped})
    digests = {state_digest(v) for v in variants}
    assert len(digests) == len(variants) and state_digest(base) not in digests


def test_a_checkpoint_that_is_not_a_dict_or_not_torch_is_refused(tmp_path):
    path = tmp_path / CHECKPOINT_NAME
    torch.save([1, 2, 3], path)
    with pytest.raises(ValueError, match="not a gradspec checkpoint"):
        load_checkpoint(path)
    path.write_bytes(b"PK\x03\x04 this is no zip")
    with pytest.raises(ValueError, match="cannot be read") as err:
        load_checkpoint(path)
    _one_line(str(err.value))


def _huge_view(state):
    # A tensor that declares 10^12 elements over a storage of 16: no allocation, a huge shape.
    name = state["layout"][0]["name"]
    state["model"][name] = torch.zeros(16).as_strided((10**6, 10**6), (0, 0))


def _shorter_moment(state):
    entry = next(iter(state["optimizer"]["state"].values()))
    entry["exp_avg"] = entry["exp_avg"].flatten()[:1]


def _repeated_example(state):
    perm = state["sampler"]["perm"].clone()
    perm[1] = perm[0]  # one example twice, one never: the sampling (and its accounting) would be wrong
    state["sampler"]["perm"] = perm


CORRUPTIONS = {
    "step-a-string": (lambda s: s.update(step="4"), "'step' is '4'"),
    "rows-negative": (lambda s: s.update(rows=-1), "'rows' is -1"),
    "metrics-offset-float": (lambda s: s.update(metrics_offset=3.5), "'metrics_offset' is 3.5"),
    "model-not-a-dict": (lambda s: s.update(model=[1, 2]), "'model' is not a dict"),
    "model-huge-declared-shape": (_huge_view, "has shape (1000000, 1000000)"),
    "model-integer-tensor": (lambda s: s["model"].update({k: v.long() for k, v in s["model"].items()}),
                             "floating-point"),
    "model-missing-parameter": (lambda s: s.update(model={}), "'model' holds the parameters []"),
    "layout-garbage": (lambda s: s.update(layout=[{"name": 3}]), "'layout' is not a parameter layout"),
    "layout-shape-strings": (lambda s: s["layout"][0].update(shape=[str(x) for x in s["layout"][0]["shape"]]),
                             "'layout' is not a parameter layout"),
    "optimizer-moment-wrong-shape": (_shorter_moment, "'exp_avg' of parameter 0 has shape (1,)"),
    "optimizer-not-a-dict": (lambda s: s.update(optimizer="adam"), "'optimizer' is not an optimizer state"),
    "sampler-perm-repeats": (_repeated_example, "not a permutation"),
    "sampler-generator-short": (lambda s: s["sampler"].update(generator=torch.zeros(7, dtype=torch.uint8)),
                                "'sampler' generator is not a generator state"),
    "noise-generator-float": (lambda s: s.update(noise_generator=torch.zeros(5056)), "'noise_generator'"),
    "noise-multiplier-nan": (lambda s: s.update(noise_multiplier=float("nan")), "'noise_multiplier' is nan"),
    "hooks-a-list": (lambda s: s.update(hooks=[]), "'hooks' is a list"),
    "run-id-a-number": (lambda s: s.update(run_id=7), "'run_id' is a int"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_checkpoint_with_a_wrong_type_or_shape_is_one_line_before_anything_is_restored(run, name):
    change, words = CORRUPTIONS[name]
    path = _edit(run, change)
    with pytest.raises(ValueError) as err:
        load_checkpoint(path, required=REQUIRED)
    _one_line(str(err.value))
    assert words in str(err.value) and "damaged" in str(err.value), str(err.value)


@pytest.mark.parametrize("name", ["model-huge-declared-shape", "sampler-perm-repeats", "optimizer-moment-wrong-shape"])
def test_collect_resume_refuses_a_corrupted_checkpoint_and_leaves_the_run_alone(run, name):
    change, words = CORRUPTIONS[name]
    _edit(run, change)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK_NAME}
    _resume_fails(run, words)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != LOCK_NAME} == before


# ------------------------------------------------------------------ links out of the run folder
@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoint.pt", "config.json", "gradients.zarr", LOCK_NAME])
def test_a_run_entry_linked_out_of_the_run_folder_is_refused_and_its_target_untouched(run, tmp_path, name):
    """A shared folder whose metrics.jsonl links to ~/.bashrc: resume would truncate it (and
    the run lock would write its owner into the file the lock links to)."""
    victim = tmp_path / ("victim" if name != "gradients.zarr" else "victim.zarr")
    if name == LOCK_NAME:
        (run / name).write_text("the user's own file")
    shutil.move(run / name, victim)
    (run / name).symlink_to(victim)
    before = sorted((p, p.read_bytes()) for p in [victim, *victim.rglob("*")] if p.is_file())
    msg = _resume_fails(run, "outside the run directory", name)
    assert "copy" in msg
    assert sorted((p, p.read_bytes()) for p in [victim, *victim.rglob("*")] if p.is_file()) == before


def test_overwrite_refuses_a_lock_linked_out_of_the_run_folder(run, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("the user's own file")
    (run / LOCK_NAME).unlink(missing_ok=True)
    (run / LOCK_NAME).symlink_to(victim)
    res = runner.invoke(app, ["collect", "--out", str(run), "--overwrite", "--steps", "2", "--task", "lowrank",
                              "-t", "n=120", "-t", "d=16", "--no-progress"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and "outside the run directory" in lines[0], res.output
    assert victim.read_text() == "the user's own file" and (run / "config.json").is_file()


def test_a_link_inside_the_run_folder_is_fine(run):
    (run / "metrics.jsonl").rename(run / "metrics.real")
    (run / "metrics.jsonl").symlink_to("metrics.real")
    res = runner.invoke(app, ["collect", "--out", str(run), "--resume", "--no-progress"])
    assert res.exit_code == 0, res.output


def test_a_planted_partial_file_link_is_replaced_not_written_through(tmp_path):
    """checkpoint.pt.partial -> a user's file: the atomic writes remove the link first."""
    run = tmp_path / "run"
    run.mkdir()
    for name, write in ((CHECKPOINT_NAME, lambda p: save_checkpoint(p, {"step": 1})),
                        ("config.json", lambda p: write_text_atomic(p, "{}"))):
        victim = tmp_path / f"victim-{name}"
        victim.write_text("the user's own file")
        (run / f"{name}.partial").symlink_to(victim)
        write(run / name)
        assert victim.read_text() == "the user's own file"
        assert (run / name).is_file() and not (run / name).is_symlink()


# ------------------------------------------------------------------ config.json and run.json
BAD_CONFIGS = {
    "a-list": ("[1, 2]", "holds a list"),
    "deeply-nested": ("[" * 100_000, "nests too deeply"),
    "not-json": ("{'steps': 8}", "not JSON"),
    "clip-a-string": ('{"clip": "no"}', "setting 'clip' is a string"),
    "batch-size-float": ('{"batch_size": 2.5}', "setting 'batch_size' is a number"),
    "seed-a-string": ('{"seed": "0"}', "setting 'seed' is a string"),
    "task-a-number": ('{"task": 5}', "setting 'task' is an integer"),
    "params-a-string": ('{"params": "weight"}', "setting 'params' is a string"),
    "device-a-number": ('{"device": 0}', "setting 'device' is an integer"),
    "steps-true": ('{"steps": true}', "setting 'steps' is a boolean"),
    "task-options-a-list": ('{"task_options": [1]}', "setting 'task_options' is a list"),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_a_config_json_of_wrong_types_is_one_line(run, name):
    text, words = BAD_CONFIGS[name]
    if text.startswith("{\""):
        text = json.dumps({**json.loads((run / "config.json").read_text()), **json.loads(text)})
    (run / "config.json").write_text(text)
    with pytest.raises(ValueError) as err:
        read_run_config(run)
    _one_line(str(err.value))
    assert words in str(err.value) and "not the config of a gradspec run" in str(err.value), str(err.value)
    assert not is_run_dir(run)
    _resume_fails(run, words)


def test_the_run_config_of_a_run_a_resume_reads_is_type_checked(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    assert saved_run_config(out) == {}
    for text, words in (("[]", "holds a list"), ('{"resumes": "x"}', "'resumes' is a string"),
                        ('{"noise_multiplier": "1"}', "'noise_multiplier' is a string"),
                        ('{"steps": true}', "'steps' is a boolean"), ("{", "cannot be read as JSON")):
        (out / "run.json").write_text(text)
        with pytest.raises(ValueError) as err:
            saved_run_config(out)
        _one_line(str(err.value))
        assert words in str(err.value) and "run.json" in str(err.value), str(err.value)
    (out / "run.json").write_text('{"steps": 8, "resumes": []}')
    assert saved_run_config(out) == {"steps": 8, "resumes": []}


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_checkpoint_that_is_not_a_regular_file_says_so(run, kind):
    path = run / CHECKPOINT_NAME
    path.unlink()
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    with pytest.raises(ValueError, match="not a regular file") as err:
        load_checkpoint(path, required=REQUIRED)
    _one_line(str(err.value))
