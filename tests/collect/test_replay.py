"""`gradspec.train.replay` (issue 37 §4): a per-step sketched run's directions in parameter space.

Checked against an unsketched per-step collection of the same seeded run (its stored rows are
the exact H): the replay's accumulation is Hᵀ·U·Σ⁻¹ of the sketched spectrum's U and σ, its V
spans it and is orthonormal, and with every direction of the rows (K = r) it is the exact SVD
of H. `retrain --projector` takes the result. A run that does not replay bit for bit is refused
in one line naming the step and the size of the difference, nothing written: a changed stored
row, changed data, a changed learning rate that no record shows (caught at step 1, the first
row it acts on), and a changed record (caught before any step).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import zarr

from gradspec.collect import collect
from gradspec.linalg import pca
from gradspec.spectrum import principal_angles
from gradspec.store import GradientStore, SpectrumStore
from gradspec.train import ReplayMismatch, TrainConfig, replay
from tests.store.test_checksums import rewrite_row

from ._tiny import tiny_task
from .test_collect import cfg

STEPS, M = 12, 96


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # the runs sum in one order, so that they take the same steps bit for bit
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An exact and a sketched per-step collection of one seeded run, and pca of each."""
    root = tmp_path_factory.mktemp("replay")
    exact = collect(cfg(steps=STEPS), out=root / "exact", task=tiny_task())
    sketched = collect(cfg(steps=STEPS, sketch=M, sketch_blocks=4, sketch_seed=3), out=root / "sketch",
                       task=tiny_task())
    for k in (4, STEPS):
        pca(source=str(sketched.store), k=k, out=root / f"spec{k}", progress=False)
        pca(source=str(exact.store), k=k, out=root / f"exact{k}", progress=False)
    return root


def _h(runs) -> np.ndarray:
    return GradientStore.open(runs / "exact" / "gradients.zarr").read().astype(np.float64)


def test_the_replayed_v_is_ht_u_sigma_inverse_of_the_exact_rows(runs, tmp_path):
    res = replay(runs / "sketch" / "gradients.zarr", runs / "spec4", out=tmp_path / "v", task=tiny_task(),
                 keep_raw=True)
    spec = SpectrumStore.open(runs / "spec4")
    want = _h(runs).T @ spec.U / spec.sigma  # the V = Hᵀ·U·Σ⁻¹, from the exact store
    assert res.raw.shape == want.shape == (215, 4)
    np.testing.assert_allclose(res.raw, want, rtol=0, atol=1e-9 * np.abs(want).max())
    assert res.rows_checked == res.rows_exact == STEPS and res.max_relative_difference == 0.0
    out = SpectrumStore.open(tmp_path / "v")
    v = out.read_v().astype(np.float64)
    assert out.status == "complete" and out.shape == (STEPS, 215) and out.k == res.k == 4
    np.testing.assert_allclose(v.T @ v, np.eye(4), atol=1e-6)  # orthonormal (float32 V)
    assert principal_angles(v, want).max() < 1e-6  # the span of Hᵀ·U·Σ⁻¹
    # Rayleigh–Ritz: Hᵀ·u_i = σ_i·v_i with the stored U and σ; σ_i ≤ σ_i(H) (interlacing)
    np.testing.assert_allclose(_h(runs).T @ out.U, v * out.sigma, atol=1e-6 * out.sigma[0])
    exact = SpectrumStore.open(runs / "exact4").sigma
    assert np.all(out.sigma <= exact * (1 + 1e-6))
    rec = out.source["replay"]
    assert rec["verification"]["rows_bit_exact"] == STEPS and rec["K"] == 4 and rec["passes"] == 1
    assert "Rayleigh-Ritz" in rec["orthonormalisation"]
    assert [d["name"] for d in out.source["layout"]] == ["emb.weight", "norm.weight", "norm.bias", "fc1.weight",
                                                         "fc1.bias", "fc2.weight", "fc2.bias"]


def test_with_every_direction_of_the_rows_the_replay_is_the_exact_svd(runs, tmp_path):
    """K = r: U_K spans every row, so the Ritz step is the SVD of the exact H (angles ~ float32 V)."""
    res = replay(runs / "sketch" / "gradients.zarr", runs / f"spec{STEPS}", out=tmp_path / "v", k=4,
                 task=tiny_task(), memory=8 * (STEPS + 16) * 50)  # 50 columns a replay: 5 replays
    assert res.passes == 5 and res.k == 4
    v = SpectrumStore.open(tmp_path / "v").read_v()
    exact = SpectrumStore.open(runs / f"exact{STEPS}")
    assert principal_angles(v, exact.read_v()[:, :4]).max() < 1e-4
    np.testing.assert_allclose(res.sigma, exact.sigma[:4], rtol=1e-6)
    # while the sketch's own sigma is off by percents
    assert np.abs(res.sigma_sketch[:4] / exact.sigma[:4] - 1).max() > 1e-3


