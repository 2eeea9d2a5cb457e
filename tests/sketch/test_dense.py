"""A plan applied to dense gradients (`DenseSketch`, the per-step rows of issue 37) against the
float64 reference `sketch_rows`; the kinds of a dense gradient's parameters; the refusal of an
M at or above p; the note that says why a plan stores fewer columns than were asked for."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from gradspec._layout import ParamLayout
from gradspec.sketch import (
    WIDTH_NOTE_KEY,
    DenseSketch,
    ParamSketch,
    SketchPlan,
    check_width,
    dense_kinds,
    make_plan,
    plan_attribute,
    row_energies,
    same_plan,
    sketch_rows,
    width_note,
)


class Model(nn.Module):
    """Every kind: embeddings (CountSketch x Gaussian), matrices wide and tall and a conv kernel
    (Kronecker), vectors (dense or exact)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 7)
        self.short_emb = nn.Embedding(6, 30)
        self.wide = nn.Linear(40, 6)
        self.tall = nn.Linear(5, 36)
        self.conv = nn.Conv2d(3, 8, 3)
        self.v = nn.Parameter(torch.zeros(90))


#: Per parameter, its kind, per-block dims (of one pair) and pairs a block in the hand-made plan
#: below: each Kronecker one takes the order of products (or of hashing) that is cheaper for its
#: shape, so both are used, with one pair and with several.
DIMS = {"emb.weight": ("countsketch-kronecker", (9, 2), 3), "short_emb.weight": ("countsketch-kronecker", (2, 20), 1),
        "wide.weight": ("kronecker", (2, 9), 1), "tall.weight": ("kronecker", (9, 2), 2),
        "conv.weight": ("kronecker", (3, 5), 1), "wide.bias": ("exact", (6,), 1), "tall.bias": ("dense", (7,), 1),
        "conv.bias": ("exact", (8,), 1), "v": ("dense", (11,), 1)}


def _layout(model: nn.Module) -> ParamLayout:
    return ParamLayout.from_shapes((n, tuple(p.shape)) for n, p in model.named_parameters())


def _plan(layout: ParamLayout, blocks: int, seed: int = 7, version: int = 4) -> SketchPlan:
    """A plan laid out by hand (exact columns first, then the blocks, block-major), so that every
    branch of `DenseSketch` is taken whatever `make_plan`'s rules choose."""
    exact = [s for s in layout.params if DIMS[s.name][0] == "exact"]
    rest = [s for s in layout.params if DIMS[s.name][0] != "exact"]
    e = sum(s.numel for s in exact)
    width = sum(DIMS[s.name][2] * math.prod(DIMS[s.name][1]) for s in rest)
    out, col, start = [], 0, e
    for s in exact:
        out.append(ParamSketch(s.name, s.shape, s.offset, "exact", (s.numel,), ((col, col + s.numel),)))
        col += s.numel
    for s in rest:
        kind, dims, pairs = DIMS[s.name]
        w = pairs * math.prod(dims)
        out.append(ParamSketch(s.name, s.shape, s.offset, kind, dims,
                               tuple((start + j * width, start + j * width + w) for j in range(blocks)), pairs))
        start += w
    order = {s.name: i for i, s in enumerate(layout.params)}
    out.sort(key=lambda ps: order[ps.name])
    return SketchPlan(seed, e + blocks * width, blocks, tuple(out), e, width, version)


@pytest.fixture(scope="module")
def model() -> Model:
    return Model()


def test_kinds_of_a_dense_gradient(model):
    layout = _layout(model)
    kinds = dense_kinds(layout, model)
    assert kinds["emb.weight"] == kinds["short_emb.weight"] == "countsketch-kronecker"
    assert kinds["wide.weight"] == kinds["tall.weight"] == kinds["conv.weight"] == "kronecker"
    assert kinds["wide.bias"] == kinds["v"] == "dense"
    # without the module, by shape: the embedding is a matrix like any other
    assert dense_kinds(layout)["emb.weight"] == "kronecker"


def test_both_orders_of_each_structured_kind_are_used(model):
    from gradspec.sketch._dense import hash_last

    by = {s.name: s for s in _plan(_layout(model), 2).params}

    def left_first(s) -> bool:
        (m0, m1), (d0, d1) = s.dims, s.matrix
        return m0 * d0 * d1 + m0 * d1 * m1 <= m1 * d0 * d1 + m0 * d0 * m1

    assert {left_first(by["wide.weight"]), left_first(by["tall.weight"])} == {True, False}
    assert {hash_last(*by[n].dims, by[n].matrix[0]) for n in ("emb.weight", "short_emb.weight")} == {True, False}


@pytest.mark.parametrize(("blocks", "version"), [(2, 4), (3, 4), (2, 3), (2, 2)])
def test_dense_sketch_equals_the_reference(model, blocks, version):
    """Versions 2 (G as given), 3 (G sign-masked) and 4 (G's columns mixed, then masked), one
    product of the stacked factors for every block."""
    layout = _layout(model)
    plan = SketchPlan.from_dict(json.loads(json.dumps(_plan(layout, blocks, version=version).to_dict())))
    g = torch.randn(3, layout.p, dtype=torch.float64, generator=torch.Generator().manual_seed(blocks))
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


