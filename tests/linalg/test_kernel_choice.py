"""The Gram kernel is chosen by measurement once per machine, cached, and can be overridden.

No test depends on which kernel wins: the measurement is replaced by fixed rates wherever a
choice is checked, and the real measurement is only checked to time every candidate.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from gradspec.linalg import GRAM_KERNELS, machine_kernels, pca
from gradspec.linalg import _kernel_cache as kcache
from gradspec.linalg import _kernel_choice as kc

CPU = torch.device("cpu")
RATES = {
    "float32": {"numpy-syrk": 20.0, "scipy-syrk": 30.0, "torch-blocked": 5.0, "torch-gemm": 10.0},
    "float64": {"numpy-syrk": 9.0, "scipy-syrk": 3.0, "torch-blocked": 4.0, "torch-gemm": 8.0},
}


@pytest.fixture
def fake_measure(monkeypatch):
    """The measurement, replaced by fixed rates; counts its calls."""
    calls = []

    def fake(*args, **kwargs):
        calls.append(1)
        return json.loads(json.dumps(RATES))

    monkeypatch.setattr(kc, "measure", fake)
    monkeypatch.setattr(kc, "_memo", {})
    monkeypatch.setattr(kc, "load_average", lambda: 0.0)  # a quiet machine, whatever this one's load
    return calls


def test_measured_choice_is_cached_and_read_back(tmp_path, fake_measure):
    first = machine_kernels(cache=tmp_path)
    assert first["source"] == "measured" and len(fake_measure) == 1
    assert first["choice"] == {"float32": "scipy-syrk", "float64": "numpy-syrk"}
    data = json.loads((tmp_path / kc.CACHE_FILE).read_text())
    assert data["version"] == kcache.CACHE_VERSION
    (entry,) = data["entries"].values()
    assert entry["choice"] == first["choice"] and entry["rates"] == RATES
    # keyed by the machine and the panel measured
    assert json.loads(next(iter(data["entries"]))) == {**kc.machine_key(), "panel": [1024, 8192]}
    kc._memo.clear()  # a new process
    again = machine_kernels(cache=tmp_path)
    assert again["source"] == "cache" and len(fake_measure) == 1
    assert again["choice"] == first["choice"] and again["rates"] == RATES
    assert machine_kernels(cache=tmp_path, remeasure=True)["source"] == "measured"
    assert len(fake_measure) == 2


def test_another_machine_key_measures_again(tmp_path, fake_measure, monkeypatch):
    machine_kernels(cache=tmp_path)
    kc._memo.clear()
    monkeypatch.setattr(kc, "machine_key", lambda: {"cpu": "another", "torch": "x"})
    assert machine_kernels(cache=tmp_path)["source"] == "measured"
    assert len(json.loads((tmp_path / kc.CACHE_FILE).read_text())["entries"]) == 2


QUIET = {"load_1m": 0.1, "cores": 2, "torch_threads": 2, "cpu_s": 3.0, "wall_s": 1.6, "under_load": False}


def _valid_file(path) -> dict:
    return {"version": kcache.CACHE_VERSION, "entries": {kc.entry_key(): {
        "choice": {"float32": "torch-gemm", "float64": "torch-gemm"}, "rates": json.loads(json.dumps(RATES)),
        "panel": [8, 8], "measured_at": "then", "conditions": QUIET}}}


def _entry(data: dict) -> dict:
    return next(iter(data["entries"].values()))


DAMAGE = {
    "not-json": lambda d: "{not json",
    "binary": lambda d: b"\xff\xfe\x00garbage",
    "wrong-version": lambda d: {**d, "version": 99},
    "entries-a-list": lambda d: {**d, "entries": []},
    "unknown-kernel": lambda d: (_entry(d)["choice"].update(float32="mkl-magic"), d)[1],
    "negative-rate": lambda d: (_entry(d)["rates"]["float64"].update({"torch-gemm": -1.0}), d)[1],
    "nan-rate": lambda d: (_entry(d)["rates"]["float64"].update({"torch-gemm": float("nan")}), d)[1],
    "bool-rate": lambda d: (_entry(d)["rates"]["float32"].update({"torch-gemm": True}), d)[1],
    "no-rates": lambda d: (_entry(d).pop("rates"), d)[1],
    "entry-a-string": lambda d: {**d, "entries": dict.fromkeys(d["entries"], "fast")},
    # found by review: each stopped pca with a KeyError or TypeError instead of a new measurement
    "choice-without-a-rate": lambda d: (_entry(d)["rates"]["float32"].pop(_entry(d)["choice"]["float32"]), d)[1],
    "no-panel": lambda d: (_entry(d).pop("panel"), d)[1],
    "panel-a-number": lambda d: (_entry(d).update(panel=8192), d)[1],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_is_ignored_with_a_warning_and_measured_again(tmp_path, fake_measure, caplog, damage):
    path = tmp_path / kc.CACHE_FILE
    bad = DAMAGE[damage](_valid_file(path))
    if isinstance(bad, bytes):
        path.write_bytes(bad)
    else:
        path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    with caplog.at_level(logging.WARNING, logger="gradspec.linalg._kernel_choice"):
        info = machine_kernels(cache=tmp_path)
    assert info["source"] == "measured" and len(fake_measure) == 1
    assert info["choice"] == {"float32": "scipy-syrk", "float64": "numpy-syrk"}  # not the cached one
    assert any("ignoring" in r.message and "measuring again" in r.message for r in caplog.records)
    kc._memo.clear()
    assert machine_kernels(cache=tmp_path)["source"] == "cache"  # rewritten whole and valid


def test_an_intact_cache_is_trusted(tmp_path, fake_measure):
    (tmp_path / kc.CACHE_FILE).write_text(json.dumps(_valid_file(tmp_path)))
    info = machine_kernels(cache=tmp_path)
    assert info["source"] == "cache" and not fake_measure
    assert info["choice"] == {"float32": "torch-gemm", "float64": "torch-gemm"}


def test_an_unwritable_cache_still_chooses(tmp_path, fake_measure, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="gradspec.linalg._kernel_choice"):
        info = machine_kernels(cache=blocker / "sub")
    assert info["choice"]["float32"] == "scipy-syrk"
    assert any("could not write" in r.message for r in caplog.records)


def test_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("GRADSPEC_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert kc.cache_dir() == tmp_path / "a"
    assert kc.cache_dir(tmp_path / "o") == tmp_path / "o"
    monkeypatch.delenv("GRADSPEC_CACHE_DIR")
    assert kc.cache_dir() == tmp_path / "x" / "gradspec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kc.cache_dir() == tmp_path / "home" / ".cache" / "gradspec"


def test_auto_measures_only_a_pass_worth_it(tmp_path, fake_measure):
    small = kc.choose_gram_kernel("auto", dtype=torch.float32, device=CPU, flops=1e6, cache=tmp_path)
    assert small[0] == "numpy-syrk" and "not worth measuring" in small[1]
    assert not fake_measure and not (tmp_path / kc.CACHE_FILE).exists()
    big = kc.choose_gram_kernel("auto", dtype=torch.float32, device=CPU, flops=1e13, cache=tmp_path)
    assert big[0] == "scipy-syrk" and "30 GFLOP/s" in big[1]
    big64 = kc.choose_gram_kernel("auto", dtype=torch.float64, device=CPU, flops=1e13, cache=tmp_path)
    assert big64[0] == "numpy-syrk" and len(fake_measure) == 1
    gpu = kc.choose_gram_kernel("auto", dtype=torch.float32, device=torch.device("cuda"), flops=1e13)
    assert gpu[0] == "torch-gemm"


def test_an_override_is_used_as_is(tmp_path, fake_measure, monkeypatch):
    monkeypatch.setenv("GRADSPEC_CACHE_DIR", str(tmp_path))
    assert kc.choose_gram_kernel("torch-blocked", dtype=torch.float32, device=CPU, flops=1e13) == (
        "torch-blocked", "as requested")
    h = np.random.default_rng(0).standard_normal((30, 200))
    for name in GRAM_KERNELS:
        res = pca(source=h, k=3, kernel=name)
        assert res.params["kernel"] == name and res.params["kernel_reason"] == "as requested"
        np.testing.assert_allclose(res.sigma, np.linalg.svd(h, compute_uv=False)[:3], rtol=1e-12)
    with pytest.raises(ValueError, match="unknown Gram kernel 'fast'; choose one of: auto, "):
        pca(source=h, k=3, kernel="fast")
    assert not fake_measure


def test_the_panel_measured_is_shaped_like_the_pass(tmp_path, fake_measure, monkeypatch):
    """Kernels rank differently with r and with the panel's width (a 1024x768 panel once chose a
    kernel 1.5x slower at the pass's 1500x4096 panels), so a pass's rows pick the panel and
    each row bucket is measured, and cached, on its own."""
    assert kc.measure_panel(None) == (kc.DEFAULT_ROWS, kc.MEASURE_COLS)
    assert [kc.measure_panel(r)[0] for r in (3, 200, 400, 1500, 2000, 4000, 10**6)] == [
        256, 256, 512, 2048, 2048, 2048, 2048]
    assert kc.measure_panel(700) == (512, 8192) and kc.measure_panel(800) == (1024, 8192)
    panels = []
    monkeypatch.setattr(kc, "measure", lambda panel=None, **kw: (panels.append(panel), json.loads(json.dumps(RATES)))[1])
    for rows in (1500, 2000, 400):
        kc.choose_gram_kernel("auto", dtype=torch.float32, device=CPU, flops=1e13, cache=tmp_path, rows=rows)
    assert panels == [(2048, 8192), (512, 8192)]  # 2000 is in 1500's bucket: read back
    entries = json.loads((tmp_path / kc.CACHE_FILE).read_text())["entries"]
    assert sorted(json.loads(k)["panel"] for k in entries) == [[512, 8192], [2048, 8192]]
    assert sorted(e["panel"] for e in entries.values()) == [[512, 8192], [2048, 8192]]
    h = np.random.default_rng(0).standard_normal((300, 70_000)).astype(np.float32)
    monkeypatch.setenv("GRADSPEC_CACHE_DIR", str(tmp_path))
    res = pca(source=h, k=2)  # r²p = 6.3e9: under MEASURE_MIN_FLOPS, no measurement
    assert "not worth measuring" in res.params["kernel_reason"] and len(panels) == 2
    assert not kc.worth_measuring(5e11, 4000) and kc.worth_measuring(5e11, 1000)  # the panel's own cost
    assert kc.worth_measuring(2e10, 300) and not kc.worth_measuring(1.9e10, 300)
    monkeypatch.setattr(kc, "MEASURE_MIN_FLOPS", 1e9)
    monkeypatch.setattr(kc, "MEASURE_WORK", 0.5)
    res = pca(source=h, k=2)
    assert panels[-1] == (256, 8192) and "on 256x8192" in res.params["kernel_reason"]


def test_the_measurement_warms_each_kernel_up_before_timing_it(monkeypatch):
    """A kernel's first update pays G's first touch and its threads' start-up: it is not the
    rate. Here each kernel's first update is made 50x slower; the ranking must not change."""
    seen: dict[str, int] = {}
    real = dict(GRAM_KERNELS)

    def slow_first(cls):
        class Slow(cls):
            def update(self, panel):
                seen[cls.name] = seen.get(cls.name, 0) + 1
                t0 = time.perf_counter()
                super().update(panel)
                if seen[cls.name] == 1:
                    time.sleep(49 * (time.perf_counter() - t0) + 0.05)

        return Slow

    monkeypatch.setattr(kc, "GRAM_KERNELS", {n: slow_first(c) for n, c in real.items()})
    rates = kc.measure(panel=(64, 256), budget_s=30.0)
    slowest_possible = 64 * 64 * 256 / 0.05 / 1e9  # what a rate would be if its sleep were timed
    for per_kernel in rates.values():
        assert all(v > slowest_possible for v in per_kernel.values()), per_kernel


