"""Sketched per-step rows (issue 37 §3, the paper's row kind): ``collect(sketch=M)`` without
per-example rows stores the sketch of each step's mean clipped gradient.

Checked against an unsketched per-step collection of the same seeded run: its stored rows are
the exact per-step rows, and the float64 reference `sketch_rows` of them, under the plan the
sketched store holds, is the sketched store's rows to float32 rounding (the sketch is computed
in float64 from the same float32 row and rounded once). Sketching changes nothing of the
training (the same metrics, bit for bit), works with every per-example engine, shares its map
with a per-example sketch of the same model and seed, and resumes like any run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec._layout import ParamLayout
from gradspec.collect import collect
from gradspec.sketch import (
    FACTORED_VERSION,
    SketchPlan,
    dense_kinds,
    energy_weights,
    make_plan,
    sketch_rows,
)
from gradspec.store import GradientStore

from ._tiny import tiny_task
from .test_collect import cfg, metrics_without_time

M, J = 96, 4


def _sketched(**kw):
    return cfg(sketch=M, sketch_blocks=J, sketch_seed=3, **{"steps": 6, **kw})


def warmup_weights(layout, mode: str = "batch", batch_size: int = 16, C: float = 1.0):  # noqa: N803
    """The energy weights a run's plan must use, from a batch-of-one loop: the clipped gradients
    of the first ``batch_size`` training examples at the starting weights; per parameter the
    squared norm of their mean (per-step rows) or their mean squared norm (per-example rows)."""
    task = tiny_task()
    model = task.model.eval()
    batch = task.train.batch(torch.arange(batch_size))
    clipped = []
    for i in range(batch_size):
        loss = torch.nn.functional.cross_entropy(model(batch["tokens"][i : i + 1]), batch["labels"][i : i + 1])
        g = torch.autograd.grad(loss, [model.get_parameter(s.name) for s in layout.params])
        flat = torch.cat([x.reshape(-1) for x in g]).double()
        clipped.append(flat * min(1.0, C / float(flat.norm())))
    rows = torch.stack(clipped)
    spans = [(s.offset, s.stop) for s in layout.params]
    if mode == "batch":
        mean = rows.mean(0)
        energies = {s.name: float(mean[a:b].square().sum()) for s, (a, b) in zip(layout.params, spans, strict=True)}
    else:
        energies = {s.name: float(rows[:, a:b].square().sum(1).mean()) for s, (a, b) in zip(layout.params, spans, strict=True)}
    return energy_weights(layout, energies)


def assert_rows_are_the_reference_of(sketched: GradientStore, exact: GradientStore) -> SketchPlan:
    """The sketched store's rows equal the float64 reference sketch of the exact per-step rows to
    float32 products: the recording sketches in float32 (``DenseSketch(dtype=float32)``), whose
    sums err by ~1e-6 of the row's largest sketched value (another plan differs by O(1))."""
    plan = SketchPlan.from_dict(sketched.sketch)
    want = sketch_rows(plan, torch.from_numpy(exact.read())).numpy()
    got = sketched.read()
    assert got.shape == (exact.n_rows, plan.M) and exact.n_rows > 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6 * np.abs(want).max())
    return plan


@pytest.mark.parametrize("backend", ["ghost", "vmap"])
def test_per_step_sketch_is_the_plan_of_the_exact_per_step_row(tmp_path, backend):
    exact = collect(cfg(backend=backend, steps=6), out=tmp_path / "exact", task=tiny_task())
    sketched = collect(_sketched(backend=backend), out=tmp_path / "sketch", task=tiny_task())
    a, b = GradientStore.open(exact.store), GradientStore.open(sketched.store)
    assert not b.per_example and b.p == b.sketch["M"] <= M and b.sketch["p"] == a.p == 215
    assert b.sketch["seed"] == 3 and len(b.sketch["blocks"]) == J
    plan = assert_rows_are_the_reference_of(b, a)
    # the plan of the parameters' dense gradients (an embedding by CountSketch x Gaussian, ...)
    model = tiny_task().model
    kinds = dense_kinds(a.layout, model)
    assert kinds["emb.weight"] == "countsketch-kronecker" and kinds["fc1.weight"] == "kronecker"
    # columns by the energies of a warm-up batch (the default), computed here batch-of-one
    weights = warmup_weights(a.layout)
    assert plan.weighting == "energy" and b.sketch["weighting"] == "energy"
    want = make_plan(a.layout, kinds, M, seed=3, blocks=J, weights=weights)
    assert plan == want, "the plan is not the one of the warm-up batch's energies"
    assert plan != make_plan(a.layout, kinds, M, seed=3, blocks=J)  # the check can fail
    # the same run: the same steps, batches, losses and norms; training untouched by the sketch
    for key, values in a.row_meta().items():
        np.testing.assert_array_equal(b.row_meta()[key], values)
    assert metrics_without_time(sketched.metrics) == metrics_without_time(exact.metrics)
    assert b.config["per_example_engine"] == a.config["per_example_engine"] == backend
    assert b.row_kind == a.row_kind  # the paper's row kind: the mean clipped gradient
    assert b.status == "complete"


