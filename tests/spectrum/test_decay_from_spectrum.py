"""`gradspec decay` from the spectrum (issue 36): an exact spectrum's own rows get their G_k from
U, σ and the row norms pca recorded, with no pass over H, and every number of report.json equals
the one projecting the rows onto V gives; held-out rows are projected in tiles of bounded rows."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.linalg import pca
from gradspec.spectrum import DecayConfig, decay_analysis, rank_grid
from gradspec.store import META_FIELDS, GradientStore, ParamLayout, SpectrumStore

R, P = 64, 600
OWN = np.array([5, 3, 4, *range(8, 40), 44, 41, 42, 43, 45, 46, 47, 0, 1, 2])  # pca's rows, in its order
HELD = "48:64"
BOUNDS = {"n": 1000, "epsilon": 2.0, "delta": 1e-5, "diameter": 1.0}


@pytest.fixture(scope="module")
def grads(tmp_path_factory):
    """H = A·G + noise: 30 latent directions with σ ∝ i^-0.6 and a 5% noise floor, float32."""
    rng = np.random.default_rng(0)
    layout = ParamLayout.from_shapes([("w", (50, 10)), ("b", (100,))])
    a = np.linalg.qr(rng.standard_normal((R, 30)))[0] * np.arange(1, 31) ** -0.6 * 8
    h = (a @ rng.standard_normal((30, P)) / np.sqrt(P) + 0.05 * rng.standard_normal((R, P)) / np.sqrt(P))
    meta = {name: np.zeros(R, dtype=dt) for name, dt in META_FIELDS.items()}
    meta["step"] = np.arange(R) // 2  # two rows a step: the per-step error sums over rows
    path = tmp_path_factory.mktemp("decay") / "g.zarr"
    GradientStore.create(path, layout=layout, rows_per_chunk=8, cols_per_chunk=64).append(
        h.astype(np.float32), meta)
    return path


@pytest.fixture(scope="module")
def spectra(grads, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spectra")
    out = {}
    for name, kw in {"f64": dict(precision="float64", v_dtype="float64"),
                     "f32": dict(precision="float32", v_dtype="float32"),
                     "krylov": dict(method="krylov", iters=2, precision="float64"),
                     "centred": dict(center=True, precision="float64")}.items():
        out[name] = tmp / f"{name}.zarr"
        pca(source=str(grads), k=24, rows=OWN, out=str(out[name]), **{"method": "gram", **kw})
    return out


def _report(spec, *, read_rows=False, **kw):
    cfg = DecayConfig(**BOUNDS, every_rank=kw.pop("every_rank", False))
    return decay_analysis(spectrum=spec, heldout_rows=HELD, config=cfg, read_rows=read_rows, **kw).to_dict()


def _same(a, b, *, rtol, path=""):
    """Every number of two report.json dicts equal to rtol (strings and structure exactly), except
    where they say how the rows were measured."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            if key != "measured":
                _same(a[key], b[key], rtol=rtol, path=f"{path}.{key}")
    elif isinstance(a, list) and path != ".notes":
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, rtol=rtol, path=f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=rtol, abs=1e-300), path
    elif path != ".notes":
        assert a == b, path


def _no_reads(monkeypatch):
    """Reading any gradient block fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("read H")

    for name in ("iter_tiles", "iter_col_blocks", "iter_row_blocks", "read"):
        monkeypatch.setattr(GradientStore, name, refuse)


@pytest.mark.parametrize("every_rank", [False, True], ids=["grid", "every-rank"])
def test_every_number_equals_the_projection_of_h_float64(spectra, monkeypatch, every_rank):
    """float64 products and a float64 V: the two paths agree to 1e-10 on every number."""
    read = _report(spectra["f64"], read_rows=True, every_rank=every_rank)
    assert read["sources"]["collected"]["measured"].startswith("projected onto V")
    with monkeypatch.context() as m:
        _no_reads(m)
        with pytest.raises(AssertionError, match="read H"):  # the held-out rows are read...
            _report(spectra["f64"], every_rank=every_rank)
    fast = _report(spectra["f64"], every_rank=every_rank)
    assert fast["sources"]["collected"]["measured"].startswith("from the spectrum's U, sigma")
    _same(fast, read, rtol=1e-10)
    g = np.asarray(fast["rows"]["collected"]["G_k"]["max"])
    assert g[-1] > 1e-3 * g[0]  # k = 24 is below H's rank: no near-zero G_k hides a difference


def test_own_rows_alone_read_no_h(spectra, monkeypatch):
    """...but the spectrum's own rows need no gradient block at all."""
    cfg = DecayConfig(**BOUNDS)
    read = decay_analysis(spectrum=spectra["f64"], config=cfg, read_rows=True).to_dict()
    _no_reads(monkeypatch)
    fast = decay_analysis(spectrum=spectra["f64"], config=cfg).to_dict()
    _same(fast, read, rtol=1e-10)
    assert fast["rows"]["collected"]["reconstruction_error_by_step"]["rows_per_step"][0] == 2