def test_an_embedding_gradient_with_rows_for_a_few_tokens(model):
    """Version 4 mixes only the rows of G that are not all zero (an embedding's gradient has rows
    for the tokens seen): the same numbers as mixing every row, the reference's."""
    layout = _layout(model)
    plan = _plan(layout, 2)
    g = torch.randn(4, layout.p, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    emb = layout["emb.weight"]
    g[:, emb.offset : emb.stop].view(4, 50, 7)[:, 5:] = 0  # 5 tokens of 50 seen: 20 of 200 rows live
    g[1, emb.offset : emb.stop] = 0  # and a row with none
    torch.testing.assert_close(DenseSketch(plan)(g), sketch_rows(plan, g), rtol=1e-12, atol=1e-12)
    mix = DenseSketch(plan).factors.mix["emb.weight"]
    x = g[:, emb.offset : emb.stop].reshape(4, 50, 7)
    torch.testing.assert_close(mix(x), (x @ mix.rotation.T) * mix.signs, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("live", [7, 160, 200])
def test_only_the_live_rows_of_a_tall_embedding_are_hashed(monkeypatch, live):
    """A CountSketch x Gaussian parameter hashes only the rows of G that hold a nonzero (a
    per-step row of whole MiniLM has a few hundred live rows of its word embeddings' 30,522),
    in both orders of hashing, with the reference's numbers; where more than 3/4 of the rows
    are live (160, 200 of 200) every row is hashed as before."""
    from gradspec.sketch import _dense

    layout = ParamLayout.from_shapes([("a", (200, 6)), ("b", (200, 30))])
    # "a": m1 = 2 hashes G P_1^T; "b": m1 = 20 hashes G, then one product a pair
    assert _dense.hash_last(9, 2, 200) and not _dense.hash_last(2, 20, 200)
    specs, start = [], 0
    for s, dims, pairs in ((layout["a"], (9, 2), 2), (layout["b"], (2, 20), 1)):
        w = pairs * math.prod(dims)
        specs.append((s, dims, pairs, start, w))
        start += w
    width = start
    plan = SketchPlan(5, 2 * width, 2, tuple(
        ParamSketch(s.name, s.shape, s.offset, "countsketch-kronecker", dims,
                    tuple((a + j * width, a + j * width + w) for j in range(2)), pairs)
        for s, dims, pairs, a, w in specs), 0, width, 4)
    g = torch.zeros(3, layout.p, dtype=torch.float64)
    gen = torch.Generator().manual_seed(live)
    for s in layout.params:
        rows = torch.randperm(200, generator=gen)[:live]
        g[:, s.offset : s.stop].view(3, 200, -1)[:, rows] = torch.randn(3, live, s.shape[1], generator=gen,
                                                                          dtype=torch.float64)
    g[1, layout["a"].offset : layout["a"].stop] = 0  # a row with no token of "a"
    seen = []
    real = _dense.live_rows
    monkeypatch.setattr(_dense, "live_rows", lambda mask: seen.append(real(mask)) or seen[-1])
    want = sketch_rows(plan, g)
    torch.testing.assert_close(DenseSketch(plan)(g), want, rtol=1e-12, atol=1e-12 * float(want.abs().max()))
    assert len(seen) == 2
    if live == 7:
        assert all(x is not None and x.numel() == 7 for x in seen)
    else:
        assert seen == [None, None]


@pytest.mark.parametrize("m", [300, 1000])
def test_dense_sketch_of_the_plans_make_plan_makes(model, m):
    layout = _layout(model)
    plan = make_plan(layout, dense_kinds(layout, model), m, seed=3, blocks=4)
    g = torch.randn(2, layout.p, dtype=torch.float64, generator=torch.Generator().manual_seed(m))
    want = sketch_rows(plan, g)
    torch.testing.assert_close(DenseSketch(plan)(g), want, rtol=1e-12, atol=1e-12 * float(want.abs().max()))


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


def test_row_energies_are_each_parameters_squared_norm_in_float64():
    layout = ParamLayout.from_shapes([("a", (3, 4)), ("b", (5,)), ("c", (2, 2, 2))])
    row = torch.randn(layout.p, dtype=torch.float32) * 1e3
    got = row_energies(layout, row)
    flat = row.double().numpy()
    want = {"a": (flat[:12] ** 2).sum(), "b": (flat[12:17] ** 2).sum(), "c": (flat[17:] ** 2).sum()}
    assert list(got) == ["a", "b", "c"]
    assert all(math.isclose(got[n], want[n], rel_tol=1e-13) for n in want)
    with pytest.raises(ValueError, match="a row of 24 values for a layout of p = 25"):
        row_energies(layout, row[:24])


def test_add_flat_mixes_once_for_every_block(model):
    """`SketchFactors.add_flat` of every parameter (any kind, G mixed and masked once for the J
    blocks) gives the reference's row, as `DenseSketch` does."""
    from gradspec.sketch import SketchFactors

    layout = _layout(model)
    plan = _plan(layout, 3)
    g = torch.randn(2, layout.p, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    factors = SketchFactors(plan, dtype=torch.float64, device="cpu")
    out = torch.zeros(2, plan.M, dtype=torch.float64)
    for spec in layout.params:
        factors.add_flat(spec.name, g[:, spec.offset : spec.stop], out)
    want = sketch_rows(plan, g)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12 * float(want.abs().max()))
