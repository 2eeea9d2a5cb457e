"""`gradspec collect --sketch M` end to end on the CNN task (Conv2d, Linear, biases): the store
holds M columns and the plan; its rows are the reference sketch of the clipped per-example
gradients, regenerated from the store's attributes alone; `gradspec info` shows the sketch
line; `gradspec pca` runs on it; a resume continues with the same rows and refuses another
plan; and every misuse is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from gradspec.privacy import clip_factors
from gradspec.sketch import FACTORED_VERSION, SketchPlan, sketch_rows
from gradspec.store import GradientStore

runner = CliRunner()

CNN = ["--task", "cnn", "-t", "n_train=200", "--batch-size", "6", "--sampling", "shuffle", "--eval-every", "0",
       "--no-progress", "--noise-multiplier", "1.0", "-C", "0.5"]
SKETCH = ["--per-example", "--sketch", "1024", "--sketch-blocks", "4", "--sketch-seed", "5"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # many small products: one intra-op thread is faster on a busy machine (and
    # every run of the module sums in the same order, so a resumed run's rows equal bit for bit)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sketch") / "run"
    res = invoke("collect", "--out", out, "--steps", 3, *CNN, *SKETCH)
    assert res.exit_code == 0, res.output
    return out


def _reference_rows(store: GradientStore, rows: slice) -> np.ndarray:
    """The sketch, from the store's attributes alone, of step 0's clipped per-example gradients
    (the task's model at its start, the examples the store names, a batch-of-one loop)."""
    from gradspec.tasks import make_task

    cfg = store.config
    task = make_task("cnn", seed=0, n_train=200)
    model = task.model.double().eval()
    names = cfg["parameters"]
    params = [model.get_parameter(n) for n in names]
    meta = store.row_meta(rows)
    batch = task.train.batch(torch.as_tensor(meta["example_index"]))
    grads = []
    for i in range(len(meta["example_index"])):
        one = {k: (v[i : i + 1].double() if v.is_floating_point() else v[i : i + 1]) for k, v in batch.items()}
        loss = task.loss(task.forward(model, one), one).sum()
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    h = torch.stack(grads)
    c = clip_factors(h.norm(dim=1), cfg["max_grad_norm"])
    return sketch_rows(SketchPlan.from_dict(store.sketch), c[:, None] * h).numpy(), h


def test_store_rows_are_the_sketch_regenerated_from_its_attributes(run):
    store = GradientStore.open(run / "gradients.zarr")
    sk = store.sketch
    assert sk["kind"] == "kronecker-gaussian" and sk["version"] == FACTORED_VERSION and sk["seed"] == 5  # per example
    assert store.p == sk["M"] <= 1024 and len(sk["blocks"]) == 4 and store.per_example
    assert sk["p"] == sum(int(np.prod(q["shape"])) for q in sk["params"]) > 20_000
    kinds = {q["name"]: q["kind"] for q in sk["params"]}
    # a weight is sketched by Kronecker pairs, or (plan version 2) densely where its J factors are small
    assert {kinds["features.0.weight"], kinds["features.3.weight"], kinds["classifier.1.weight"]} <= {"kronecker",
                                                                                                      "dense"}
    assert kinds["classifier.3.bias"] == "exact"
    assert store.layout.names == ["sketch.exact", "sketch.block0", "sketch.block1", "sketch.block2", "sketch.block3"]
    step0 = np.flatnonzero(store.row_meta()["step"] == 0)
    rows = slice(int(step0[0]), int(step0[-1]) + 1)
    want, h = _reference_rows(store, rows)
    got = store.read(rows)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
    # the norms are exact (ghost norms), per example and per parameter
    np.testing.assert_allclose(store.row_norms(rows), h.norm(dim=1).numpy(), rtol=1e-5)
    assert store.param_norms(rows).shape == (h.shape[0], len(sk["params"]))
    assert (store.clip_factors() <= 1).all()


def test_vmap_sketches_the_per_example_rows_it_forms_with_sign_masks(tmp_path):
    """--backend vmap forms each per-example gradient, so its rows get the column-mixed,
    sign-masked plan (version 4) of the same columns ghost clipping's version-2 plan has: each
    stored row is that plan applied to the exact clipped row (a batch-of-one loop), and the norms
    stay exact."""
    out = tmp_path / "vmap"
    res = invoke("collect", "--out", out, "--steps", 2, *CNN, "--per-example", "--sketch", 4096, "--sketch-blocks", 4,
                 "--sketch-seed", 5, "--backend", "vmap")  # M = 4096: classifier.1.weight in Kronecker pairs
    assert res.exit_code == 0, res.output
    store = GradientStore.open(out / "gradients.zarr")
    plan = SketchPlan.from_dict(store.sketch)
    assert plan.version == 4 and plan.rotated and store.per_example
    assert any(s.kind == "kronecker" for s in plan.params)  # a sign mask is used
    step0 = np.flatnonzero(store.row_meta()["step"] == 0)
    rows = slice(int(step0[0]), int(step0[-1]) + 1)
    want, h = _reference_rows(store, rows)
    got = store.read(rows)
    assert np.linalg.norm(got - want) <= 1e-5 * np.linalg.norm(want)
    clipped = torch.as_tensor(h) * torch.as_tensor(store.clip_factors()[rows])[:, None]
    for version in (2, 3):  # the check can fail: no mask, or no mixing
        other = sketch_rows(SketchPlan.from_dict({**store.sketch, "version": version}), clipped).numpy()
        assert np.linalg.norm(got - other) > 1e-2 * np.linalg.norm(want), version
    np.testing.assert_allclose(store.row_norms(rows), h.norm(dim=1).numpy(), rtol=1e-5)


def test_info_shows_the_sketch_and_pca_runs(run):
    res = invoke("info", run / "gradients.zarr")
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("sketch "))
    assert "kronecker-gaussian version 2" in line and "4 independent blocks" in line and "seed 5" in line
    assert line.endswith("columns by energy")  # the plan records its split (--sketch-weights energy, the default)
    res = invoke("pca", run / "gradients.zarr", "--k", 3, "--out", run.parent / "spectrum.zarr")
    assert res.exit_code == 0, res.output
    # the block bootstrap's intervals say what they measured, where (not the old jackknife's caveat)
    assert "calibrated" in res.output and "docs/sketch_calibration.md" in res.output, res.output
    assert "not yet calibrated" not in res.output, res.output
    res = invoke("retrain", "--out", run.parent / "retrain", "-a", "pdp-sgd", "--projector",
                 run.parent / "spectrum.zarr", "--rank", 2, "--steps", 1, *CNN[:4], "--eval-every", "0")
    assert res.exit_code != 0 and "sketched gradient store" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_resume_continues_the_rows_and_refuses_another_plan(run, tmp_path):
    out = tmp_path / "split"
    res = invoke("collect", "--out", out, "--steps", 3, "--stop-after", 1, "--checkpoint-every", 1, *CNN, *SKETCH)
    assert res.exit_code == 0, res.output
    res = invoke("collect", "--out", out, "--resume", "--sketch", 512)
    assert res.exit_code != 0 and "--sketch (saved 1024, given 512)" in res.output, res.output
    res = invoke("collect", "--out", out, "--resume", "--sketch-seed", 6)
    assert res.exit_code != 0 and "--sketch-seed" in res.output, res.output
    res = invoke("collect", "--out", out, "--resume")
    assert res.exit_code == 0, res.output
    whole, split = GradientStore.open(run / "gradients.zarr"), GradientStore.open(out / "gradients.zarr")
    assert split.sketch == whole.sketch and split.status == "complete"
    np.testing.assert_array_equal(split.read(), whole.read())


@pytest.mark.parametrize(("extra", "says"), [
    (["--sketch", "26010", "--per-example"], "give --sketch 26009 or less"),
    (["--sketch", "64", "--per-example", "--sketch-blocks", "1"], "--sketch-blocks must be >= 2"),
    (["--sketch-seed", "3"], "add --sketch"),
    (["--sketch", "16", "--per-example"], "--sketch >= "),
    (["--per-example", "--mode", "batch"], "contradict"),
])
def test_refusals_are_one_line(tmp_path, extra, says):
    res = invoke("collect", "--out", tmp_path / "run", "--steps", 2, *CNN, *extra)
    assert res.exit_code != 0 and says in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
