"""GradientRecorder: rows and metadata as collect stores them, resume, crash safety, bad input."""

from __future__ import annotations

import doctest
import math
import threading

import numpy as np
import pytest
import torch
from torch import nn

from gradspec.collect import (
    CollectConfig,
    GradientRecorder,
    PerExampleGradients,
    PoissonSampler,
    ShuffleSampler,
    collect,
)
from gradspec.collect import _recorder as recorder_module
from gradspec.collect._rows import (
    DIVISOR_ACTUAL,
    ROW_EXAMPLE,
    ROW_EXAMPLE_UNCLIPPED,
    ROW_MEAN,
    ROW_MEAN_UNCLIPPED,
)
from gradspec.store import META_FIELDS, GradientStore, ParamLayout

from ._tiny import tiny_task

C = 0.1


def store_of(tmp_path, name="run") -> GradientStore:
    return GradientStore.open(tmp_path / name / "gradients.zarr")


def test_docstring_example_runs():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(recorder_module.GradientRecorder, "GradientRecorder", globs={}):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("sampling", ["shuffle", "poisson"])
@pytest.mark.parametrize("mode", ["batch", "per-example"])
def test_rows_and_metadata_match_collect(tmp_path, mode, sampling):
    """Recording what gradspec's trainer computes gives its rows and metadata, field for field.

    A per-step row is the mean clipped gradient over the examples the batch had (under
    Poisson sampling, 10 here, not the expected 16).
    """
    task = tiny_task()
    model = tiny_task().model  # same seed: the initial weights collect starts from
    config = CollectConfig(task="tiny", steps=1, batch_size=16, noise_multiplier=0.0, max_grad_norm=C,
                           sampling=sampling, mode=mode, optimizer="sgd", lr=0.1)
    ran = collect(config, out=tmp_path / "collect", task=task)
    n = len(task.train)
    if sampling == "poisson":
        idx = PoissonSampler(n, 16 / n, seed=config.seed + 1).next()
        assert len(idx) != 16
    else:
        idx = ShuffleSampler(n, 16, seed=config.seed + 1).next()
    batch = task.train.batch(idx)
    names = [n for n, _ in model.named_parameters()]
    grads, losses = PerExampleGradients(model, task.forward, task.loss, names)(batch)
    norms = grads.norm(dim=1)
    clipped = grads * (C / (norms + 1e-6)).clamp(max=1.0)[:, None]
    with GradientRecorder(out=tmp_path / "run", model=model, max_grad_norm=C, per_example=mode != "batch") as rec:
        if mode == "batch":
            rec.record_step(grad=clipped.mean(0), loss=losses.mean(), batch_size=len(idx), norms=norms)
        else:
            rec.record_examples(grads=clipped, loss=losses, example_index=idx, norms=norms)
    want, got = GradientStore.open(ran.store), store_of(tmp_path)
    assert got.layout == want.layout and got.per_example == want.per_example
    np.testing.assert_allclose(got.read(), want.read(), rtol=1e-5, atol=1e-7)
    mw, mg = want.row_meta(), got.row_meta()
    per_example = {"example_index", "pre_clip_norm", "clip_factor"}  # each example's own norm (issue 22)
    assert set(mg) == set(mw) == set(META_FIELDS) | (per_example if mode != "batch" else set())
    for k in mw:
        assert mg[k].dtype == mw[k].dtype, k
        np.testing.assert_allclose(mg[k], mw[k], rtol=1e-5, err_msg=k)
    if mode != "batch":  # the norms per parameter: collect's from its rows, the recorder's from clipped rows
        np.testing.assert_allclose(got.param_norms(), want.param_norms(), rtol=1e-5)
    assert mw["frac_clipped"][0] > 0  # clipping was active
    assert got.config["row"] == (ROW_MEAN if mode == "batch" else ROW_EXAMPLE)
    assert got.config["row_divisor"] == (DIVISOR_ACTUAL if mode == "batch" else None)


