"""GradientStore.iter_tiles: the column blocks of a row selection, cut into tiles of rows."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.store import META_FIELDS, GradientStore, ParamLayout


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    layout = ParamLayout.from_shapes([("a", (30,)), ("b", (4, 10))])
    h = np.random.default_rng(0).standard_normal((45, layout.p)).astype(np.float32)
    meta = {name: np.zeros(45, dtype=dt) for name, dt in META_FIELDS.items()}
    gs = GradientStore.create(tmp_path_factory.mktemp("tiles") / "g.zarr", layout=layout,
                              rows_per_chunk=8, cols_per_chunk=16)
    gs.append(h, meta)
    return gs, h


@pytest.mark.parametrize("rows", [None, slice(3, 40), np.array([44, 2, 7, 8, 9, 30])],
                         ids=["all", "run", "indices"])
@pytest.mark.parametrize("tile_rows", [1, 8, 13, 100])
@pytest.mark.parametrize("col_ranges", [None, [(5, 20), (40, 70)]], ids=["all-cols", "ranges"])
def test_tiles_reassemble_the_selection(store, rows, tile_rows, col_ranges):
    gs, h = store
    want = h[np.arange(45) if rows is None else rows]
    if col_ranges is not None:
        want = np.concatenate([want[:, a:b] for a, b in col_ranges], axis=1)
    got = np.full(want.shape, np.nan, dtype=np.float32)
    order = []
    blocks = {off: b.shape[1] for off, b in gs.iter_col_blocks(rows=rows, col_ranges=col_ranges)}
    for r0, c0, tile in gs.iter_tiles(rows=rows, col_ranges=col_ranges, tile_rows=tile_rows):
        assert tile.dtype == np.float32 and tile.shape[0] <= tile_rows
        assert tile.shape[1] == blocks[c0]  # a tile spans one whole column block
        assert np.isnan(got[r0 : r0 + tile.shape[0], c0 : c0 + tile.shape[1]]).all()  # each entry once
        got[r0 : r0 + tile.shape[0], c0 : c0 + tile.shape[1]] = tile
        order.append((c0, r0))
    np.testing.assert_array_equal(got, want)
    assert order == sorted(order)  # column block by column block, rows in order within each


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_tile_rows_must_be_a_positive_integer(store, bad):
    with pytest.raises(ValueError, match="tile_rows must be a positive integer"):
        next(store[0].iter_tiles(tile_rows=bad))
