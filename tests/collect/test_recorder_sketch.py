"""``GradientRecorder(sketch=M)`` (issue 37 §3): per-step rows from any loop stored as their
M-column sketch — a plain loop, an Opacus ``DPOptimizer``, a Hugging Face ``Trainer``, a DDP loop
on 2 ranks — each checked against the float64 reference sketch `sketch_rows` of the exact row
(an unsketched recorder in the same loop, or a batch-of-one reference loop), under the plan the
store holds; and the recorder's refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gradspec.collect import GradientRecorder
from gradspec.sketch import SketchPlan, dense_kinds, energy_weights, make_plan, sketch_rows
from gradspec.store import GradientStore

from ..train._ranks import run_ranks
from ..train.test_distributed import ROWS, _ok
from ._tiny import Tiny, tiny_task
from .test_recorder_distributed import _loop

M, J = 64, 4


def _reference(store: GradientStore, exact: np.ndarray | torch.Tensor) -> np.ndarray:
    return sketch_rows(SketchPlan.from_dict(store.sketch), torch.as_tensor(exact, dtype=torch.float64)).numpy()


def _plain_loop(tmp_path: Path, steps: int = 4, **sketch) -> tuple[GradientStore, GradientStore]:
    """One loop, two recorders of its ``.grad``: unsketched and sketched."""
    torch.manual_seed(0)
    model, data = Tiny(), tiny_task().train
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with GradientRecorder(out=tmp_path / "exact", model=model) as exact, \
            GradientRecorder(out=tmp_path / "sketch", model=model, **sketch) as sketched:
        for step in range(steps):
            batch = data.batch(torch.arange(8 * step, 8 * step + 8))
            loss = torch.nn.functional.cross_entropy(model(batch["tokens"]), batch["labels"])
            opt.zero_grad()
            loss.backward()
            for rec in (exact, sketched):
                rec.record_step(loss=loss.item(), batch_size=8)
            opt.step()
    return exact.store, sketched.store


def test_a_plain_loop_records_the_sketch_of_each_step_row(tmp_path):
    exact, sketched = _plain_loop(tmp_path, sketch=M, sketch_blocks=J, sketch_seed=4)
    sketched = GradientStore.open(sketched.path)
    sk = sketched.sketch
    assert sk["p"] == exact.p == 215 and sketched.p == sk["M"] <= M and len(sk["blocks"]) == J and sk["seed"] == 4
    want = _reference(sketched, exact.read())
    np.testing.assert_allclose(sketched.read(), want, rtol=1e-5, atol=2e-6 * np.abs(want).max())  # float32 products
    for key, values in exact.row_meta().items():
        np.testing.assert_array_equal(sketched.row_meta()[key], values)
    # the plan gradspec collect makes for the same parameters from its warm-up batch's mean clipped
    # gradient: columns split by each parameter's squared norm in the first row (numpy, float64)
    first = exact.read(rows=[0])[0].astype(np.float64)
    energies = {s.name: float(np.sum(first[s.offset : s.offset + s.numel] ** 2)) for s in exact.layout.params}
    kinds = dense_kinds(exact.layout, Tiny())
    plan = SketchPlan.from_dict(sk)
    assert plan == make_plan(exact.layout, kinds, M, seed=4, blocks=J, weights=energy_weights(exact.layout, energies))
    assert plan.weighting == "energy" and plan != make_plan(exact.layout, kinds, M, seed=4, blocks=J)
    assert sketched.row_kind == exact.row_kind and sketched.status == "complete"


def test_sqrt_size_weights_give_the_plan_made_before_any_row(tmp_path):
    exact, sketched = _plain_loop(tmp_path, steps=2, sketch=M, sketch_blocks=J, sketch_weights="sqrt-size")
    assert SketchPlan.from_dict(sketched.sketch) == make_plan(exact.layout, dense_kinds(exact.layout, Tiny()), M,
                                                              seed=0, blocks=J)
    want = _reference(sketched, exact.read())
    np.testing.assert_allclose(sketched.read(), want, rtol=1e-5, atol=2e-6 * np.abs(want).max())


def test_the_energy_plan_waits_for_the_first_row(tmp_path):
    """The store of an energy-split sketch is created at the first row; config given before it is
    kept; a recorder closed before any row leaves an empty, complete store split by sqrt(size);
    an existing store is refused at construction, as without a sketch."""
    model = Tiny()
    with GradientRecorder(out=tmp_path / "a", model=model, sketch=M, sketch_blocks=J) as rec:
        assert rec.store is None and not (tmp_path / "a" / "gradients.zarr").exists()
        rec.update_config(note="before the first row")
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        rec.record_step(batch_size=0)  # an empty Poisson batch: no row, still no store
        assert rec.store is None
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        rec.record_step(batch_size=8)
        assert rec.store is not None and rec.plan.weighting == "energy"
    store = GradientStore.open(tmp_path / "a" / "gradients.zarr")
    assert store.n_rows == 1 and store.config["note"] == "before the first row"
    with GradientRecorder(out=tmp_path / "b", model=model, sketch=M, sketch_blocks=J):
        pass
    empty = GradientStore.open(tmp_path / "b" / "gradients.zarr")
    assert empty.n_rows == 0 and empty.status == "complete" and empty.sketch["weighting"] == "sqrt-size"
    with pytest.raises(FileExistsError, match="already holds a gradient store"):
        GradientRecorder(out=tmp_path / "b", model=model, sketch=M, sketch_blocks=J)


def test_an_all_zero_first_row_keeps_the_sqrt_size_split(tmp_path, caplog):
    model = Tiny()
    with GradientRecorder(out=tmp_path, model=model, sketch=M, sketch_blocks=J) as rec:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        rec.record_step(batch_size=8)
    assert rec.plan.weighting == "sqrt-size" and "not by the first row's energies" in caplog.text
    assert GradientStore.open(rec.path).n_rows == 1


def test_a_recorder_resumes_a_sketch_only_with_its_plan(tmp_path):
    _, first = _plain_loop(tmp_path / "a", steps=2, sketch=M, sketch_blocks=J)
    out = Path(first.path).parent
    model = Tiny()
    with pytest.raises(ValueError, match=r"holds rows of sketch=64, sketch_seed=0.*would write rows of sketch=64, "
                                         r"sketch_seed=1"):
        GradientRecorder(out=out, model=model, resume=True, sketch=M, sketch_blocks=J, sketch_seed=1)
    with pytest.raises(ValueError, match="would write unsketched rows"):
        GradientRecorder(out=out, model=model, resume=True)
    with GradientRecorder(out=out, model=model, resume=True, sketch=M, sketch_blocks=J) as rec:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        rec.record_step(batch_size=1)
    store = GradientStore.open(first.path)
    assert store.n_rows == 3
    want = _reference(store, np.ones((1, 215)))[0]
    np.testing.assert_allclose(store.read(rows=[2])[0], want, rtol=1e-5, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize(("options", "says"), [
    ({"sketch": 215}, r"sketch=215 is not below p = 215.*give sketch=214 or less"),
    ({"sketch": M, "per_example": True}, "sketches per-step rows"),
    ({"sketch": 4, "sketch_blocks": 4}, "--sketch >= "),
    ({"sketch": M, "sketch_weights": "size"}, "sketch_weights='size': one of 'energy', 'sqrt-size'"),
])
def test_refusals_leave_nothing_behind(tmp_path, options, says):
    with pytest.raises(ValueError, match=says):
        GradientRecorder(out=tmp_path / "run", model=Tiny(), **options)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------- Opacus
def test_an_opacus_loop_records_the_sketch_of_the_mean_clipped_gradient(tmp_path):
    pytest.importorskip("opacus")
    from torch import nn

    from .test_opacus_adapter import clipped_rows, private, snapshot

    _, (model, optimizer, loader) = private()
    refs = []
    with GradientRecorder(out=tmp_path, model=model, sketch=40, sketch_blocks=2) as recorder:
        recorder.attach_opacus(optimizer)
        for x, y in loader:
            ref = snapshot(model)
            nn.functional.cross_entropy(model(x), y).backward()
            if len(x):
                refs.append(clipped_rows(ref, x, y).mean(0))
            optimizer.step()
            optimizer.zero_grad()
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert store.sketch["p"] == 75 and store.p == store.sketch["M"] <= 40 and store.n_rows == len(refs) > 0
    want = _reference(store, torch.stack(refs))
    np.testing.assert_allclose(store.read(), want, rtol=1e-5, atol=1e-7 * np.abs(want).max())
    assert store.config["source"] == "opacus"


# ---------------------------------------------------------------------- Hugging Face
def test_a_hugging_face_trainer_records_the_sketch_of_each_step(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gradspec.collect import GradientRecorderCallback

    from .test_hf_adapter import reference_gradient, train

    callback = GradientRecorderCallback(out=tmp_path / "run", sketch=512, sketch_blocks=4)
    data, weights, _ = train(tmp_path, callback, steps=2)
    store = GradientStore.open(tmp_path / "run" / "gradients.zarr")
    names = [s["name"] for s in store.sketch["params"]]
    assert store.n_rows == 2 and store.p == store.sketch["M"] <= 512 and store.config["source"] == "hf-trainer"
    exact = torch.stack([reference_gradient(weights[s], data.batch(slice(4 * s, 4 * s + 4)), names)[0]
                         for s in range(2)])
    want = _reference(store, exact)
    np.testing.assert_allclose(store.read(), want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
    with pytest.raises(ValueError, match="give it to your GradientRecorder"):
        GradientRecorderCallback(recorder=GradientRecorder(out=tmp_path / "r", model=Tiny()), sketch=64)


# ---------------------------------------------------------------------- DDP on 2 ranks
def _ddp_sketch_rank(rank: int, out: Path) -> dict:
    return _loop(out, rank, 2, sketch=M, sketch_blocks=J)


@pytest.mark.slow
def test_a_ddp_loop_on_two_ranks_records_the_sketch_on_rank_0(tmp_path):
    """Rank 0 sketches DDP's averaged gradient (the sketch is linear: the average of the ranks'
    sketches), the other rank writes nothing; both make the same energy plan from the first row,
    which every rank holds after the all-reduce."""
    lead, other = _ok(run_ranks(_ddp_sketch_rank, tmp_path / "ddp"))
    assert lead["store"] and not other["store"]
    assert lead["plan"] == other["plan"] and lead["plan"]["weighting"] == "energy"
    _loop(tmp_path / "one", 0, 1)
    two, one = GradientStore.open(tmp_path / "ddp" / "gradients.zarr"), GradientStore.open(tmp_path / "one" / "gradients.zarr")
    assert two.status == "complete" and two.n_rows == one.n_rows
    want = _reference(two, one.read())
    np.testing.assert_allclose(two.read(), want, atol=ROWS["atol"] * np.abs(want).max(), rtol=ROWS["rtol"])