def _dense_g(grads, spec_path, rows):
    """max_i ‖(I − P_k) h_i‖ with P_k from the exact SVD of the stored rows, float64."""
    h = GradientStore.open(grads).read().astype(np.float64)
    own = h[OWN]
    _, s, vt = np.linalg.svd(own, full_matrices=False)
    ks = rank_grid(24)
    x = own if rows == "collected" else h[48:64]
    return np.array([np.linalg.norm(x - x @ vt[:k].T @ vt[:k], axis=1).max() for k in ks])


def test_float32_products_agree_to_the_precision_of_the_spectrum(grads, spectra):
    """Default products (float32, float64 sums) and a float32 V: both paths are within the
    spectrum's own precision of the exact G_k, and of each other."""
    read = _report(spectra["f32"], read_rows=True)
    fast = _report(spectra["f32"])
    exact = _dense_g(grads, spectra["f32"], "collected")
    for rep in (read, fast):
        np.testing.assert_allclose(rep["rows"]["collected"]["G_k"]["max"], exact, rtol=2e-5)
    np.testing.assert_allclose(fast["rows"]["collected"]["G_k"]["max"], read["rows"]["collected"]["G_k"]["max"],
                               rtol=2e-5)
    _same(fast["rows"]["heldout"], read["rows"]["heldout"], rtol=1e-12)  # held-out rows: one way


def test_a_spectrum_without_recorded_norms_reads_them_in_one_pass(spectra, tmp_path, monkeypatch):
    """A spectrum store from before issue 36: the norms come from one pass over the rows; V unread."""
    import shutil

    import gradspec.spectrum._driver as driver

    old = tmp_path / "old.zarr"
    shutil.copytree(spectra["f64"], old)
    del SpectrumStore.open(old, mode="r+")._group["row_sq_norms"]
    cfg = DecayConfig(**BOUNDS)
    want = decay_analysis(spectrum=spectra["f64"], config=cfg, read_rows=True).to_dict()

    def refuse(self, key):
        raise AssertionError("read V")

    monkeypatch.setattr(driver._Columns, "__getitem__", refuse)
    got = decay_analysis(spectrum=old, config=cfg).to_dict()
    assert "read in one pass" in got["sources"]["collected"]["measured"]
    _same(got["rows"], want["rows"], rtol=1e-10)


@pytest.mark.parametrize("name, why", [("krylov", "Ritz vectors"), ("centred", "column-centred")])
def test_other_spectra_project_their_own_rows_and_say_why(spectra, name, why):
    rep = decay_analysis(spectrum=spectra[name]).to_dict()
    assert rep["sources"]["collected"]["measured"].startswith("projected onto V")
    assert any("by projecting them onto V" in n and why in n for n in rep["notes"])


def test_heldout_rows_are_read_in_tiles_of_bounded_rows(grads, spectra):
    """The rows a projection holds do not grow with the held-out rows: tiles of at most the
    rows that fit ``memory``, each entry read once, the numbers of one whole-block pass."""
    seen: dict[int, list[tuple[int, int, tuple[int, int]]]] = {}
    for n_held in (8, 16):
        store = GradientStore.open(grads)
        tiles = store.iter_tiles

        def spy(*, n_held=n_held, tiles=tiles, **kw):
            for r0, c0, t in tiles(**kw):
                seen.setdefault(n_held, []).append((r0, c0, t.shape))
                yield r0, c0, t

        store.iter_tiles = spy
        held = f"{R - n_held}:{R}"
        small = decay_analysis(spectrum=spectra["f64"], gradients=store, heldout_rows=held,
                               memory=4 * 4 * 64 * 8).to_dict()  # 8 rows of a 64-column chunk
        whole = decay_analysis(spectrum=spectra["f64"], heldout_rows=held).to_dict()
        _same(small["rows"]["heldout"], whole["rows"]["heldout"], rtol=1e-12)
        assert "tiles of 8 rows" in small["sources"]["heldout"]["measured"]
    for n_held, got in seen.items():
        assert max(shape[0] for _, _, shape in got) == 8  # whatever the number of rows
        assert sum(shape[0] * shape[1] for _, _, shape in got) == n_held * P  # each entry once
    assert len(seen[16]) == 2 * len(seen[8])


@pytest.mark.parametrize("memory", [0, -1, 2.5, True])
def test_memory_must_be_a_positive_number_of_bytes(spectra, memory):
    with pytest.raises(ValueError, match="memory must be a positive number of bytes"):
        decay_analysis(spectrum=spectra["f64"], memory=memory)