def test_an_empty_batch_has_no_row(tmp_path):
    """As in collect: a step whose (Poisson) batch is empty stores no row; its step number is used."""
    model = nn.Linear(3, 2)
    with GradientRecorder(out=tmp_path / "run", model=model) as rec:
        rec.record_step(grad=torch.ones(8), batch_size=4)
        rec.observe_loss(math.nan)  # the mean loss of no example
        rec.record_step(grad=torch.full((8,), math.nan), batch_size=0)  # no row, no NaN error
        rec.record_step(grad=torch.ones(8), batch_size=3, loss=0.5)
        with pytest.raises(ValueError, match="number of examples"):
            rec.record_step(grad=torch.ones(8), batch_size=-1)
    store = store_of(tmp_path)
    assert store.n_rows == 2
    meta = store.row_meta()
    np.testing.assert_array_equal(meta["step"], [0, 2])
    np.testing.assert_array_equal(meta["batch_size"], [4, 3])
    assert np.isnan(meta["loss"][0]) and meta["loss"][1] == 0.5
    assert store.config["row"] == ROW_MEAN_UNCLIPPED  # no max_grad_norm: unclipped rows
    with GradientRecorder(out=tmp_path / "pe", model=model, per_example=True) as rec:
        rec.record_examples(grads=torch.zeros(0, 8), step=0)
        rec.record_examples(grads=torch.ones(2, 8), step=1)
    store = store_of(tmp_path, "pe")
    np.testing.assert_array_equal(store.row_meta()["step"], [1, 1])
    assert store.config["row"] == ROW_EXAMPLE_UNCLIPPED and store.config["row_divisor"] is None


