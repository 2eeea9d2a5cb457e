"""The collect loop: rows, clipping, noise, accounting, resume, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gradspec.collect import CollectConfig, collect
from gradspec.privacy import compute_epsilon
from gradspec.store import GradientStore

from ._tiny import tiny_task


def cfg(**kw) -> CollectConfig:
    base = dict(task="tiny", steps=12, batch_size=16, noise_multiplier=1.0, lr=0.05, optimizer="sgd",
                eval_every=5, log_every=3, checkpoint_every=4, microbatch=5)
    base.update(kw)
    return CollectConfig(**base)


def read_all(path):
    s = GradientStore.open(path)
    return s.read(), s.row_meta()


def metrics_without_time(path):
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


@pytest.mark.parametrize("mode", ["batch", "per-example"])
@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_resume_equals_uninterrupted_run(tmp_path, mode, sampling):
    config = cfg(mode=mode, sampling=sampling)
    full = collect(config, out=tmp_path / "full", task=tiny_task())
    part = collect(config, out=tmp_path / "part", task=tiny_task(), stop_after=6)
    assert part.steps == 6
    # a store cut short opens with its committed rows
    assert GradientStore.open(part.store).n_rows > 0
    done = collect(out=tmp_path / "part", task=tiny_task(), resume=True)
    assert done.steps == full.steps == 12
    a, ma = read_all(full.store)
    b, mb = read_all(done.store)
    assert a.shape[0] > 0
    np.testing.assert_array_equal(a, b)  # bitwise
    for k in ma:
        np.testing.assert_array_equal(ma[k], mb[k])
    assert metrics_without_time(full.metrics) == metrics_without_time(done.metrics)
    assert done.epsilon == pytest.approx(full.epsilon)
    assert GradientStore.open(done.store).status == "complete"


def test_per_example_rows_are_clipped_batch_of_one_gradients(tmp_path):
    """Stored rows equal a batch-of-one autograd loop, clipped to C, at the initial parameters."""
    C = 0.05
    res = collect(cfg(mode="per-example", steps=1, max_grad_norm=C), out=tmp_path / "r", task=tiny_task())
    rows, meta = read_all(res.store)
    task = tiny_task()  # same seed: same initial model
    model = task.model
    names = [n for n, _ in model.named_parameters()]
    for row, i in zip(rows, meta["example_index"], strict=True):
        batch = task.train.batch([int(i)])
        loss = task.loss(task.forward(model, batch), batch).sum()
        g = torch.cat([x.flatten() for x in torch.autograd.grad(loss, [model.get_parameter(n) for n in names])])
        g = g * min(1.0, C / float(g.norm()))
        np.testing.assert_allclose(row, g.detach().numpy(), rtol=2e-5, atol=1e-7)
        assert np.linalg.norm(row) <= C * (1 + 1e-5)
    assert meta["frac_clipped"][0] > 0  # the bound was active


def test_batch_row_is_mean_of_clipped_rows(tmp_path):
    """A batch-mode row equals the mean of the same step's per-example rows."""
    a = collect(cfg(mode="batch", steps=3, max_grad_norm=0.1), out=tmp_path / "a", task=tiny_task())
    b = collect(cfg(mode="per-example", steps=3, max_grad_norm=0.1), out=tmp_path / "b", task=tiny_task())
    rows_a, meta_a = read_all(a.store)
    rows_b, meta_b = read_all(b.store)
    for j, step in enumerate(meta_a["step"]):
        sel = meta_b["step"] == step
        assert sel.sum() == meta_a["batch_size"][j]
        np.testing.assert_allclose(rows_a[j], rows_b[sel].mean(0), rtol=1e-5, atol=1e-7)
        assert np.linalg.norm(rows_a[j]) <= 0.1 * (1 + 1e-5)


