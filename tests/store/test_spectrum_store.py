"""The spectrum store: round trips, streamed V writes, state, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradspec.linalg import pca
from gradspec.store import GradientStore, ParamLayout
from gradspec.store._spectrum import SpectrumStore


def test_round_trip(tmp_path):
    h = np.random.default_rng(0).standard_normal((30, 500))
    res = pca(source=h, k=7, method="gram", v_dtype="float64")
    out = tmp_path / "s.zarr"
    spec = SpectrumStore.create(
        out,
        r=30,
        p=500,
        k=7,
        method="gram",
        params=res.params,
        source=res.source,
        v_dtype="float64",
        v_chunk_rows=64,
    )
    with spec.v_sink() as sink:
        for i in range(0, 500, 90):  # unaligned with the 64-row chunks
            sink(i, res.V[i : i + 90])
    spec.finish(res)
    back = SpectrumStore.open(out)
    np.testing.assert_array_equal(back.sigma, res.sigma)
    np.testing.assert_array_equal(back.U, res.U)
    np.testing.assert_array_equal(back.read_v(), res.V)
    np.testing.assert_array_equal(np.concatenate([b for _, b in back.iter_v_blocks(100)]), res.V)
    for name in (
        "residuals",
        "residual_h",
        "residual_ht",
        "explained_variance_ratio",
        "cumulative_explained_variance",
    ):
        np.testing.assert_array_equal(back.array(name), getattr(res, name))
    summ = back.summary()
    assert summ["kind"] == "spectrum" and summ["status"] == "complete" and summ["k"] == 7
    assert summ["method"] == "gram" and summ["sigma_top"][0] == pytest.approx(res.sigma[0])
    assert back.V.chunks == (64, 7) and back.shape == (30, 500)
    assert back.attrs["gradspec.kind"] == "spectrum"


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cuts=st.lists(st.integers(1, 199), max_size=6, unique=True),
    chunk=st.integers(1, 80),
    k=st.integers(1, 5),
)
def test_streamed_writes_any_partition(tmp_path_factory, cuts, chunk, k):
    """Whatever the blocks V arrives in and the chunking, V reads back exactly."""
    v = np.random.default_rng(len(cuts)).standard_normal((200, k)).astype(np.float32)
    spec = SpectrumStore.create(
        tmp_path_factory.mktemp("s") / "s", r=10, p=200, k=k, method="gram", v_chunk_rows=chunk
    )
    edges = [0, *sorted(cuts), 200]
    order = list(zip(edges[:-1], edges[1:], strict=True))
    if len(cuts) % 2:
        order.reverse()  # blocks may also arrive out of order
    with spec.v_sink() as sink:
        for a, b in order:
            sink(a, v[a:b])
    np.testing.assert_array_equal(SpectrumStore.open(spec.path).read_v(), v)


def test_state_round_trip(tmp_path):
    spec = SpectrumStore.create(tmp_path / "s", r=10, p=50, k=3, method="orthogonal")
    assert spec.load_state() is None
    q = np.random.default_rng(0).standard_normal((10, 5))
    spec.save_state(
        {"iteration": 2, "q": q, "theta": np.arange(5.0), "history": [{"iteration": 1}]}
    )
    spec.save_state(
        {"iteration": 3, "q": q + 1, "theta": np.arange(5.0), "history": [{"iteration": 1}]}
    )
    st_ = SpectrumStore.open(tmp_path / "s").load_state()
    assert st_["iteration"] == 3 and st_["u"] is None and st_["history"] == [{"iteration": 1}]
    np.testing.assert_array_equal(st_["q"], q + 1)
    assert SpectrumStore.open(tmp_path / "s").summary()["iterations_done"] == 3


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="k must lie in"):
        SpectrumStore.create(tmp_path / "a", r=10, p=5, k=6, method="gram")
    with pytest.raises(FileNotFoundError, match="no spectrum store"):
        SpectrumStore.open(tmp_path / "missing")
    GradientStore.create(tmp_path / "g", layout=ParamLayout.from_shapes([("w", (4,))]))
    with pytest.raises(ValueError, match="is a gradients store, not a spectrum store"):
        SpectrumStore.open(tmp_path / "g")
    SpectrumStore.create(tmp_path / "b", r=10, p=5, k=2, method="gram")
    with pytest.raises(FileExistsError, match="already exists"):
        SpectrumStore.create(tmp_path / "b", r=10, p=5, k=2, method="gram")
    with pytest.raises(ValueError, match="read-only"):
        SpectrumStore.open(tmp_path / "b").v_sink()