def test_gradient_forms_give_the_same_row(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    nn.functional.mse_loss(model(torch.randn(5, 3)), torch.randn(5, 2)).backward()
    named = dict(model.named_parameters())
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    with GradientRecorder(out=tmp_path / "run", model=model, params="*", background=False) as rec:
        rec.record_step()  # reads .grad
        rec.record_step(grad={n: p.grad for n, p in named.items()})
        rec.record_step(grad=[p.grad for p in model.parameters()])
        rec.record_step(grad=flat.numpy())
        rec.record_step(grad=flat[None], step=10, epoch=2)
    store = store_of(tmp_path)
    np.testing.assert_array_equal(store.read(), np.tile(flat.numpy(), (5, 1)))
    meta = store.row_meta()
    np.testing.assert_array_equal(meta["step"], [0, 1, 2, 3, 10])
    np.testing.assert_array_equal(meta["epoch"], [0, 0, 0, 0, 2])
    assert np.isnan(meta["loss"]).all() and np.isnan(meta["norm_mean"]).all()  # not given: unknown
    # a row owns its memory: changing .grad afterwards does not change what was recorded
    with GradientRecorder(out=tmp_path / "own", model=model) as rec:
        rec.record_step(grad=flat)
        flat.add_(1.0)
        rec.record_step()
    assert not np.array_equal(*store_of(tmp_path, "own").read()[[0]], flat.numpy())


def test_params_mapping_and_layout_sources(tmp_path):
    w = torch.zeros(2, 3, requires_grad=True)
    with GradientRecorder(out=tmp_path / "a", params={"w": w}) as rec:
        w.grad = torch.ones(2, 3)
        rec.record_step()
    assert store_of(tmp_path, "a").layout.names == ["w"]
    layout = ParamLayout.from_shapes([("a", (2,)), ("b", (3,))])
    with GradientRecorder(out=tmp_path / "b", layout=layout, per_example=True) as rec:
        rec.record_examples(grads=np.arange(10.0).reshape(2, 5), step=0, loss=[0.5, 1.5], example_index=[7, 9])
        rec.record_examples(grads={"a": torch.ones(1, 2), "b": torch.ones(1, 3)}, step=0)
        with pytest.raises(ValueError, match="knows no parameters"):
            rec.record_examples(grads=None)
    store = store_of(tmp_path, "b")
    meta = store.row_meta()
    np.testing.assert_array_equal(meta["example_index"], [7, 9, -1])
    np.testing.assert_array_equal(meta["step"], [0, 0, 0])
    np.testing.assert_allclose(meta["norm_mean"][:2], np.linalg.norm(np.arange(10.0).reshape(2, 5), axis=1).mean())


def test_resume_continues_after_committed_rows_and_checks_layout(tmp_path):
    model = nn.Linear(3, 2)
    with GradientRecorder(out=tmp_path / "run", model=model) as rec:
        for s in range(3):
            rec.record_step(grad=torch.full((8,), float(s)), epoch=1)
    with pytest.raises(FileExistsError, match="resume=True"):
        GradientRecorder(out=tmp_path / "run", model=model)
    with GradientRecorder(out=tmp_path / "run", model=model, resume=True) as rec:
        assert rec.next_step == 3 and rec.epoch == 1 and rec.store.status == "writing"
        rec.record_step(grad=torch.full((8,), 3.0))
        rec.record_step(grad=torch.full((8,), 9.0))
        assert rec.rewind(4) == 4 and rec.next_step == 4  # drop the rows of steps >= 4
        rec.record_step(grad=torch.full((8,), 4.0))
    store = store_of(tmp_path)
    assert store.status == "complete"
    np.testing.assert_array_equal(store.read()[:, 0], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(store.row_meta()["step"], [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"another parameter layout.*\('weight', \(2, 3\)\).*\('weight', \(4, 3\)\)"):
        GradientRecorder(out=tmp_path / "run", model=nn.Linear(3, 4), resume=True)
    with pytest.raises(ValueError, match="per_example=False"):
        GradientRecorder(out=tmp_path / "run", model=model, resume=True, per_example=True)
    with pytest.raises(FileNotFoundError, match="no store to resume"):
        GradientRecorder(out=tmp_path / "none", model=model, resume=True)
    with GradientRecorder(out=tmp_path / "run", model=model, overwrite=True):
        pass
    assert store_of(tmp_path).n_rows == 0


def test_a_resume_onto_a_damaged_chunk_is_refused_and_the_store_left_as_it_was(tmp_path):
    """A recorder's resume checks what the trainer's does: a flipped bit in the chunk it would
    append to (was: zarr's "Stored and computed checksum do not match" at the first commit)."""
    model = nn.Linear(3, 2)
    with GradientRecorder(out=tmp_path / "run", model=model) as rec:
        for s in range(3):
            rec.record_step(grad=torch.full((8,), float(s)))
    chunk = tmp_path / "run" / "gradients.zarr" / "grads" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[5] ^= 0x01
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"grads chunk c/0/0 \(rows 0..2\), which the resume would append to, is "
                                         r"corrupt.*record anew with overwrite=True"):
        GradientRecorder(out=tmp_path / "run", model=model, resume=True)
    assert chunk.read_bytes() == bytes(raw) and store_of(tmp_path).status == "complete"


def test_commits_and_an_error_in_the_block(tmp_path):
    model = nn.Linear(3, 2)
    with (
        pytest.raises(RuntimeError, match="boom"),
        GradientRecorder(out=tmp_path / "run", model=model, commit_every=2) as rec,
    ):
        rec.record_step(grad=torch.ones(8))
        rec.record_step(grad=torch.ones(8))  # second step: committed in the background
        rec.commit(wait=True)
        assert store_of(tmp_path).n_rows == 2  # readers see committed rows while it runs
        rec.record_step(grad=torch.ones(8))
        raise RuntimeError("boom")
    store = store_of(tmp_path)
    assert store.status == "writing" and store.n_rows == 3  # kept, never marked complete
    with pytest.raises(ValueError, match="closed"):
        rec.record_step(grad=torch.ones(8))


def test_commits_come_every_commit_every_steps_but_at_most_once_every_commit_seconds(tmp_path):
    """A commit writes each row's metadata arrays: in a 5 ms step, committing every 32 steps took
    1.43x a plain step, so automatic commits are at least ``commit_seconds`` apart; 0 restores
    a commit every ``commit_every`` steps exactly. An explicit commit() is never held back."""
    model = nn.Linear(3, 2)
    with GradientRecorder(out=tmp_path / "a" / "run", model=model, commit_every=1, commit_seconds=0) as rec:
        for _ in range(3):
            rec.record_step(grad=torch.ones(8))
            assert rec.cadence.steps == 0  # the step asked for its commit
    assert store_of(tmp_path / "a").n_rows == 3
    with GradientRecorder(out=tmp_path / "b" / "run", model=model, commit_every=1, commit_seconds=3600) as rec:
        for _ in range(3):
            rec.record_step(grad=torch.ones(8))
        assert rec.cadence.steps == 3  # no commit asked for: the hour has not passed
        assert store_of(tmp_path / "b").n_rows == 0
        rec.commit(wait=True)
        assert store_of(tmp_path / "b").n_rows == 3
    assert store_of(tmp_path / "b").n_rows == 3 and store_of(tmp_path / "b").status == "complete"
    with pytest.raises(ValueError, match="commit_seconds must be a number of seconds >= 0"):
        GradientRecorder(out=tmp_path / "c", model=model, commit_seconds=-1)
    assert not (tmp_path / "c").exists()


def test_one_writer_per_run_directory(tmp_path):
    from gradspec.store._lock import DirectoryBusyError

    model = nn.Linear(3, 2)
    errors: list[BaseException] = []

    def second_writer() -> None:
        try:
            GradientRecorder(out=tmp_path / "run", model=model, resume=True)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            errors.append(exc)

    with GradientRecorder(out=tmp_path / "run", model=model):
        thread = threading.Thread(target=second_writer)
        thread.start()
        thread.join()
    assert len(errors) == 1 and isinstance(errors[0], DirectoryBusyError)
    assert "one writer at a time" in str(errors[0])
    with GradientRecorder(out=tmp_path / "run", model=model, resume=True):  # released at close
        pass


def test_bad_input(tmp_path):
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="needs the recorded parameters"):
        GradientRecorder(out=tmp_path / "x")
    with pytest.raises(ValueError, match="not several"):
        GradientRecorder(out=tmp_path / "x", model=model, layout=ParamLayout.from_shapes([("a", (1,))]))
    with pytest.raises(ValueError, match="no parameter of Linear matches"):
        GradientRecorder(out=tmp_path / "x", model=model, params="nothing*")
    with GradientRecorder(out=tmp_path / "run", model=model, background=False) as rec:
        with pytest.raises(ValueError, match=r"shape \(7,\); expected \(8,\)"):
            rec.record_step(grad=torch.ones(7))
        with pytest.raises(ValueError, match="'weight' has no .grad at step 0"):
            rec.record_step()
        with pytest.raises(ValueError, match="'bias' at step 0 has shape"):
            rec.record_step(grad={"weight": torch.ones(2, 3), "bias": torch.ones(3)})
        with pytest.raises(ValueError, match="step 0 has NaN or infinite values"):
            rec.record_step(grad=torch.full((8,), math.nan))
        with pytest.raises(ValueError, match="use record_step"):
            rec.record_examples(grads=torch.ones(2, 8))
        rec.record_step(grad=torch.ones(8), step=5)
        with pytest.raises(ValueError, match="step 5 comes after step 5"):
            rec.record_step(grad=torch.ones(8), step=5)
    assert store_of(tmp_path).n_rows == 1
    with GradientRecorder(out=tmp_path / "pe", model=model, per_example=True, skip_nonfinite=True) as rec:
        with pytest.raises(ValueError, match="use record_examples"):
            rec.record_step(grad=torch.ones(8))
        with pytest.raises(ValueError, match="loss has 3 values for the 2 rows of step 0"):
            rec.record_examples(grads=torch.ones(2, 8), loss=[1.0, 2.0, 3.0])
        bad = torch.ones(2, 8)
        bad[1, 0] = math.inf
        rec.record_examples(grads=bad)  # skipped with a warning
        assert rec.steps_skipped == 1
        rec.record_examples(grads=torch.ones(2, 8))
    assert store_of(tmp_path, "pe").n_rows == 2
