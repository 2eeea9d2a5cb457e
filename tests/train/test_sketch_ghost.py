"""The sketched rows of the ghost engine (``GhostClipping(..., sketch=True)``) against the dense
float64 reference ``gradspec.sketch.sketch_rows`` applied to a batch-of-one loop's rows: every
fast-path kind (Kronecker for Linear, Conv1D, Conv1d/2d with groups, MultiheadAttention's packed
and split projections; CountSketch x Gaussian for embeddings, broadcast position ids included;
dense and exact for biases and normalisations), in float64 (exact) and float32 (rounding)."""

from __future__ import annotations

import pytest
import torch

from gradspec.privacy import clip_factors
from gradspec.sketch import FACTORED_VERSION, make_plan, sketch_rows
from gradspec.store import update_attrs
from gradspec.train import GhostClipping, select_parameters

from .test_ghost_layers import _case
from .test_per_example import reference


@pytest.fixture(autouse=True)
def _one_thread():  # many small products: one intra-op thread is faster on a busy machine
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# name -> (M, blocks): small enough that big weights are sketched, large enough for exact ones
SIZES = {"bert": (3000, 3), "gpt2": (3000, 2), "embed_ln": (300, 2), "convs": (1200, 2), "attention": (900, 2)}


def _sketched(case, batch, names, name, rows):
    """Ghost clipping of ``case`` with SIZES[name]'s plan, clipped at the median reference norm:
    (engine, plan, result, clip factors of the float64 reference rows)."""
    ghost = GhostClipping(case.model, case.forward, case.loss, names)
    m, blocks = SIZES[name]
    plan = make_plan(ghost.layout, ghost.sketch_kinds(), m, seed=7, blocks=blocks, dense_budget=0,
                     version=FACTORED_VERSION)
    ghost.set_sketch(plan)
    norms = rows.norm(dim=1)
    c = float(norms.median())
    return ghost, plan, ghost(batch, c, sketch=True), clip_factors(norms, c)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_sketched_rows_equal_the_reference_float64(name):
    ref = _case(name)
    names = select_parameters(ref.model, ["*"])
    rows, _ = reference(ref, names)
    ghost, plan, res, factors = _sketched(ref, ref.batch, names, name, rows)
    want = sketch_rows(plan, factors[:, None] * rows)
    assert res.rows.shape == (rows.shape[0], plan.M)
    torch.testing.assert_close(res.rows, want, rtol=1e-9, atol=1e-11 * float(want.norm()))
    torch.testing.assert_close(res.factors, factors, rtol=1e-10, atol=0)
    per_param = torch.stack([rows[:, s.offset : s.stop].norm(dim=1) for s in ghost.layout.params], 1)
    torch.testing.assert_close(res.param_norms, per_param, rtol=1e-9, atol=1e-12)
    # the clipped sum is unchanged by sketching
    torch.testing.assert_close(res.total, (factors[:, None] * rows).sum(0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_sketched_rows_float32_within_rounding(name):
    ref = _case(name)
    names = select_parameters(ref.model, ["*"])
    rows, _ = reference(ref, names)
    case = _case(name, torch.float32)
    case.batch = {k: (v.float() if v.is_floating_point() else v) for k, v in ref.batch.items()}
    _, plan, res, factors = _sketched(case, case.batch, names, name, rows)
    want = sketch_rows(plan, factors[:, None] * rows)
    assert res.rows.dtype == torch.float32
    assert float((res.rows.double() - want).norm() / want.norm()) < 1e-5
    for spec in plan.params:  # each parameter's columns too, not only the whole
        cols = torch.cat([torch.arange(a, z) for a, z in spec.columns])
        w = want[:, cols]
        assert float((res.rows.double()[:, cols] - w).norm()) <= 1e-5 * float(w.norm()) + 1e-7 * float(want.norm())


def test_every_kind_is_exercised():
    kinds = {}
    for name in SIZES:
        case = _case(name)
        ghost = GhostClipping(case.model, case.forward, case.loss, select_parameters(case.model, ["*"]))
        plan = make_plan(ghost.layout, ghost.sketch_kinds(), SIZES[name][0], blocks=SIZES[name][1],
                         dense_budget=0)
        for s in plan.params:
            kinds.setdefault(s.kind, set()).add(name)
            if s.pairs > 1:
                kinds.setdefault("pairs", set()).add(name)
    assert set(kinds) == {"exact", "dense", "kronecker", "countsketch-kronecker", "pairs"}, kinds
    assert {"bert", "gpt2"} <= kinds["countsketch-kronecker"] and "convs" in kinds["kronecker"]


def test_microbatches_give_the_same_sketched_rows():
    case = _case("attention")
    names = select_parameters(case.model, ["*"])
    out = []
    for micro in (None, 2):
        ghost = GhostClipping(case.model, case.forward, case.loss, names, microbatch=micro)
        ghost.set_sketch(make_plan(ghost.layout, ghost.sketch_kinds(), 900, seed=1, blocks=2,
                                   version=FACTORED_VERSION))
        out.append(ghost(case.batch, 0.5, sketch=True))
    torch.testing.assert_close(out[1].rows, out[0].rows, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out[1].param_norms, out[0].param_norms, rtol=1e-12, atol=0)


def test_set_sketch_checks_the_plan():
    case = _case("embed_ln")
    names = select_parameters(case.model, ["*"])
    ghost = GhostClipping(case.model, case.forward, case.loss, names)
    with pytest.raises(ValueError, match="needs a plan"):
        ghost(case.batch, 1.0, sketch=True)
    kinds = ghost.sketch_kinds()
    assert kinds == {"embed.weight": "countsketch-kronecker", "norm.weight": "dense", "norm.bias": "dense",
                     "head.weight": "kronecker", "head.bias": "dense"}
    with pytest.raises(ValueError, match="'embed.weight' is planned as 'kronecker'"):
        ghost.set_sketch(make_plan(ghost.layout, {**kinds, "embed.weight": "kronecker"}, 300, blocks=2,
                                   dense_budget=0, version=FACTORED_VERSION))
    other = GhostClipping(case.model, case.forward, case.loss, names[:2])
    with pytest.raises(ValueError, match="build the plan from this engine's layout"):
        other.set_sketch(make_plan(ghost.layout, kinds, 300, blocks=2, version=FACTORED_VERSION))
    # the default (version-4) plan mixes and masks each formed gradient: ghost clipping forms none
    with pytest.raises(ValueError, match="version-4 sketch plan masks.*FACTORED_VERSION"):
        ghost.set_sketch(make_plan(ghost.layout, kinds, 300, blocks=2, dense_budget=0))


# ---------------------------------------------------------------------- the trainer
class _WithBilinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 6)
        self.bil = torch.nn.Bilinear(6, 6, 3)

    def forward(self, tokens):
        x = self.emb(tokens).mean(1)
        return self.bil(x, x)


def _config(**kw):
    from gradspec.train import TrainConfig

    base = dict(mode="per-example", sketch=120, sketch_blocks=2, steps=2, batch_size=8, sampling="shuffle",
                eval_every=0, noise_multiplier=1.0, checkpoint_every=1)
    return TrainConfig(**{**base, **kw})


def test_trainer_refuses_a_layer_without_ghost_rule_by_name(tmp_path):
    from gradspec.collect import collect

    from ..collect._tiny import tiny_task

    task = tiny_task()
    task.model = _WithBilinear()
    with pytest.raises(ValueError, match=r"layer 'bil'.*leave it out of --params") as err:
        collect(_config(), out=tmp_path / "run", task=task)
    assert "\n" not in str(err.value) and "vmap" not in str(err.value)


def test_resume_refuses_a_store_written_with_another_plan(tmp_path):
    import zarr

    from gradspec.collect import collect
    from gradspec.store import GradientStore

    from ..collect._tiny import tiny_task

    res = collect(_config(), out=tmp_path / "run", task=tiny_task(), stop_after=1)
    store = GradientStore.open(res.store)
    assert store.n_rows == 8 and store.p == store.sketch["M"] <= 120
    assert store.row_norms().shape == (8,) and store.param_norms().shape == (8, 7)
    group = zarr.open_group(str(res.store), mode="r+")
    update_attrs(group, {"gradspec.sketch": {**group.attrs["gradspec.sketch"], "seed": 99}})
    with pytest.raises(ValueError, match="--sketch-seed 99 .* but this resume would write .*--sketch-seed 0"):
        collect(None, out=tmp_path / "run", task=tiny_task(), resume=True)