def test_the_per_step_plan_is_the_per_example_plan_with_sign_masks(tmp_path):
    """One model and seed, by size: the per-step plan (version 4, the row is formed) has the
    per-example plan's columns (version 2, ghost clipping forms no gradient to mix or mask). The
    map is linear, so the per-step row's exact and dense columns are the mean of its examples'
    sketched ones; a Kronecker-kind parameter's are not, as its gradient is mixed and masked first
    (the tiny model has none at this M: tests/sketch/test_dense.py checks every kind's)."""
    steps = collect(_sketched(backend="ghost", steps=3, sketch_weights="sqrt-size"), out=tmp_path / "steps",
                    task=tiny_task())
    examples = collect(_sketched(backend="ghost", steps=3, mode="per-example", sketch_weights="sqrt-size"),
                       out=tmp_path / "ex", task=tiny_task())
    s, e = GradientStore.open(steps.store), GradientStore.open(examples.store)
    plan, per_example = SketchPlan.from_dict(s.sketch), SketchPlan.from_dict(e.sketch)
    assert (plan.version, per_example.version) == (4, 2) and plan.params == per_example.params
    assert s.sketch["weighting"] == "sqrt-size"
    masked = np.zeros(plan.M, dtype=bool)
    for spec in plan.params:
        for a, z in spec.columns:
            masked[a:z] = spec.kind in ("kronecker", "countsketch-kronecker")
    assert not masked.all()
    step_of = e.row_meta()["step"]
    rows = e.read()
    for i, step in enumerate(s.row_meta()["step"]):
        mine, got = rows[step_of == step], s.read(slice(i, i + 1))[0]
        np.testing.assert_allclose(got[~masked], mine.sum(0)[~masked] / len(mine), rtol=1e-5, atol=1e-7)


def test_a_per_step_sketch_resumes_as_one_uninterrupted_run(tmp_path):
    config = _sketched(backend="vmap")
    full = collect(config, out=tmp_path / "full", task=tiny_task())
    collect(config, out=tmp_path / "part", task=tiny_task(), stop_after=3)
    done = collect(out=tmp_path / "part", task=tiny_task(), resume=True)
    a, b = GradientStore.open(full.store), GradientStore.open(done.store)
    np.testing.assert_array_equal(b.read(), a.read())
    assert b.sketch == a.sketch and b.status == "complete"


def test_a_resume_keeps_the_stores_plan_and_runs_no_warm_up(tmp_path, monkeypatch):
    """The plan of an energy-weighted run is in its store: a resume continues with it and
    measures no warm-up batch again (it would cost a batch of per-example work)."""
    import gradspec.train._run

    config = _sketched(backend="ghost")
    full = collect(config, out=tmp_path / "full", task=tiny_task())
    collect(config, out=tmp_path / "part", task=tiny_task(), stop_after=3)

    def refuse(*args, **kwargs):
        raise AssertionError("a warm-up batch ran on resume")

    monkeypatch.setattr(gradspec.train._run, "warmup_batch", refuse)
    done = collect(out=tmp_path / "part", task=tiny_task(), resume=True)
    a, b = GradientStore.open(full.store), GradientStore.open(done.store)
    assert b.sketch == a.sketch and b.sketch["weighting"] == "energy" and b.status == "complete"
    np.testing.assert_array_equal(b.read(), a.read())
    with pytest.raises(AssertionError, match="warm-up batch ran"):  # a fresh run does measure one
        collect(config, out=tmp_path / "fresh", task=tiny_task())