@pytest.mark.parametrize("memory", [None, 8 * (STEPS + 16) * 50])  # one column chunk, or several
def test_check_measures_each_directions_residual_against_the_exact_rows(runs, tmp_path, memory, caplog):
    """K < r: the bound ‖(I − U_K·U_Kᵀ)·H‖_F/σ_i (every row's mass outside the K directions) is
    loose; ``check`` replays once more for H·V and stores ‖H·v_i − σ_i·u_i‖/σ_i of the stored V,
    equal to the same residual computed from the exact store."""
    store = runs / "sketch" / "gradients.zarr"
    plain = replay(store, runs / "spec4", out=tmp_path / "b", task=tiny_task(), memory=memory)
    with caplog.at_level("WARNING", logger="gradspec.train"):
        res = replay(store, runs / "spec4", out=tmp_path / "m", task=tiny_task(), memory=memory, check=True)
    if memory is not None:  # the replays the warning counts include the check's
        n = plain.passes
        assert any(f": {2 * n} replays ({n} more for --check)" in r.getMessage() for r in caplog.records), caplog.text
    bound = SpectrumStore.open(tmp_path / "b")
    out = SpectrumStore.open(tmp_path / "m")
    np.testing.assert_array_equal(out.read_v(), bound.read_v())  # the check changes no direction
    h, v = _h(runs)[out.source_rows], out.read_v().astype(np.float64)
    truth = np.linalg.norm(h @ v - out.U * out.sigma, axis=0) / out.sigma
    got = np.asarray(out.array("residual_h"))
    np.testing.assert_allclose(got, truth, rtol=1e-6, atol=1e-12)
    stated = np.asarray(bound.array("residual_h"))
    assert np.all(truth <= stated * (1 + 1e-9)) and stated.max() > 3 * truth.max()  # a bound, and a loose one
    rec = out.source["replay"]["check_replay"]
    assert rec["passes"] == plain.passes and (rec["passes"] == 1) == (memory is None)
    np.testing.assert_allclose(rec["residual_h_bound"], stated)
    assert out.accuracy["check"] == "replay+measured" and out.accuracy["residual_h_check"].startswith("measured")
    assert bound.accuracy["residual_h_check"].startswith("bound, not measured") and res.rows_checked == STEPS


def test_a_spectrum_of_some_rows_replays_those_rows(runs, tmp_path):
    """pca --rows 2:9: U weighs those rows only; the others are replayed (and checked), not added."""
    pca(source=str(runs / "sketch" / "gradients.zarr"), k=3, rows=slice(2, 9), out=tmp_path / "spec",
        progress=False)
    res = replay(runs / "sketch" / "gradients.zarr", tmp_path / "spec", out=tmp_path / "v", task=tiny_task(),
                 keep_raw=True)
    spec = SpectrumStore.open(tmp_path / "spec")
    want = _h(runs)[2:9].T @ spec.U / spec.sigma
    np.testing.assert_allclose(res.raw, want, rtol=0, atol=1e-9 * np.abs(want).max())
    out = SpectrumStore.open(tmp_path / "v")
    assert res.rows_checked == STEPS and out.shape == (7, 215) and list(out.source_rows) == list(range(2, 9))


def test_a_spectrum_of_some_columns_is_refused(runs, tmp_path):
    """pca --params of a sketched store: U, sigma of some of the sketch's columns are not the rows'
    (found by review: the replay wrote directions at sin 0.84 from the exact ones, exit 0)."""
    from gradspec.store import GradientStore

    store = GradientStore.open(runs / "sketch" / "gradients.zarr")
    first = store.layout.names[0]
    pca(source=str(store.path), k=2, params=[first], out=tmp_path / "spec", progress=False)
    with pytest.raises(ValueError, match="computed on some of .* columns"):
        replay(runs / "sketch" / "gradients.zarr", tmp_path / "spec", out=tmp_path / "v", task=tiny_task())