def test_noise_has_the_predicted_scale(tmp_path):
    """With zero gradients, one SGD step (lr 1) moves each parameter by N(0, (sigma C / (q n))^2)."""
    task = tiny_task(n=64)
    task.loss = lambda outputs, batch: outputs.sum(1) * 0.0
    sigma, C, B = 2.0, 3.0, 16
    before = torch.cat([p.detach().flatten().clone() for p in task.model.parameters()])
    collect(cfg(steps=1, noise_multiplier=sigma, max_grad_norm=C, batch_size=B, lr=1.0, eval_every=0),
            out=tmp_path / "n", task=task)
    after = torch.cat([p.detach().flatten() for p in task.model.parameters()])
    delta = (after - before).double()
    expected = sigma * C / B  # q * n = B
    # p = 195 parameters: the sample std is within 15% of the truth with overwhelming probability
    assert delta.numel() > 150
    assert float(delta.std()) == pytest.approx(expected, rel=0.15)
    assert abs(float(delta.mean())) < 4 * expected / math.sqrt(delta.numel())


def test_epsilon_matches_the_accountant(tmp_path):
    res = collect(cfg(steps=10, noise_multiplier=1.3), out=tmp_path / "e", task=tiny_task())
    assert res.delta == pytest.approx(64 ** -1.1)
    assert res.epsilon == pytest.approx(
        compute_epsilon(noise_multiplier=1.3, sample_rate=16 / 64, steps=10, delta=res.delta), rel=1e-9
    )
    logged = [json.loads(x) for x in res.metrics.read_text().splitlines()]
    eps = [r["epsilon"] for r in logged if "epsilon" in r]
    assert eps == sorted(eps) and eps[-1] == pytest.approx(res.epsilon)
    assert any("eval_accuracy" in r for r in logged)


def test_target_epsilon_is_reached(tmp_path):
    res = collect(cfg(steps=8, noise_multiplier=None, target_epsilon=3.0), out=tmp_path / "t", task=tiny_task())
    assert res.epsilon <= 3.0 and res.epsilon == pytest.approx(3.0, rel=0.02)


def test_only_selected_parameters_train(tmp_path):
    task = tiny_task(params=("fc1.*",))
    frozen = task.model.fc2.weight.detach().clone()
    res = collect(cfg(steps=3), out=tmp_path / "s", task=task)
    store = GradientStore.open(res.store)
    assert store.layout.names == ["fc1.weight", "fc1.bias"]
    assert torch.equal(task.model.fc2.weight, frozen)


def test_nonfinite_gradients_are_refused_or_skipped(tmp_path):
    def poisoned():
        task = tiny_task()
        base = task.loss
        task.loss = lambda out, batch: base(out, batch) * torch.where(
            batch["tokens"][:, 0] == 7, torch.tensor(float("nan")), torch.tensor(1.0))
        return task

    with pytest.raises(ValueError, match=r"non-finite gradients at step \d+.*--skip-nonfinite"):
        collect(cfg(checkpoint_every=1), out=tmp_path / "a", task=poisoned())
    kept = GradientStore.open(tmp_path / "a" / "gradients.zarr")
    assert np.isfinite(kept.read()).all()
    # under DP a skip is a decision on the private data that no epsilon covers: refused (found by
    # review: 5 of 20 steps skipped and epsilon reported for 15)
    with pytest.raises(ValueError, match="--skip-nonfinite skips a step .* non-private runs"):
        cfg(skip_nonfinite=True)
    with pytest.raises(ValueError, match="--skip-nonfinite"):
        cfg(skip_nonfinite=True, noise_multiplier=None, target_epsilon=8.0)
    res = collect(cfg(skip_nonfinite=True, noise_multiplier=0.0), out=tmp_path / "b", task=poisoned())
    rows, meta = read_all(res.store)
    assert np.isfinite(rows).all() and len(rows) < 12


