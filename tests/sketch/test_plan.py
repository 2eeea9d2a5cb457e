"""The sketch plan: its columns (exact first, then J blocks, block-major), its JSON (what a
store's ``gradspec.sketch`` holds) and the regeneration of every factor from it, the dense
reference map, and the unbiasedness of the sketched Gram matrix, per block and overall."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gradspec._layout import ParamLayout
from gradspec.sketch import (
    FAMILY,
    VERSION,
    SketchPlan,
    block_factors,
    factor_seed,
    make_plan,
    sketch_matrix,
    sketch_rows,
)

SHAPES = [("emb", (40, 6)), ("w", (12, 10)), ("b", (12,)), ("ln", (6,)), ("head", (3, 12)), ("v", (30,))]
KINDS = {"emb": "countsketch-kronecker", "w": "kronecker", "b": "dense", "ln": "dense", "head": "kronecker",
         "v": "dense"}
LAYOUT = ParamLayout.from_shapes(SHAPES)


def _plan(m: int = 300, seed: int = 3, blocks: int = 4, version: int = VERSION) -> SketchPlan:
    """A plan with structured kinds (no dense factor for a Kronecker-capable parameter), so that
    version 2's several pairs per block (and versions 3 and 4's masks and mixing) are exercised."""
    if version == 1:
        return make_plan(LAYOUT, KINDS, m, seed=seed, blocks=blocks, version=1)
    return make_plan(LAYOUT, KINDS, m, seed=seed, blocks=blocks, dense_budget=0, version=version)


def test_version_1_columns_are_exact_first_then_blocks_that_tile_the_row():
    """Issue 22's rules, which the stores written before issue 37 hold (still read and resumed)."""
    plan = _plan(version=1)
    d = plan.to_dict()
    assert d["kind"] == FAMILY and d["version"] == 1 and d["p"] == LAYOUT.p == plan.p
    assert SketchPlan.from_dict(json.loads(json.dumps(d))) == plan
    assert d["M"] == plan.M <= d["requested_M"] == 300
    kinds = {s.name: s.kind for s in plan.params}
    assert kinds == {"emb": "countsketch-kronecker", "w": "kronecker", "b": "exact", "ln": "exact",
                     "head": "kronecker", "v": "dense"}
    assert d["exact"] == [[0, 18]] and plan.exact_width == 18
    assert [r for (r,) in d["blocks"]] == [[18 + j * plan.block_width, 18 + (j + 1) * plan.block_width]
                                            for j in range(4)]
    assert d["blocks"][-1][0][1] == plan.M
    for j in range(4):  # every block holds every sketched parameter once, in layout order, tiling it
        lo, hi = plan.block_range(j)
        spans = [s.columns[j] for s in plan.params if s.kind != "exact"]
        assert spans[0][0] == lo and spans[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert all(z - a == math.prod(s.dims) for s, (a, z) in
                   zip([s for s in plan.params if s.kind != "exact"], spans, strict=True))
    # the stored row as pseudo-parameters, so `--params sketch.block2` selects one block
    assert plan.column_layout().names == ["sketch.exact", *(f"sketch.block{j}" for j in range(4))]
    assert plan.column_layout().p == plan.M
    # columns in proportion to size, Kronecker dims near the aspect
    by = {s.name: s for s in plan.params}
    assert by["emb"].width > by["w"].width > by["head"].width
    assert by["emb"].dims[0] > by["emb"].dims[1] and by["head"].dims[0] <= by["head"].dims[1]
    assert all(s.pairs == 1 for s in plan.params) and all("pairs" not in q for q in d["params"])
    # version 1's factors are issue 22's draws: one pair, randn(m0, d0) / sqrt(m0), times 1/sqrt(J)
    from gradspec.sketch._factors import gaussian

    w = by["w"]
    want = gaussian(3, 1, "w", "left", w.dims[0], 12) / 2
    assert torch.equal(block_factors(plan, w, 1).left, want)


def test_version_2_small_or_energetic_parameters_exact_the_rest_in_pairs():
    plan = _plan(version=2)
    d = plan.to_dict()
    assert d["version"] == 2 and not plan.signed
    by = {s.name: s for s in plan.params}
    # small parameters (b, ln: size <= M / 4K) and those whose share by sqrt(size) is at least
    # their size (v, head) are exact; the big ones sketched in several independent pairs
    assert {n for n, s in by.items() if s.kind == "exact"} == {"b", "ln", "v", "head"}
    assert by["w"].kind == "kronecker" and by["emb"].kind == "countsketch-kronecker"
    assert by["w"].pairs > 1 and by["emb"].pairs > 1
    for s in (by["w"], by["emb"]):
        assert s.width == s.pairs * math.prod(s.dims) == s.columns[0][1] - s.columns[0][0]
        assert all(m <= 16 for m in [math.prod(s.dims)])  # PAIR_AREA
    for j in range(4):
        lo, hi = plan.block_range(j)
        spans = [s.columns[j] for s in plan.params if s.kind != "exact"]
        assert spans[0][0] == lo and spans[-1][1] == hi
    # measured energies move columns: a head holding most of the energy is kept exact even at a
    # small M, and a parameter of little energy gets few columns
    energy = {"emb": 1.0, "w": 1.0, "b": 0.1, "ln": 0.1, "head": 50.0, "v": 0.01}
    small = make_plan(LAYOUT, KINDS, 150, seed=3, blocks=2, weights=energy, dense_budget=0)
    kinds = {s.name: s.kind for s in small.params}
    assert kinds["head"] == "exact" and kinds["v"] != "exact"
    assert make_plan(LAYOUT, KINDS, 150, seed=3, blocks=2, dense_budget=0).to_dict() != small.to_dict()
    # by default (dense factors when small) every parameter here is exact or dense
    assert {s.kind for s in make_plan(LAYOUT, KINDS, 300, seed=3, blocks=4).params} <= {"exact", "dense"}
    with pytest.raises(ValueError, match="sketch weight of parameter 'w'"):
        make_plan(LAYOUT, KINDS, 300, weights={**energy, "w": float("nan")})
    with pytest.raises(ValueError, match="takes no weights"):
        make_plan(LAYOUT, KINDS, 300, weights=energy, version=1)
    with pytest.raises(ValueError, match="version 5"):
        make_plan(LAYOUT, KINDS, 300, version=5)
    with pytest.raises(ValueError, match="versions 1, 2, 3, 4"):
        SketchPlan.from_dict({**d, "version": 5})


def test_json_round_trip_regenerates_the_same_map():
    plan = _plan()
    again = SketchPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert torch.equal(sketch_matrix(again), sketch_matrix(plan))
    other = _plan(seed=4)
    assert not torch.equal(sketch_matrix(other), sketch_matrix(plan))
    # the factors of one parameter differ between blocks (independent seeds), and between pairs
    w = next(s for s in plan.params if s.name == "w")
    left = block_factors(plan, w, 0).left
    assert not torch.equal(left, block_factors(plan, w, 1).left)
    assert w.pairs > 1 and not torch.equal(left[: w.dims[0]], left[w.dims[0] : 2 * w.dims[0]])
    assert factor_seed(3, 0, "w", "left") != factor_seed(3, 1, "w", "left")
    with pytest.raises(ValueError, match="kronecker-gaussian"):
        SketchPlan.from_dict({**plan.to_dict(), "kind": "other"})


def test_version_3_is_version_2_with_a_sign_mask_per_parameter():
    """The default plan: version 2's columns, pairs and factors, each Kronecker-kind parameter's
    gradient multiplied value by value by its seeded sign mask first (one mask, every block's)."""
    from gradspec.sketch._factors import dense_left, kron_apply, mixing, sign_mask

    plan, old = _plan(version=3), _plan(version=2)
    assert plan.version == 3 and plan.signed and not plan.rotated
    assert plan.params == old.params and plan.M == old.M and plan.block_width == old.block_width
    d = plan.to_dict()
    same = {k: v for k, v in d.items() if k not in ("version", "signs")}
    assert same == {k: v for k, v in old.to_dict().items() if k != "version"}
    assert "signs" in d and "signs" not in old.to_dict()
    h = torch.randn(3, LAYOUT.p, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    y, y_old = sketch_rows(plan, h), sketch_rows(old, h)
    for spec in plan.params:
        for j, (a, z) in enumerate(spec.columns):
            if spec.kind in ("kronecker", "countsketch-kronecker"):
                mask = sign_mask(plan.seed, spec.name, spec.numel)  # one per parameter, every block's
                assert mask.dtype == torch.int8 and set(mask.tolist()) == {-1, 1}
                mix = mixing(plan, spec)
                assert mix.rotation is None and torch.equal(mix.signs, mask.double().reshape(spec.matrix))
                x = (h[:, spec.offset : spec.offset + spec.numel] * mask).reshape(3, *spec.matrix)
                want = kron_apply(dense_left(plan, spec, j), block_factors(plan, spec, j).right, x)
                torch.testing.assert_close(y[:, a:z], want, rtol=1e-12, atol=1e-12)
                assert not torch.allclose(y[:, a:z], y_old[:, a:z])  # the mask changes them
            else:  # exact and dense parameters are sketched as in version 2
                assert torch.equal(y[:, a:z], y_old[:, a:z])
    w = next(s for s in plan.params if s.name == "w")
    assert not torch.equal(sign_mask(3, "w", w.numel), sign_mask(4, "w", w.numel))  # seeded by the plan's seed
    assert not torch.equal(sign_mask(3, "w", 100), sign_mask(3, "emb", 100))  # and the parameter
    assert SketchPlan.from_dict(json.loads(json.dumps(d))) == plan


def test_version_4_is_version_3_after_mixing_the_columns_of_g():
    """The default plan: version 3's columns, pairs, factors and masks, each Kronecker-kind
    parameter's G first multiplied on the right by Q_bd^T, a seeded block-diagonal orthogonal
    matrix (Haar blocks of ROTATION_BLOCK columns, the remainder its own block), one per
    parameter and every block's. A weight 1,100 columns wide has two blocks and a tail of 76."""
    from gradspec.sketch import ROTATION_BLOCK
    from gradspec.sketch._factors import dense_left, haar, kron_apply, mixing, sign_mask

    layout = ParamLayout.from_shapes([*SHAPES, ("wide", (3, 1100))])
    kinds = {**KINDS, "wide": "kronecker"}
    plan = make_plan(layout, kinds, 400, seed=3, blocks=4, dense_budget=0)
    old = make_plan(layout, kinds, 400, seed=3, blocks=4, dense_budget=0, version=3)
    assert VERSION == 4 and plan.version == 4 and plan.signed and plan.rotated and not old.rotated
    assert plan.params == old.params and plan.M == old.M
    d = plan.to_dict()
    assert {k: v for k, v in d.items() if k not in ("version", "rotation", "rotation_block")} == {
        k: v for k, v in old.to_dict().items() if k != "version"}
    assert d["rotation_block"] == ROTATION_BLOCK == 512
    h = torch.randn(3, layout.p, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    y, y_old = sketch_rows(plan, h), sketch_rows(old, h)
    for spec in plan.params:
        d0, d1 = spec.matrix
        for j, (a, z) in enumerate(spec.columns):
            if spec.kind not in ("kronecker", "countsketch-kronecker"):
                assert torch.equal(y[:, a:z], y_old[:, a:z])  # exact and dense parameters as in version 3
                continue
            b = min(d1, ROTATION_BLOCK)
            parts = [haar(plan.seed, spec.name, "rotation", b)] * (d1 // b)
            if d1 % b:
                parts.append(haar(plan.seed, spec.name, "rotation-tail", d1 % b))
            q = torch.block_diag(*parts)
            torch.testing.assert_close(q @ q.T, torch.eye(d1, dtype=torch.float64), rtol=0, atol=1e-12)
            g = h[:, spec.offset : spec.offset + spec.numel].reshape(3, d0, d1)
            x = (g @ q.T) * sign_mask(plan.seed, spec.name, spec.numel).reshape(d0, d1)
            want = kron_apply(dense_left(plan, spec, j), block_factors(plan, spec, j).right, x)
            torch.testing.assert_close(y[:, a:z], want, rtol=1e-12, atol=1e-12)
            assert not torch.allclose(y[:, a:z], y_old[:, a:z])  # the mixing changes them
    wide = mixing(plan, next(s for s in plan.params if s.name == "wide"))
    assert wide.rotation.shape == (512, 512) and wide.tail.shape == (76, 76)
    assert not torch.equal(haar(3, "w", "rotation", 10), haar(4, "w", "rotation", 10))  # seeded by the plan
    assert SketchPlan.from_dict(json.loads(json.dumps(d))) == plan
    with pytest.raises(ValueError, match="rotation blocks of 128 columns"):
        SketchPlan.from_dict({**d, "rotation_block": 128})


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_reference_is_the_linear_map_and_exact_columns_copy(version):
    plan = _plan(version=version)
    phi = sketch_matrix(plan)
    rows = torch.randn(5, LAYOUT.p, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(sketch_rows(plan, rows), rows @ phi.T, rtol=1e-12, atol=1e-12)
    b = LAYOUT["b"]
    spec = next(s for s in plan.params if s.name == "b")
    a, z = spec.columns[0]
    assert torch.equal(sketch_rows(plan, rows)[:, a:z], rows[:, b.offset : b.stop])
    with pytest.raises(ValueError, match="shape"):
        sketch_rows(plan, rows[:, 1:])


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_block_gram_identity_and_unbiasedness_over_seeds(version):
    """Y Y^T = Y_x Y_x^T + sum_j Y_j Y_j^T exactly; and over 300 seeds the mean of
    Y_x Y_x^T + J Y_j Y_j^T (each j) and of Y Y^T is H H^T within a generous statistical bound
    (the standard error of the mean is ~ 1/sqrt(300) of the single-sketch error)."""
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(4, LAYOUT.p, dtype=torch.float64, generator=gen)
    want = h @ h.T
    j_blocks, seeds = 4, 300
    per_block = torch.zeros(j_blocks, 4, 4, dtype=torch.float64)
    overall = torch.zeros(4, 4, dtype=torch.float64)
    single_err = 0.0
    for seed in range(seeds):
        plan = _plan(seed=seed, blocks=j_blocks, version=version)
        y = sketch_rows(plan, h)
        ex = y[:, : plan.exact_width]
        gram_x = ex @ ex.T
        blocks = [y[:, slice(*plan.block_range(j))] for j in range(j_blocks)]
        gram = y @ y.T
        torch.testing.assert_close(gram, gram_x + sum(b @ b.T for b in blocks), rtol=1e-12, atol=1e-9)
        for j, b in enumerate(blocks):
            per_block[j] += gram_x + j_blocks * (b @ b.T)
        overall += gram
        single_err += float((gram_x + j_blocks * blocks[0] @ blocks[0].T - want).norm())
    scale = float(want.norm())
    single_err /= seeds
    for j in range(j_blocks):
        err = float((per_block[j] / seeds - want).norm())
        assert err < 5 * single_err / math.sqrt(seeds), (j, err, single_err)
    assert float((overall / seeds - want).norm()) < 0.05 * scale
    assert single_err > 0.05 * scale  # the test can fail: one sketch alone is far off


def test_refusals():
    with pytest.raises(ValueError, match="at least 2 independent blocks"):
        _plan(blocks=1)
    with pytest.raises(ValueError, match="--sketch >= "):
        make_plan(LAYOUT, KINDS, 20, blocks=8)
    with pytest.raises(ValueError, match="sketch kind"):
        make_plan(LAYOUT, {**KINDS, "w": "magic"}, 300)


def test_a_dense_factor_too_large_is_refused_by_name():
    from gradspec.sketch import DENSE_MAX, SketchFactors

    layout = ParamLayout.from_shapes([("big", (DENSE_MAX // 100,)), ("w", (4, 4))])
    plan = make_plan(layout, {"big": "dense", "w": "kronecker"}, 400, blocks=2)
    with pytest.raises(ValueError, match="'big'.*exceeds"):
        SketchFactors(plan, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="'big'"):
        sketch_rows(plan, torch.zeros(1, layout.p))


def test_energy_weights_blend_the_measured_energies_with_the_size_prior():
    from gradspec.sketch import energy_weights

    energies = {"emb": 0.0, "w": 1.0, "b": 0.5, "ln": 0.0, "head": 6.0, "v": 0.5}
    w = energy_weights(LAYOUT, energies)
    roots = {s.name: math.sqrt(s.numel) for s in LAYOUT.params}
    for s in LAYOUT.params:  # half its share of the energy, half its sqrt(numel) share
        want = 0.5 * energies[s.name] / 8.0 + 0.5 * roots[s.name] / sum(roots.values())
        assert w[s.name] == pytest.approx(want, rel=1e-12)
    assert sum(w.values()) == pytest.approx(1.0)
    assert w["emb"] > 0  # quiet in the warm-up, not starved
    assert energy_weights(LAYOUT, energies, prior=1.0) == pytest.approx(
        {n: r / sum(roots.values()) for n, r in roots.items()})
    # the head carrying 3/4 of the energy gets more columns than by size; the plan records it
    by_energy = make_plan(LAYOUT, KINDS, 160, seed=1, blocks=2, weights=w, dense_budget=0)
    by_size = make_plan(LAYOUT, KINDS, 160, seed=1, blocks=2, dense_budget=0)
    width = {s.name: s.width for s in by_energy.params}
    assert width["head"] > {s.name: s.width for s in by_size.params}["head"]
    assert (by_energy.weighting, by_size.weighting) == ("energy", "sqrt-size")
    assert SketchPlan.from_dict(json.loads(json.dumps(by_energy.to_dict()))) == by_energy
    old = by_size.to_dict()
    del old["weighting"]  # a version-2 store written before the key: split by size
    assert SketchPlan.from_dict(old) == by_size
    with pytest.raises(ValueError, match="weighting 'mass'"):
        SketchPlan.from_dict({**old, "weighting": "mass"})
    for bad, match in [({**energies, "w": float("nan")}, "'w' is nan"), ({"w": 1.0}, "'emb' is None"),
                       (dict.fromkeys(energies, 0.0), "every measured gradient energy is 0")]:
        with pytest.raises(ValueError, match=match):
            energy_weights(LAYOUT, bad)
    with pytest.raises(ValueError, match=r"prior must be in \[0, 1\]"):
        energy_weights(LAYOUT, energies, prior=1.5)