def test_retrain_takes_the_replayed_spectrum_and_refuses_the_sketched_one(runs, tmp_path):
    from gradspec.optim import retrain

    replay(runs / "sketch" / "gradients.zarr", runs / "spec4", out=tmp_path / "v", task=tiny_task())
    config = cfg(steps=3, eval_every=0)
    done = retrain(config=config, algorithm="subspace", out=tmp_path / "rt", task=tiny_task(),
                   options={"projector": "spectrum", "spectrum": tmp_path / "v", "rank": 3})
    assert done.steps == 3
    with pytest.raises(ValueError, match="gradspec replay STORE --spectrum SPECTRUM --out V"):
        retrain(config=config, algorithm="subspace", out=tmp_path / "rt2", task=tiny_task(),
                options={"projector": "spectrum", "spectrum": runs / "spec4", "rank": 3})


def _copy(runs, tmp_path):
    shutil.copytree(runs / "sketch", tmp_path / "sketch")
    return tmp_path / "sketch" / "gradients.zarr"


def _refused(store, spectrum, tmp_path, match, **kw):
    with pytest.raises(ValueError, match=match) as err:
        replay(store, spectrum, out=tmp_path / "v", **{"task": tiny_task(), **kw})
    assert "\n" not in str(err.value)
    assert not (tmp_path / "v").exists()  # nothing usable: no store, no partial one, no accumulators
    assert not list(tmp_path.glob(".v.partial-*")) and not list(tmp_path.glob(".replay-*"))
    return err


def test_a_changed_stored_row_is_refused_naming_the_step(runs, tmp_path):
    store = _copy(runs, tmp_path)
    grads = zarr.open_group(store, mode="r+")["grads"]
    row = grads[5]
    row[7] += 1e-3 * np.abs(row).max()
    rewrite_row(store, 5, row)
    err = _refused(store, runs / "spec4", tmp_path, r"^step 5 \(row 5\) does not replay: its recomputed sketch "
                   r"differs from the stored row by [0-9.e-]+ .*nothing written$")
    assert err.type is ReplayMismatch


def test_changed_data_is_refused_at_the_first_step(runs, tmp_path):
    _refused(runs / "sketch" / "gradients.zarr", runs / "spec4", tmp_path, r"^step 0 \(row 0\) does not replay",
             task=tiny_task(seed=1))


def test_a_changed_learning_rate_no_record_shows_is_refused_at_the_step_it_acts_on(runs, tmp_path, monkeypatch):
    real = TrainConfig.from_dict.__func__

    def other_lr(cls, d):
        return real(cls, {**d, "lr": d["lr"] * 1.01})

    monkeypatch.setattr(TrainConfig, "from_dict", classmethod(other_lr))
    # step 0's row is computed before the first update: the same; step 1's is not
    _refused(runs / "sketch" / "gradients.zarr", runs / "spec4", tmp_path, r"^step 1 \(row 1\) does not replay")


def test_a_changed_record_is_refused_before_any_step(runs, tmp_path):
    store = _copy(runs, tmp_path)
    g = GradientStore.open(store, mode="r+")
    g.update_config(collect={**g.config["collect"], "seed": 1})
    _refused(store, runs / "spec4", tmp_path, "config digest differs")
    # config.json of the run directory against the store's record
    shutil.rmtree(tmp_path / "sketch")
    store = _copy(runs, tmp_path)
    path = tmp_path / "sketch" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "lr": 0.5}))
    _refused(store, runs / "spec4", tmp_path, r"config.json and the store .* record different settings \(--lr: 0.5")


def test_what_cannot_be_replayed_is_refused(runs, tmp_path):
    _refused(runs / "exact" / "gradients.zarr", runs / "exact4", tmp_path, "is not sketched")
    _refused(runs / "sketch" / "gradients.zarr", runs / "exact4", tmp_path, "replay the store it was computed from, as")
    _refused(runs / "sketch" / "gradients.zarr", runs / "spec4", tmp_path, r"--k 5 is outside \[1, 4\]", k=5)
    _refused(runs / "sketch" / "gradients.zarr", runs / "spec4", tmp_path, r"replay it from Python with "
             r"gradspec.replay\(store, spectrum, out=..., task=the_same_task\)$", task=None)
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "x").write_text("")
    with pytest.raises(FileExistsError, match="not a spectrum store"):
        replay(runs / "sketch" / "gradients.zarr", runs / "spec4", out=tmp_path / "v", task=tiny_task())