def test_bad_settings_and_existing_runs(tmp_path):
    with pytest.raises(ValueError, match="choose one of"):
        cfg(mode="sometimes")
    with pytest.raises(ValueError, match="unknown compressor 'lz4'"):
        cfg(compressor="lz4")  # refused with the settings, not after --overwrite removed the old run
    with pytest.raises(ValueError, match="clipping"):
        cfg(clip=False)
    collect(cfg(steps=2), out=tmp_path / "x", task=tiny_task())
    with pytest.raises(FileExistsError, match="--resume"):
        collect(cfg(steps=2), out=tmp_path / "x", task=tiny_task())
    with pytest.raises(ValueError, match="differ from it: --lr"):
        collect(cfg(steps=2, lr=0.5), out=tmp_path / "x", task=tiny_task(), resume=True)
    with pytest.raises(ValueError, match=r"layout differs .*parameter 0: saved emb\.weight \(20, 6\), now fc1\.weight \(8, 6\)"):
        collect(out=tmp_path / "x", task=tiny_task(params=("fc1.*",)), resume=True)


def test_resume_refuses_every_conflicting_setting_in_one_message(tmp_path):
    collect(cfg(), out=tmp_path / "r", task=tiny_task(), stop_after=4)
    with pytest.raises(ValueError) as err:
        collect(cfg(batch_size=8, noise_multiplier=5.0, every=2, steps=20), out=tmp_path / "r",
                task=tiny_task(), resume=True)
    msg = str(err.value)
    assert "\n" not in msg
    for part in ("--batch-size (saved 16, given 8)", "--noise-multiplier (saved 1.0, given 5.0)", "--every (saved 1, given 2)"):
        assert part in msg
    assert "--steps" not in msg  # the run's length may change
    assert json.loads((tmp_path / "r" / "config.json").read_text())["steps"] == 12  # nothing changed


def test_resume_extends_a_fixed_sigma_run_as_if_it_had_been_longer(tmp_path):
    long = collect(cfg(steps=16), out=tmp_path / "long", task=tiny_task())
    short = collect(cfg(steps=8), out=tmp_path / "short", task=tiny_task())
    assert GradientStore.open(short.store).status == "complete"
    res = collect(cfg(steps=16), out=tmp_path / "short", task=tiny_task(), resume=True)
    assert res.steps == 16 and res.epsilon == pytest.approx(long.epsilon, rel=1e-9) and res.epsilon > short.epsilon
    np.testing.assert_array_equal(read_all(res.store)[0], read_all(long.store)[0])
    store = GradientStore.open(res.store)
    assert store.status == "complete" and store.config["steps"] == 16
    assert store.config["resumes"] == [{"at_step": 8, "changed": {"--steps": [8, 16]}}]
    assert json.loads((tmp_path / "short" / "config.json").read_text())["steps"] == 16
    with pytest.raises(ValueError, match=r"the run has done 16 steps.*--steps >= 16"):
        collect(cfg(steps=10), out=tmp_path / "short", task=tiny_task(), resume=True)


def test_extending_a_target_epsilon_run_needs_consent_and_reports_the_larger_epsilon(tmp_path):
    out = tmp_path / "t"
    first = collect(cfg(steps=8, noise_multiplier=None, target_epsilon=3.0), out=out, task=tiny_task())
    longer = cfg(steps=16, noise_multiplier=None, target_epsilon=3.0)
    with pytest.raises(ValueError, match=r"calibrated for epsilon = 3 over 8 steps; 16 steps.*--allow-larger-epsilon"):
        collect(longer, out=out, task=tiny_task(), resume=True)
    assert GradientStore.open(first.store).status == "complete"  # the refused resume changed nothing
    assert json.loads((out / "config.json").read_text())["target_epsilon"] == 3.0
    res = collect(longer, out=out, task=tiny_task(), resume=True, allow_larger_epsilon=True)
    assert res.noise_multiplier == first.noise_multiplier  # the sigma the first 8 steps used
    assert res.epsilon == pytest.approx(compute_epsilon(noise_multiplier=first.noise_multiplier,
                                                        sample_rate=0.25, steps=16, delta=res.delta))
    assert res.epsilon > 3.0
    saved = json.loads((out / "config.json").read_text())
    assert saved["target_epsilon"] is None and saved["noise_multiplier"] == first.noise_multiplier
    assert GradientStore.open(res.store).config["final_epsilon"] == pytest.approx(res.epsilon)