def test_m_at_or_above_p_is_refused_before_anything_is_written(tmp_path):
    for m in (215, 2**40):
        with pytest.raises(ValueError, match=r"is not below p = 215.*give --sketch 214 or less"):
            collect(cfg(sketch=m), out=tmp_path / "run", task=tiny_task())
        assert not (tmp_path / "run").exists()
    # per-example rows too
    with pytest.raises(ValueError, match="is not below p = 215"):
        collect(cfg(sketch=215, mode="per-example"), out=tmp_path / "run", task=tiny_task())


@pytest.mark.parametrize("mode", ["batch", "per-example"])
def test_a_run_started_under_plan_version_1_resumes_with_its_own_plan(tmp_path, monkeypatch, mode):
    """A store written by the rules of an older gradspec (sketch plan version 1, issue 22) is
    continued with the plan it holds, not with the plan this gradspec would make: the new rows
    share the old rows' map (as in one uninterrupted version-1 run)."""
    import gradspec.sketch

    config = _sketched(backend="ghost", mode=mode, steps=4)
    real = gradspec.sketch.make_plan
    with monkeypatch.context() as m:  # the older gradspec
        # (version 1 took no weights: the energies this gradspec measures are dropped)
        m.setattr(gradspec.sketch, "make_plan", lambda *a, weights=None, version=None, **k: real(*a, version=1, **k))
        full = collect(config, out=tmp_path / "full", task=tiny_task())
        collect(config, out=tmp_path / "part", task=tiny_task(), stop_after=2)
    old = GradientStore.open(tmp_path / "part" / "gradients.zarr").sketch
    plan = SketchPlan.from_dict(old)
    layout = ParamLayout.from_shapes((s.name, s.shape) for s in plan.params)
    now = real(layout, dense_kinds(layout, tiny_task().model), M, seed=3, blocks=J)
    assert old["version"] == 1 and now.to_dict() != plan.to_dict()  # this gradspec makes another plan
    done = collect(out=tmp_path / "part", task=tiny_task(), resume=True)  # this gradspec
    a, b = GradientStore.open(full.store), GradientStore.open(done.store)
    assert b.sketch == a.sketch == old and b.status == "complete"
    np.testing.assert_array_equal(b.read(), a.read())


def test_per_example_plan_splits_columns_by_the_warm_up_examples_energies(tmp_path):
    """Per-example rows: columns by each parameter's mean squared clipped norm over the warm-up
    batch (what a stored row carries), computed here batch-of-one; training is untouched."""
    exact = collect(cfg(backend="vmap", steps=3, mode="per-example"), out=tmp_path / "exact", task=tiny_task())
    run = collect(_sketched(backend="ghost", steps=3, mode="per-example"), out=tmp_path / "sk", task=tiny_task())
    a, b = GradientStore.open(exact.store), GradientStore.open(run.store)
    plan = SketchPlan.from_dict(b.sketch)
    kinds = dense_kinds(a.layout, tiny_task().model)
    weights = warmup_weights(a.layout, mode="per-example")
    assert plan.weighting == "energy"
    assert plan == make_plan(a.layout, kinds, M, seed=3, blocks=J, weights=weights, version=FACTORED_VERSION)
    assert plan != make_plan(a.layout, kinds, M, seed=3, blocks=J, version=FACTORED_VERSION)  # the check can fail
    by_size = collect(_sketched(backend="ghost", steps=3, mode="per-example", sketch_weights="sqrt-size"),
                      out=tmp_path / "size", task=tiny_task())
    assert metrics_without_time(run.metrics) == metrics_without_time(by_size.metrics)  # the warm-up trains nothing
    np.testing.assert_allclose(b.read(), sketch_rows(plan, torch.from_numpy(a.read())).numpy(), rtol=1e-4,
                               atol=1e-6)


def test_sketch_weights_sqrt_size_is_the_plan_of_no_data(tmp_path):
    run = collect(_sketched(backend="vmap", steps=2, sketch_weights="sqrt-size"), out=tmp_path / "r",
                  task=tiny_task())
    s = GradientStore.open(run.store)
    plan = SketchPlan.from_dict(s.sketch)
    layout = ParamLayout.from_shapes((p.name, p.shape) for p in plan.params)
    assert plan.weighting == "sqrt-size"
    assert plan == make_plan(layout, dense_kinds(layout, tiny_task().model), M, seed=3, blocks=J)
    with pytest.raises(ValueError, match="--sketch-weights must be energy or sqrt-size"):
        cfg(sketch=M, sketch_weights="size")