def test_a_bfloat16_store_of_every_other_step_replays_bit_for_bit(tmp_path):
    """The recomputed sketch is rounded to the store's dtype as the writer rounds it; steps that
    store no row (--every 2) are replayed too (they move the parameters)."""
    config = cfg(steps=6, every=2, dtype="bfloat16", sketch=M, sketch_blocks=4)
    run = collect(config, out=tmp_path / "run", task=tiny_task())
    pca(source=str(run.store), k=2, out=tmp_path / "spec", progress=False)
    res = replay(run.store, tmp_path / "spec", out=tmp_path / "v", task=tiny_task())
    assert res.rows_checked == res.rows_exact == 3 and res.record["verification"]["store_dtype"] == "bfloat16"
    assert res.record["verification"]["tolerance"] == 2.0**-7


# ---------------------------------------------------------------------- decay of a replayed spectrum
DECAY = {"n": 64, "epsilon": 2.0, "delta": 1e-5, "diameter": 1.0}  # tiny's 64 training examples


def _no_rows_read(monkeypatch):
    """Reading any gradient block fails the test (row metadata stays readable)."""
    def refuse(*args, **kwargs):
        raise AssertionError("read a gradient row")

    for name in ("iter_tiles", "iter_col_blocks", "iter_row_blocks", "read"):
        monkeypatch.setattr(GradientStore, name, refuse)


def _values(report, path=""):
    """Every value of a report.json dict outside its sources, notes and summary, by path; a list
    of numbers is one value."""
    if isinstance(report, dict):
        return {k: v for key, val in report.items() if key not in ("source", "sources", "notes", "summary")
                for k, v in _values(val, f"{path}.{key}").items()}
    if isinstance(report, list) and report and isinstance(report[0], dict | list):
        return {k: v for i, val in enumerate(report) for k, v in _values(val, f"{path}[{i}]").items()}
    return {path: report}


def test_decay_of_a_replay_of_every_direction_is_decay_of_the_exact_rows(runs, tmp_path, monkeypatch):
    """K = r: the replay is the exact SVD of the exact rows and records their norms, so decay forms
    their G_k from the spectrum alone (no row read) and every number of report.json is the one
    decay gives on the exact per-step collection of the same run (float64 pca)."""
    from gradspec.spectrum import DecayConfig, decay_analysis

    replay(runs / "sketch" / "gradients.zarr", runs / f"spec{STEPS}", out=tmp_path / "v", task=tiny_task())
    out = SpectrumStore.open(tmp_path / "v")
    np.testing.assert_allclose(out.row_sq_norms, (_h(runs) ** 2).sum(1), rtol=1e-12)  # U's rows: steps 0..11
    assert "row_sq_norms" in out.source["replay"]["row_norms"]
    pca(source=str(runs / "exact" / "gradients.zarr"), k=STEPS, precision="float64", out=tmp_path / "exact",
        progress=False)
    # At k = r both sides' G_k are rounding (‖h‖² − Σσ²U² cancels to ~1e-16 of ‖h‖²: ~1e-8 of G_0 after
    # the root), and so is whatever is built on them there: every number is compared below rank r,
    # G_k at every rank to that floor.
    for config, rtol, floor in ((DecayConfig(**DECAY, k_max=STEPS - 2), 1e-9, 1e-12),
                                (DecayConfig(**DECAY, every_rank=True), 1e-9, 1e-6)):
        want = decay_analysis(spectrum=tmp_path / "exact", config=config).to_dict()
        with monkeypatch.context() as m:
            _no_rows_read(m)
            got = decay_analysis(spectrum=tmp_path / "v", config=config).to_dict()
        assert got["sources"]["collected"]["measured"].startswith("from the replayed spectrum's U and sigma (K = r")
        assert got["summary"].keys() == want["summary"].keys() and "G_k_collected" in got["summary"]
        a, b = _values(got), _values(want)
        assert a.keys() == b.keys()
        assert a[".rows.collected.reconstruction_error_by_step.steps"] == list(range(STEPS))  # the sketched store's
        keys = [key for key in a if config.k_max or key.startswith(".rows.collected.G_k.")]
        assert ".rows.collected.G_k.max" in keys
        for key in keys:
            x, y = np.asarray(a[key]), np.asarray(b[key])
            if x.dtype.kind == "f" or y.dtype.kind == "f":
                np.testing.assert_allclose(x, y, rtol=rtol, atol=floor * np.abs(y).max(), err_msg=key)
            else:
                assert a[key] == b[key], key