def test_a_shortened_calibrated_run_is_still_held_to_its_calibration(tmp_path):
    """Shortening a target-epsilon run made it a fixed-sigma one, after which any extension ran
    with no consent (found by review: --steps 29, then --steps 40 of a run calibrated for 30
    steps, epsilon 4.596 against the target 4, exit 0)."""
    out = tmp_path / "t"
    first = collect(cfg(steps=8, noise_multiplier=None, target_epsilon=3.0), out=out, task=tiny_task(), stop_after=4)
    collect(cfg(steps=7, noise_multiplier=None, target_epsilon=3.0), out=out, task=tiny_task(), resume=True,
            stop_after=1)
    assert json.loads((out / "config.json").read_text())["target_epsilon"] is None  # now fixed sigma
    longer = cfg(steps=16, noise_multiplier=first.noise_multiplier)
    with pytest.raises(ValueError, match=r"calibrated for epsilon = 3 over 8 steps; 16 steps.*--allow-larger-epsilon"):
        collect(longer, out=out, task=tiny_task(), resume=True)
    ok = collect(cfg(steps=8, noise_multiplier=first.noise_multiplier), out=out, task=tiny_task(), resume=True)
    assert ok.epsilon == pytest.approx(3.0, rel=1e-3)  # back to the calibrated length: no consent needed


def test_resuming_a_complete_run_keeps_its_results(tmp_path):
    first = collect(cfg(steps=4), out=tmp_path / "c", task=tiny_task())
    again = collect(out=tmp_path / "c", task=tiny_task(), resume=True)
    assert again.final_metrics == first.final_metrics != {}
    assert again.epsilon == pytest.approx(first.epsilon)
    assert GradientStore.open(first.store).config["final_metrics"] == first.final_metrics


def test_a_python_task_is_saved_as_custom_and_resumed_only_with_a_matching_task(tmp_path):
    out = tmp_path / "api"
    collect(CollectConfig(steps=6, batch_size=8, eval_every=0, checkpoint_every=2), out=out,
            task=tiny_task(), stop_after=2)
    assert json.loads((out / "config.json").read_text())["task"] == "custom:tiny"  # not "text"
    assert GradientStore.open(out / "gradients.zarr").config["task_registered"] is False
    for config in (None, CollectConfig(steps=6, batch_size=8, eval_every=0, checkpoint_every=2)):
        with pytest.raises(ValueError, match=r"built in Python.*resume=True, task=your_task"):
            collect(config, out=out, resume=True)
    other = tiny_task()
    other.name = "other"
    with pytest.raises(ValueError, match=r"--task \(saved 'custom:tiny', given 'custom:other'\)"):
        collect(out=out, task=other, resume=True)
    with pytest.raises(ValueError, match="training examples"):
        collect(out=out, task=tiny_task(n=80), resume=True)
    assert collect(out=out, task=tiny_task(), resume=True).steps == 6


def test_a_registry_task_object_is_saved_by_name_and_rebuilds_on_resume(tmp_path):
    from gradspec.tasks import make_task

    def task():
        return make_task("lowrank", n=64, n_eval=16, d=10, r=2, seed=0)

    config = cfg(task="text", steps=6)  # the task object decides
    full = collect(config, out=tmp_path / "full", task=task())
    collect(config, out=tmp_path / "part", task=task(), stop_after=3)
    saved = json.loads((tmp_path / "part" / "config.json").read_text())
    assert saved["task"] == "lowrank" and saved["task_options"]["d"] == 10
    done = collect(out=tmp_path / "part", resume=True)  # rebuilt from the registry, as the CLI does
    np.testing.assert_array_equal(read_all(done.store)[0], read_all(full.store)[0])


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(config=dict(delta=0.5)), r"delta = 0\.5 is not below 1/n"),
        (dict(config=dict(every=12)), r"--every 12 with 12 steps stores step 0 only"),
        (dict(stop_after=0), "--stop-after must be >= 1"),
        (dict(resume=True, overwrite=True), "give one of them"),
    ],
    ids=["delta>=1/n", "every>=steps", "stop_after=0", "resume+overwrite"],
)
def test_bad_run_settings_are_refused_before_anything_is_written(tmp_path, kw, match):
    kw = dict(kw)
    config = cfg(**kw.pop("config", {}))
    with pytest.raises(ValueError, match=match):
        collect(config, out=tmp_path / "x", task=tiny_task(), **kw)
    assert not (tmp_path / "x").exists()


