"""A plan applied to dense gradients (`DenseSketch`, the per-step rows of issue 37) against the
float64 reference `sketch_rows`; the kinds of a dense gradient's parameters; the refusal of an
M at or above p; the note that says why a plan stores fewer columns than were asked for."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from gradspec._layout import ParamLayout
from gradspec.sketch import (
    WIDTH_NOTE_KEY,
    DenseSketch,
    SketchPlan,
    check_width,
    dense_kinds,
    make_plan,
    plan_attribute,
    same_plan,
    sketch_rows,
    width_note,
)


class Model(nn.Module):
    """Every kind: an embedding (CountSketch x Gaussian), matrices wide and tall and a conv kernel
    (Kronecker, both orders of the two products), vectors (dense or exact)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 7)
        self.wide = nn.Linear(40, 6)
        self.tall = nn.Linear(5, 36)
        self.conv = nn.Conv2d(3, 8, 3)
        self.v = nn.Parameter(torch.zeros(90))


def _layout(model: nn.Module) -> ParamLayout:
    return ParamLayout.from_shapes((n, tuple(p.shape)) for n, p in model.named_parameters())


@pytest.fixture(scope="module")
def model() -> Model:
    return Model()


def test_kinds_of_a_dense_gradient(model):
    layout = _layout(model)
    kinds = dense_kinds(layout, model)
    assert kinds["emb.weight"] == "countsketch-kronecker"
    assert kinds["wide.weight"] == kinds["tall.weight"] == kinds["conv.weight"] == "kronecker"
    assert kinds["wide.bias"] == kinds["v"] == "dense"
    # without the module, by shape: the embedding is a matrix like any other
    assert dense_kinds(layout)["emb.weight"] == "kronecker"


@pytest.mark.parametrize(("m", "blocks"), [(120, 2), (400, 4), (1000, 3)])
def test_dense_sketch_equals_the_reference(model, m, blocks):
    layout = _layout(model)
    plan = make_plan(layout, dense_kinds(layout, model), m, seed=7, blocks=blocks)
    assert {s.kind for s in plan.params} >= {"countsketch-kronecker", "kronecker", "dense"}
    g = torch.randn(3, layout.p, dtype=torch.float64, generator=torch.Generator().manual_seed(m))
    want = sketch_rows(plan, g)
    sketch = DenseSketch(plan)
    got = sketch(g)
    assert got.dtype == torch.float64 and got.shape == (3, plan.M)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12 * float(want.abs().max()))
    # one row (p,) -> (M,); a float32 row is sketched in float64
    torch.testing.assert_close(sketch(g[1]), want[1], rtol=1e-12, atol=1e-12 * float(want.abs().max()))
    one = g[0].to(torch.float32)
    torch.testing.assert_close(sketch(one), sketch_rows(plan, one[None].double())[0], rtol=1e-12, atol=1e-10)
    # linear: the sketch of a mean is the mean of the sketches (the per-step row of per-example rows)
    torch.testing.assert_close(sketch(g.mean(0)), got.mean(0), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=f"p = {layout.p}"):
        sketch(g[:, :-1])


def test_both_orders_of_the_kronecker_products_are_used(model):
    """The wide and the tall matrix take the two product orders; both equal the reference
    (checked above); here only that the plan makes them differ in which order is cheaper."""
    layout = _layout(model)
    plan = make_plan(layout, dense_kinds(layout, model), 400, seed=1, blocks=2)
    by = {s.name: s for s in plan.params}

    def left_first(s) -> bool:
        (m0, m1), (d0, d1) = s.dims, s.matrix
        return m0 * d0 * d1 + m0 * d1 * m1 <= m1 * d0 * d1 + m0 * d0 * m1

    assert {left_first(by["wide.weight"]), left_first(by["tall.weight"])} == {True, False}


def test_m_at_or_above_p_is_refused_with_the_m_that_fits():
    check_width(99, 100)
    for m in (100, 101, 2**40):
        with pytest.raises(ValueError, match=r"is not below p = 100.*give --sketch 99 or less"):
            check_width(m, 100)
    with pytest.raises(ValueError, match=r"^sketch=100 is not below p = 100.*give sketch=99 or less"):
        check_width(100, 100, option="sketch=")


def test_width_note_says_why_fewer_columns_are_stored():
    # the CNN task's shapes (README: --sketch 1024 --sketch-blocks 4 stores 1,010 columns)
    shapes = [("features.0.weight", (16, 1, 8, 8)), ("features.0.bias", (16,)), ("features.3.weight", (32, 16, 4, 4)),
              ("features.3.bias", (32,)), ("classifier.1.weight", (32, 512)), ("classifier.1.bias", (32,)),
              ("classifier.3.weight", (10, 32)), ("classifier.3.bias", (10,))]
    layout = ParamLayout.from_shapes(shapes)
    plan = make_plan(layout, dense_kinds(layout), 1024, blocks=4)
    assert plan.M < 1024
    note = width_note(plan)
    share, spare = divmod(1024 - plan.exact_width, 4)
    assert note.startswith(f"asked 1,024, stored {plan.M:,} because ")
    assert f"{plan.exact_width} columns hold small parameters exactly (counted in M)" in note
    assert f"make 4 equal blocks of {share}" in note
    assert (f"({spare} left over)" in note) == (spare > 0)
    assert (f"so each block uses {plan.block_width}" in note) == (plan.block_width < share)
    assert plan.exact_width + 4 * plan.block_width == plan.M  # what the note adds up
    # kept in the store attribute, which reads back as the same plan
    attr = json.loads(json.dumps(plan_attribute(plan)))
    assert attr[WIDTH_NOTE_KEY] == note and SketchPlan.from_dict(attr) == plan and same_plan(attr, plan)
    assert not same_plan(attr, make_plan(layout, dense_kinds(layout), 1024, blocks=4, seed=1))
    assert not same_plan(attr, None) and same_plan(None, None)


def test_no_note_when_every_column_asked_for_is_stored():
    layout = ParamLayout.from_shapes([("v", (300,)), ("u", (200,))])
    plan = make_plan(layout, dense_kinds(layout), 100, blocks=2)
    assert plan.M == 100 and width_note(plan) is None and WIDTH_NOTE_KEY not in plan_attribute(plan)