def test_the_measurement_times_every_candidate():
    rates = kc.measure(panel=(96, 64), budget_s=5.0)
    assert set(rates) == {"float32", "float64"}
    for per_kernel in rates.values():
        assert set(per_kernel) == set(GRAM_KERNELS)
        assert all(np.isfinite(v) and v > 0 for v in per_kernel.values())


def test_info_machine_prints_the_choice_and_rates(tmp_path, fake_measure, monkeypatch):
    monkeypatch.setenv("GRADSPEC_CACHE_DIR", str(tmp_path))
    runner = CliRunner()
    r = runner.invoke(app, ["info", "--machine"])
    assert r.exit_code == 0, r.output
    assert "float32  chosen scipy-syrk: scipy-syrk 30.0  numpy-syrk 20.0" in r.output
    assert "float64  chosen numpy-syrk" in r.output and str(tmp_path) in r.output
    r = runner.invoke(app, ["info", "--machine", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["choice"]["float64"] == "numpy-syrk"
    assert len(fake_measure) == 1  # the second run read it back
    r = runner.invoke(app, ["info"])
    assert r.exit_code != 0 and "give a STORE to describe, or --machine" in r.output


def test_a_kernel_that_holds_the_gil_is_not_chosen_over_one_that_leaves_it(tmp_path, monkeypatch):
    """scipy's f2py BLAS holds the GIL; led alone, it starved a pass's read-ahead thread (its
    Gram pass 7.4-8.4 s against numpy's 6.3-6.9 s). The measured shares decide, not the names."""
    from gradspec.linalg._gil import GIL_MIN, choose

    def fake(panel=None, budget_s=0, seed=0, shares=None):
        shares.update({d: {name: (0.1 if name == "scipy-syrk" else 0.95) for name in r} for d, r in RATES.items()})
        return json.loads(json.dumps(RATES))

    monkeypatch.setattr(kc, "measure", fake)
    monkeypatch.setattr(kc, "_memo", {})
    monkeypatch.setattr(kc, "load_average", lambda: 0.0)
    info = machine_kernels(cache=tmp_path)
    assert info["choice"] == {"float32": "numpy-syrk", "float64": "numpy-syrk"}  # scipy led float32 at 30
    assert info["conditions"]["gil_share"]["float32"]["scipy-syrk"] == 0.1
    kc._memo.clear()
    assert machine_kernels(cache=tmp_path)["choice"]["float32"] == "numpy-syrk"  # as cached
    name, why = kc.choose_gram_kernel("auto", dtype=torch.float32, device=CPU, flops=1e13, cache=tmp_path)
    assert name == "numpy-syrk" and "scipy-syrk ran faster but holds the GIL the reads need" in why
    # every kernel holding it: the fastest of all; no share recorded: it counts as leaving it
    assert choose({"a": 1.0, "b": 2.0}, {"a": 0.0, "b": GIL_MIN / 2}) == "b"
    assert choose({"a": 1.0, "b": 2.0}, {"a": 1.0}) == "b"
    assert choose({"a": 1.0, "b": 2.0}, {"a": GIL_MIN, "b": 0.2}) == "a"


def test_the_gil_share_tells_a_call_that_holds_it_from_one_that_does_not():
    """Not a timing: the GIL-holding call is a C loop that never yields (a big int's power), the
    other a sleep; their shares are at the two ends of [0, 1], far from the threshold."""
    import time as _time

    from gradspec.linalg._gil import GIL_MIN, gil_share

    assert gil_share(lambda: _time.sleep(0.05))[0] > GIL_MIN
    assert gil_share(lambda: pow(3, 3_000_000))[0] < GIL_MIN


def test_a_low_gil_share_is_measured_again_and_the_larger_kept():
    """One low sample (numpy's syrk at 0.47 once, 0.87-1.0 otherwise) had a GEMM at half its rate
    chosen. Not a timing: a GIL-holding C loop against a sleep, far from the threshold."""
    import time as _time

    from gradspec.linalg._gil import GIL_MIN, settled_share

    calls = []

    def again():
        calls.append(1)
        _time.sleep(0.05)

    assert settled_share(lambda: pow(3, 3_000_000), again)[0] > GIL_MIN and calls == [1]
    assert settled_share(lambda: _time.sleep(0.05), again)[0] > GIL_MIN and calls == [1]  # not asked again
    assert settled_share(lambda: pow(3, 3_000_000), lambda: pow(3, 3_000_000))[0] < GIL_MIN


def test_the_measurement_records_each_kernels_gil_share():
    shares = {}
    rates = kc.measure((256, 512), budget_s=0.2, shares=shares)
    assert set(shares) == set(rates) == set(kc.DTYPES)
    for d in kc.DTYPES:
        assert set(shares[d]) == set(GRAM_KERNELS) and all(0.0 <= v <= 1.0 for v in shares[d].values())