def test_a_changed_run_length_in_config_json_is_refused_unless_given(tmp_path):
    """One flipped bit in config.json's steps resumed a run for longer (found by review: 20 -> 28,
    eight more steps, exit 0); a --steps the resume gives is the user's choice."""
    collect(cfg(steps=8), out=tmp_path / "r", task=tiny_task(), stop_after=4)
    path = tmp_path / "r" / "config.json"
    path.write_text(path.read_text().replace('"steps": 8', '"steps": 12'))
    with pytest.raises(ValueError, match=r"says --steps 12, the run config recorded with its rows 8"):
        collect(out=tmp_path / "r", task=tiny_task(), resume=True)
    res = collect(cfg(steps=8), out=tmp_path / "r", task=tiny_task(), resume=True)
    assert res.steps == 8
    # a setting a resume may not change, edited and given alike, still differs from the record
    collect(cfg(steps=8), out=tmp_path / "e", task=tiny_task(), stop_after=4)
    path = tmp_path / "e" / "config.json"
    path.write_text(path.read_text().replace('"lr": 0.05', '"lr": 0.5'))
    with pytest.raises(ValueError, match=r"says --lr 0\.5, the run config recorded with its rows 0\.05"):
        collect(cfg(steps=8, lr=0.5), out=tmp_path / "e", task=tiny_task(), resume=True)


def test_a_damaged_run_is_refused_on_resume(tmp_path):
    import shutil

    collect(cfg(), out=tmp_path / "m", task=tiny_task(), stop_after=6)
    (tmp_path / "m" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="shorter than the checkpoint expects"):
        collect(out=tmp_path / "m", task=tiny_task(), resume=True)
    assert (tmp_path / "m" / "metrics.jsonl").read_bytes() == b""  # not padded with NUL bytes

    collect(cfg(), out=tmp_path / "s", task=tiny_task(), stop_after=6)
    shutil.rmtree(tmp_path / "s" / "gradients.zarr")
    with pytest.raises(FileNotFoundError, match="has no gradients.zarr"):
        collect(out=tmp_path / "s", task=tiny_task(), resume=True)

    # a checkpoint copied in from another run with the same settings
    for name in ("a", "b"):
        collect(cfg(), out=tmp_path / name, task=tiny_task(), stop_after=6)
    shutil.copy(tmp_path / "a" / "checkpoint.pt", tmp_path / "b" / "checkpoint.pt")
    with pytest.raises(ValueError, match="comes from another run"):
        collect(out=tmp_path / "b", task=tiny_task(), resume=True)

    # a config.json edited by hand (the run recorded lr 0.05)
    path = tmp_path / "a" / "config.json"
    path.write_text(path.read_text().replace('"lr": 0.05', '"lr": 0.5'))
    with pytest.raises(ValueError, match=r"config\.json' says --lr 0\.5, the run config recorded with its rows 0\.05: "
                                         "it was edited or damaged"):
        collect(out=tmp_path / "a", task=tiny_task(), resume=True)


