"""The Gram-kernel cache is read safely and not trusted forever (issue 34 §4).

A FIFO, a directory or an oversized file in the cache's place is ignored with a one-line
warning and measured again, never waited on or read whole (a FIFO hung ``info --machine``
and every pass above 2e10 flops; a 512 MiB file cost 1.27 GB of memory). A measurement
records how it was taken, one taken under load is measured again once the machine is quiet,
and one a Gram pass contradicts (a pass far faster than the kernel's measured rate) is
measured again on the next choice. The load, the CPU and wall clocks and the pass rates are
injected: nothing here depends on this machine's speed or load.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import tracemalloc

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from gradspec.linalg import GradientOperator, machine_kernels
from gradspec.linalg import _kernel_cache as kcache
from gradspec.linalg import _kernel_choice as kc

CPU = torch.device("cpu")
RATES = {
    "float32": {"numpy-syrk": 20.0, "scipy-syrk": 30.0, "torch-blocked": 5.0, "torch-gemm": 10.0},
    "float64": {"numpy-syrk": 9.0, "scipy-syrk": 3.0, "torch-blocked": 4.0, "torch-gemm": 8.0},
}
QUIET = {"load_1m": 0.1, "cores": 2, "torch_threads": 2, "cpu_s": 3.0, "wall_s": 1.6}
LOADED = {"load_1m": 3.4, "cores": 2, "torch_threads": 2, "cpu_s": 1.4, "wall_s": 1.6}


@pytest.fixture
def machine(monkeypatch):
    """The measurement replaced by fixed rates (its calls counted), and the load, cores and
    clocks set by the test: ``machine.load`` now, ``machine.clocks`` the (cpu, wall) seconds
    a measurement takes."""

    class Machine:
        calls: list[int] = []
        load = 0.1
        clocks = (3.0, 1.6)  # 1.9 CPU s per s of 2 threads: got its CPU

    m = Machine()
    m.calls = []
    ticks: list[tuple[float, float]] = []

    def fake_measure(*args, **kwargs):
        m.calls.append(1)
        return json.loads(json.dumps(RATES))

    def clocks():  # start at (0, 0), end at m.clocks
        ticks.append((0.0, 0.0) if len(ticks) % 2 == 0 else m.clocks)
        return ticks[-1]

    monkeypatch.setattr(kc, "measure", fake_measure)
    monkeypatch.setattr(kc, "_memo", {})
    monkeypatch.setattr(kc, "load_average", lambda: m.load)
    monkeypatch.setattr(kc, "_cores", lambda: 2)
    monkeypatch.setattr(kc, "_clocks", clocks)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    return m


def _in_thread(fn, timeout: float = 60.0):
    """fn() in a daemon thread; fails (instead of hanging the suite) if it does not return."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "blocked on the cache file"
    if "error" in out:
        raise out["error"]
    return out["value"]


def _cache_file(path, conditions=QUIET, **extra) -> None:
    entry = {"choice": {"float32": "torch-gemm", "float64": "torch-gemm"}, "rates": RATES,
             "panel": [8, 8], "measured_at": "then", **extra}
    if conditions is not None:
        entry["conditions"] = conditions
    key = kc.entry_key()
    path.write_text(json.dumps({"version": kcache.CACHE_VERSION, "entries": {key: entry}}))