def test_decay_of_a_checked_replay_of_fewer_directions_is_g_k_onto_its_directions(runs, tmp_path, monkeypatch):
    """K < r with --check: the stored H·V and the recorded row norms give each row's G_k onto the
    span of the first k replayed directions, ‖h_i‖² − Σ_{j≤k} (h_i·v_j)², with no row read: equal
    to the same projection of the exact rows (the unsketched collection of the run) onto the stored V."""
    from gradspec.spectrum import DecayConfig, decay_analysis

    replay(runs / "sketch" / "gradients.zarr", runs / "spec4", out=tmp_path / "v", task=tiny_task(), check=True)
    out = SpectrumStore.open(tmp_path / "v")
    h, v = _h(runs)[out.source_rows], out.read_v().astype(np.float64)
    np.testing.assert_allclose(out.hv, h @ v, rtol=0, atol=1e-9 * np.abs(h @ v).max())
    with monkeypatch.context() as m:
        _no_rows_read(m)
        got = decay_analysis(spectrum=tmp_path / "v", config=DecayConfig(**DECAY, every_rank=True)).to_dict()
    assert got["sources"]["collected"]["measured"].startswith("onto the replayed directions' span, from H·V")
    gk = got["rows"]["collected"]["G_k"]
    ks = np.asarray(gk["ks"])
    assert ks.tolist() == [0, 1, 2, 3, 4]
    proj = np.concatenate([np.zeros((h.shape[0], 1)), np.cumsum((h @ v) ** 2, axis=1)], axis=1)
    truth = np.sqrt(np.clip((h**2).sum(1)[:, None] - proj, 0, None))  # rows x ranks 0..4
    np.testing.assert_allclose(gk["max"], truth.max(0)[ks], rtol=1e-7)
    np.testing.assert_allclose(gk["p50"], np.median(truth, axis=0)[ks], rtol=1e-7)


def test_decay_of_a_replay_of_fewer_directions_fits_sigma_only_and_says_why(runs, tmp_path, caplog):
    """K < r: U = U_K·W are Ritz vectors and the rows are stored sketched: no G_k of the own rows
    (never ‖h‖² − Σσ²U² of Ritz vectors), a warning naming K, r and the fix; σ is fitted. Held-out
    rows need unsketched rows (--gradients): asking for the sketched store's is refused in one line."""
    from gradspec.spectrum import DecayConfig, decay_analysis

    replay(runs / "sketch" / "gradients.zarr", runs / "spec4", out=tmp_path / "v", task=tiny_task())
    with caplog.at_level("WARNING", logger="gradspec.spectrum"):
        got = decay_analysis(spectrum=tmp_path / "v", config=DecayConfig(**DECAY))
    assert got.rows == {} and got.fit_singular is not None
    warned = [r.getMessage() for r in caplog.records if "G_k not computed" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert "K = 4 of the r = 12 directions" in warned[0] and f"gradspec pca SKETCHED --k {STEPS}" in warned[0]
    assert "replay with --check" in warned[0]
    assert any("K = 4 of the r = 12" in note for note in got.notes)
    for kw, match in (({"heldout_rows": "0:3"}, "^--heldout-rows of a replayed spectrum need unsketched rows"),
                      ({"gradients": runs / "sketch" / "gradients.zarr"},
                       "holds sketched rows .* leave out --gradients|holds sketched rows .* without --gradients$")):
        with pytest.raises(ValueError, match=match) as err:
            decay_analysis(spectrum=tmp_path / "v", **kw)
        assert "\n" not in str(err.value) and "another model" not in str(err.value)
    # unsketched rows of its parameters are projected onto its V, as for any spectrum
    held = decay_analysis(spectrum=tmp_path / "v", gradients=runs / "exact" / "gradients.zarr").to_dict()
    assert held["rows"]["heldout"]["G_k"]["n_rows"] == STEPS and "collected" not in held["rows"]


def test_decay_of_a_replay_without_recorded_row_norms_measures_no_g_k(runs, tmp_path):
    """A replay written before the norms were recorded: the sketched store's norms are not the rows'
    (a plausible wrong G_k), so σ only, and the note says to replay again."""
    from gradspec.spectrum import decay_analysis

    replay(runs / "sketch" / "gradients.zarr", runs / f"spec{STEPS}", out=tmp_path / "v", task=tiny_task())
    del SpectrumStore.open(tmp_path / "v", mode="r+")._group["row_sq_norms"]
    got = decay_analysis(spectrum=tmp_path / "v")
    assert got.rows == {} and any("rerun `gradspec replay`" in note for note in got.notes)
    with pytest.raises(ValueError, match="read_rows: its rows are stored sketched"):
        decay_analysis(spectrum=tmp_path / "v", read_rows=True)