@pytest.mark.parametrize("damage", ["truncated", "a directory"])
def test_a_resume_over_a_damaged_kept_chunk_is_refused_before_any_step(tmp_path, damage):
    """A grads chunk of the kept rows cut short: the resume trained every remaining step, then
    the writer failed on the chunk's checksum saying the rows were "committed and safe". Now the
    resume stats every kept chunk first (uncompressed chunk files all have one size) and refuses
    in one line naming it; nothing is trained, the checkpoint and the store are left as they are."""
    collect(cfg(), out=tmp_path / "r", task=tiny_task(), stop_after=6)
    chunk = tmp_path / "r" / "gradients.zarr" / "grads" / "c" / "0" / "0"
    size = chunk.stat().st_size
    if damage == "truncated":
        with open(chunk, "r+b") as f:
            f.truncate(size // 2)
    else:
        chunk.unlink()
        chunk.mkdir()
    before = (tmp_path / "r" / "checkpoint.pt").read_bytes()
    words = f"truncated: {size // 2} bytes, expected {size}" if damage == "truncated" else "not a regular file"
    with pytest.raises(ValueError, match="missing or the wrong size") as err:
        collect(out=tmp_path / "r", task=tiny_task(), resume=True)
    assert "\n" not in str(err.value) and f"grads chunk c/0/0, rows 0..5: {words}" in str(err.value), err.value
    assert (tmp_path / "r" / "checkpoint.pt").read_bytes() == before
    summary = GradientStore.open(tmp_path / "r" / "gradients.zarr").summary()
    assert summary["status"] == "damaged" and [m["problem"] for m in summary["missing_chunks"]] == [words]


def test_a_resume_onto_a_chunk_whose_bytes_changed_is_refused_before_any_step(tmp_path):
    """A flipped bit in the kept chunk the resume appends to: the resume trained every remaining
    step, then failed in zarr ('Stored and computed checksum do not match'), and --resume again
    did the same. That chunk is now read and checked first."""
    collect(cfg(), out=tmp_path / "r", task=tiny_task(), stop_after=6)
    chunk = tmp_path / "r" / "gradients.zarr" / "grads" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[17] ^= 0x08
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"grads chunk c/0/0 \(rows 0..5\), which the resume would append to, "
                                         r"is corrupt: its bytes do not match their crc32c checksum") as err:
        collect(out=tmp_path / "r", task=tiny_task(), resume=True)
    assert "\n" not in str(err.value)
    assert json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])["step"] <= 6


def test_float16_rows_that_would_overflow_are_refused(tmp_path):
    task = tiny_task()
    base = task.loss
    task.loss = lambda out, batch: base(out, batch) * 1e7
    with pytest.raises(ValueError, match="overflows --dtype float16"):
        collect(cfg(dtype="float16", clip=False, noise_multiplier=0.0, lr=1e-9), out=tmp_path / "h", task=task)



def test_the_trainer_writes_its_rows_through_a_gradient_recorder(tmp_path):
    """collect() is the trainer run with a GradientRecorder as its row sink: every stored row
    went through the recorder, which committed them, merged the final epsilon and marked the
    store complete; the trainer alone (no sink) writes no store."""
    from gradspec.collect import GradientRecorder
    from gradspec.train import train

    seen: list[GradientRecorder] = []
    put, commits = [], []

    def sink(store, **kw):
        rec = GradientRecorder.for_trainer(store, **kw)
        seen.append(rec)
        put_rows, commit = rec.put_rows, rec.commit
        rec.put_rows = lambda rows, meta: (put.append(len(rows)), put_rows(rows, meta))[-1]
        rec.commit = lambda **k: (commits.append(rec.rows_recorded), commit(**k))[-1]
        return rec

    task = tiny_task()
    res = train(cfg(steps=6, checkpoint_every=2), out=tmp_path / "a", task=task, write_store=True, sink=sink)
    assert len(seen) == 1 and seen[0].closed and seen[0].store.status == "complete"
    assert sum(put) == res.rows == 6 and commits == [2, 4, 6]  # one commit per checkpoint
    assert seen[0].store.config["final_epsilon"] == res.epsilon
    # the same run through collect() stores the same rows and metadata
    ref = collect(cfg(steps=6, checkpoint_every=2), out=tmp_path / "b", task=tiny_task())
    (rows_a, meta_a), (rows_b, meta_b) = read_all(res.store), read_all(ref.store)
    np.testing.assert_array_equal(rows_a, rows_b)
    for k in meta_a:
        np.testing.assert_array_equal(meta_a[k], meta_b[k])
    with pytest.raises(ValueError, match=r"write_store=True needs sink="):
        train(cfg(steps=2), out=tmp_path / "c", task=tiny_task(), write_store=True)
    assert not (tmp_path / "c").exists()