# ---------------------------------------------------------------------------- hostile files
@pytest.mark.parametrize("kind", ["fifo", "directory", "oversized"])
def test_a_cache_that_is_not_a_small_regular_file_is_ignored_and_replaced(tmp_path, machine, caplog, kind):
    path = tmp_path / kc.CACHE_FILE
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a blocking open waits forever
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as f:  # sparse: 8 MiB of zeros that take no disk
            f.truncate(8 << 20)
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger=kc.__name__):
            info = _in_thread(lambda: machine_kernels(cache=tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info["source"] == "measured" and len(machine.calls) == 1
    assert peak < kcache.MAX_CACHE_BYTES  # never read whole (was: 8 MiB read, then refused)
    warning, *rest = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "\n" not in warning and "measuring again" in warning
    assert len(rest) == (kind == "directory")  # a directory cannot be replaced: "could not write"
    assert {"fifo": "not a regular file", "oversized": "8,388,608 bytes, over the 1,048,576",
            "directory": "not a regular file"}[kind] in warning
    if kind != "directory":  # replaced by a valid cache, read back without measuring
        kc._memo.clear()
        assert machine_kernels(cache=tmp_path)["source"] == "cache" and len(machine.calls) == 1


def test_info_machine_with_a_fifo_for_the_cache_answers(tmp_path, machine, monkeypatch):
    monkeypatch.setenv("GRADSPEC_CACHE_DIR", str(tmp_path))
    os.mkfifo(tmp_path / kc.CACHE_FILE)
    res = _in_thread(lambda: CliRunner().invoke(app, ["info", "--machine"]))
    assert res.exit_code == 0, res.output
    assert "float32  chosen scipy-syrk" in res.output
    assert "measured quiet, load 0.10 on 2 cores, 1.9 CPU s per s" in res.output


def test_a_pass_worth_measuring_with_a_fifo_for_the_cache_does_not_hang(tmp_path, machine):
    os.mkfifo(tmp_path / kc.CACHE_FILE)
    name, why = _in_thread(lambda: kc.choose_gram_kernel("auto", dtype=torch.float32, device=CPU,
                                                         flops=1e13, cache=tmp_path))
    assert name == "scipy-syrk" and "30 GFLOP/s" in why


# ---------------------------------------------------------------------------- load
@pytest.mark.parametrize(("conditions", "loaded"), [
    (QUIET, False),
    (LOADED, True),
    ({**LOADED, "cpu_s": 3.0}, False),  # a high load average, but the measurement got its CPU
    ({**QUIET, "cpu_s": 0.5}, False),  # little CPU, but nothing else was running: its own doing
    ({**LOADED, "load_1m": None}, False),  # no load average on this platform
    ({**LOADED, "torch_threads": 8}, True),  # threads beyond the cores count as the cores
    ({**LOADED, "load_1m": "high"}, True),  # a damaged record is not trusted
    ({"load_1m": 0.1}, True),
    (None, True),  # no record (an older gradspec's entry)
], ids=["quiet", "loaded", "load-but-full-cpu", "low-cpu-but-quiet", "no-loadavg", "threads-over-cores",
        "damaged", "partial", "none"])
def test_under_load(conditions, loaded):
    assert kc.under_load(conditions) is loaded


def test_a_measurement_records_how_it_was_taken(tmp_path, machine):
    machine.load, machine.clocks = 3.4, (1.4, 1.6)
    info = machine_kernels(cache=tmp_path)
    entry = next(iter(json.loads((tmp_path / kc.CACHE_FILE).read_text())["entries"].values()))
    assert entry["conditions"] == {**LOADED, "under_load": True} == info["conditions"]
    assert info["how"] == "under load 3.40 on 2 cores, 0.9 CPU s per s"
    name, why = kc.choose_gram_kernel("auto", dtype=torch.float32, device=CPU, flops=1e13, cache=tmp_path)
    assert why.startswith("fastest for float32 panels here, 30 GFLOP/s on 1024x8192, measured under load (")


@pytest.mark.parametrize("recorded", ["loaded", "unrecorded"])
def test_a_loaded_measurement_is_measured_again_once_the_machine_is_quiet(tmp_path, machine, recorded):
    _cache_file(tmp_path / kc.CACHE_FILE, LOADED if recorded == "loaded" else None)
    machine.load = 1.5  # still busy: the loaded entry is what there is
    assert machine_kernels(cache=tmp_path)["choice"]["float32"] == "torch-gemm" and not machine.calls
    kc._memo.clear()  # a later process, on a quiet machine
    machine.load = 0.2
    info = machine_kernels(cache=tmp_path)
    assert info["source"] == "measured" and len(machine.calls) == 1
    assert info["choice"]["float32"] == "scipy-syrk" and "machine is quiet now" in info["why"]
    assert info["conditions"]["under_load"] is False
    kc._memo.clear()  # measured quiet: trusted from then on, loaded or not
    machine.load = 3.0
    assert machine_kernels(cache=tmp_path)["source"] == "cache" and len(machine.calls) == 1
    machine.load = 0.0
    kc._memo.clear()
    assert machine_kernels(cache=tmp_path)["source"] == "cache" and len(machine.calls) == 1


# ---------------------------------------------------------------------------- pass rates
def test_a_pass_that_contradicts_the_measurement_marks_it_stale_once(tmp_path, machine, caplog):
    machine_kernels(cache=tmp_path)  # float64: numpy-syrk at 9 GFLOP/s
    check = lambda kernel, gflops, flops=1e13: kc.check_gram_pass(  # noqa: E731
        kernel, dtype=torch.float64, device=CPU, flops=flops, gflops=gflops, cache=tmp_path)
    assert not check("numpy-syrk", 18.0)  # within 2x: a pass never beats the kernel by much
    assert not check("torch-gemm", 100.0)  # not the measured choice
    assert not check("numpy-syrk", 100.0, flops=1e6)  # too small a pass to have been measured for
    with caplog.at_level(logging.WARNING, logger=kc.__name__):
        assert check("numpy-syrk", 27.0)
    assert "ran numpy-syrk at 27.0 GFLOP/s, 3.0x the 9.0 GFLOP/s" in caplog.text
    entry = next(iter(json.loads((tmp_path / kc.CACHE_FILE).read_text())["entries"].values()))
    assert entry["stale"]["achieved"] == 27.0 and entry["stale"]["measured"] == 9.0
    info = machine_kernels(cache=tmp_path)  # the next choice, in this process too
    assert info["source"] == "measured" and len(machine.calls) == 2
    assert info["why"].startswith("a float64 Gram pass ran numpy-syrk at 27.0 GFLOP/s, over 2x the 9.0")
    assert info["after_contradiction"]["achieved"] == 27.0 and "stale" not in info
    assert not check("numpy-syrk", 27.0)  # the re-measurement agrees: kept, no loop
    kc._memo.clear()
    assert machine_kernels(cache=tmp_path)["source"] == "cache" and len(machine.calls) == 2


def test_a_gram_pass_checks_its_rate_against_the_cache(tmp_path, machine, monkeypatch):
    """The operator's Gram pass feeds its rate to the check (rates made tiny: any pass beats them)."""
    monkeypatch.setattr(kc, "MEASURE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(kc, "MEASURE_WORK", 0.0)
    slow = {d: dict.fromkeys(r, 1e-9) for d, r in RATES.items()}
    monkeypatch.setattr(kc, "measure", lambda *a, **k: json.loads(json.dumps(slow)))
    h = np.random.default_rng(0).standard_normal((30, 400))
    op = GradientOperator(h, precision="float64", kernel_cache=str(tmp_path))
    np.testing.assert_allclose(op.gram(), h @ h.T, rtol=1e-12)
    entry = next(iter(json.loads((tmp_path / kc.CACHE_FILE).read_text())["entries"].values()))
    assert entry["stale"]["kernel"] == op.kernel_choice[0] and entry["stale"]["measured"] == 0.0
    override = GradientOperator(h, precision="float64", kernel="torch-gemm", kernel_cache=str(tmp_path / "o"))
    override.gram()
    assert not (tmp_path / "o").exists()  # an overridden kernel was never measured: nothing to check
