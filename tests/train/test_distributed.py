"""Collection under torch.distributed: 2 gloo processes on the CPU, as ``torchrun`` runs them,
against one process with the same global batches and seeds.

Tolerance of the rows: a distributed step sums each rank's clipped gradients (float32, in
its own order), then the ranks' sums (in float64, rounded to float32), where one process
sums the whole batch in float32 in one order; each clipped gradient has norm <= C = 1, so
the sums differ by float32 rounding, a few ulps of |sum| <= B (about 1e-6 at B <= 24), and
the parameters the next steps start from by as much. The rows (the sum over b) are compared
at ``atol = 1e-6``, ``rtol = 1e-5``; batches, steps, epsilon and noise multiplier exactly.
"""

from __future__ import annotations

import builtins
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from gradspec.collect import collect
from gradspec.store import GradientStore
from gradspec.train import RankLostError, Ranks, process_group

from ..collect._tiny import tiny_task
from ..collect.test_collect import cfg, metrics_without_time
from ._ranks import run_ranks

ROWS = {"atol": 1e-6, "rtol": 1e-5}


def _forbid_writing(out: Path) -> None:
    """Make this process fail on any attempt to write in the run directory ``out``."""
    from gradspec.store import RunLock

    def refuse(*args, **kwargs):
        raise AssertionError("a rank other than 0 tried to take the run lock or create the store")

    real_open, real_store_open = builtins.open, GradientStore.open

    def store_open(path, mode="r"):
        if mode != "r":
            raise AssertionError(f"a rank other than 0 opened the store with mode {mode!r}")
        return real_store_open(path, mode=mode)

    def file_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and str(Path(str(file)).resolve()).startswith(str(out.resolve())):
            raise AssertionError(f"a rank other than 0 opened {file} with mode {mode!r}")
        return real_open(file, mode, *args, **kwargs)

    RunLock.acquire = refuse
    GradientStore.create = refuse
    GradientStore.open = store_open
    builtins.open = file_open


def _collect(rank: int, out: Path, options: dict, stop_after: int | None = None, resume: bool = False) -> dict:
    if rank != 0:
        _forbid_writing(out)
    config = None if resume else cfg(**options)
    r = collect(config, out=out, task=tiny_task(), stop_after=stop_after, resume=resume)
    return {"rank": r.rank, "world_size": r.world_size, "rows": r.rows, "store": r.store, "steps": r.steps,
            "epsilon": r.epsilon, "noise_multiplier": r.noise_multiplier}


def _ok(results: list[tuple]) -> list[dict]:
    for rank, res in enumerate(results):
        assert res[0] == "ok", f"rank {rank}: {res}"
    return [res[1] for res in results]


def _assert_same_rows(one: GradientStore, two: GradientStore) -> None:
    a, b = one.row_meta(), two.row_meta()
    for key in ("step", "epoch", "batch_size"):
        np.testing.assert_array_equal(a[key], b[key])
    np.testing.assert_allclose(two.read(), one.read(), **ROWS)
    for key in ("loss", "norm_mean", "norm_max"):
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5)


@pytest.mark.parametrize(("backend", "batch"), [("ghost", 16), pytest.param("vmap", 1, marks=pytest.mark.slow)])
def test_two_ranks_write_one_store_equal_to_one_process(tmp_path, backend, batch):
    """Batch 1 (q = 1/64): empty steps, and steps where rank 1's share is empty."""
    options = {"backend": backend, "steps": 10, "batch_size": batch}
    out = tmp_path / "two"
    lead, other = _ok(run_ranks(_collect, out, options))
    single = collect(cfg(**options), out=tmp_path / "one", task=tiny_task())

    # rank 0 wrote the one store; rank 1 opened nothing in `out` for writing (it would have failed)
    assert (lead["rank"], lead["world_size"], other["rank"], other["world_size"]) == (0, 2, 1, 2)
    assert other["store"] is None and other["rows"] == 0 and lead["store"] == out / "gradients.zarr"
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())

    two, one = GradientStore.open(lead["store"]), GradientStore.open(single.store)
    assert two.status == "complete" and two.n_rows == one.n_rows == lead["rows"] > 0
    # the layout is the model's own (no DDP "module." prefix): the one-process store's
    assert two.layout.to_list() == one.layout.to_list()
    _assert_same_rows(one, two)
    # the recorded batch sizes are the global batch's (every rank drew the same Poisson batch)
    assert (two.row_meta()["batch_size"] > (batch + 1) // 2).any()  # more than one rank's share
    # privacy: the global batch's q and noise multiplier, one noise draw per step, the same epsilon
    for r in (lead, other):
        assert r["epsilon"] == single.epsilon and r["noise_multiplier"] == single.noise_multiplier
    assert two.config["final_epsilon"] == one.config["final_epsilon"]
    assert two.config["sample_rate"] == one.config["sample_rate"]
    assert two.config["world_size"] == 2 and "world_size" not in one.config
    steps = [m["step"] for m in metrics_without_time(out / "metrics.jsonl")]
    assert steps == [m["step"] for m in metrics_without_time(single.metrics)]


def test_two_ranks_per_example_rows_are_one_process_rows(tmp_path):
    """Per-example rows: each rank clips its share, rank 0 gathers them and stores the global
    batch in its order, as one process would."""
    options = {"mode": "per-example", "steps": 6, "backend": "vmap"}
    lead, _ = _ok(run_ranks(_collect, tmp_path / "two", options))
    single = collect(cfg(**options), out=tmp_path / "one", task=tiny_task())
    two, one = GradientStore.open(lead["store"]), GradientStore.open(single.store)
    assert two.per_example and two.status == "complete" and two.n_rows == one.n_rows > 6
    a, b = one.row_meta(), two.row_meta()
    for key in ("step", "example_index", "batch_size"):
        np.testing.assert_array_equal(b[key], a[key])
    np.testing.assert_allclose(two.read(), one.read(), **ROWS)
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
    for get in ("row_norms", "clip_factors", "param_norms"):
        np.testing.assert_allclose(getattr(two, get)(), getattr(one, get)(), rtol=1e-5)
    assert lead["epsilon"] == single.epsilon


@pytest.mark.slow
def test_a_rank_that_dies_stops_the_run_and_resume_continues_it(tmp_path):
    """Rank 1 exits at step 6: rank 0 stops with RankLostError, its store keeps the rows of the
    checkpoint at step 4 ('writing'); two ranks resume it, and it equals a one-process run."""
    out = tmp_path / "two"
    options = {"steps": 10, "checkpoint_every": 4}
    results = run_ranks(_collect_then_die, out, options)
    assert results[1] == ("exit", 3)
    kind, name, message, _ = results[0]
    assert (kind, name) == ("error", "RankLostError")
    assert "rank 0 of 2" in message and "another rank has stopped" in message and "--resume" in message
    killed = GradientStore.open(out / "gradients.zarr")
    assert killed.status == "writing" and killed.n_rows >= 4

    lead, _ = _ok(run_ranks(_collect, out, options, None, True))
    single = collect(cfg(**options), out=tmp_path / "one", task=tiny_task())
    done, one = GradientStore.open(lead["store"]), GradientStore.open(single.store)
    assert done.status == "complete" and done.n_rows == one.n_rows == 10
    _assert_same_rows(one, done)
    assert lead["epsilon"] == single.epsilon


def _collect_then_die(rank: int, out: Path, options: dict) -> dict:
    if rank == 1:
        from gradspec.train import _run

        real = _run._Run.train_step

        def dying(self, store_row):
            if self.step == 6:
                os._exit(3)
            return real(self, store_row)

        _run._Run.train_step = dying
    return _collect(rank, out, options)


def test_two_ranks_stop_and_resume_as_one_uninterrupted_run(tmp_path):
    """A distributed run stopped after 5 steps and resumed (in the same processes) equals the
    uninterrupted distributed run bitwise: the same ranks sum in the same order."""
    options = {"steps": 10, "checkpoint_every": 3}
    a, b = tmp_path / "full", tmp_path / "part"
    _ok(run_ranks(_stop_then_resume, a, b, options))
    full, part = GradientStore.open(a / "gradients.zarr"), GradientStore.open(b / "gradients.zarr")
    assert part.status == "complete" and part.n_rows == full.n_rows == 10
    np.testing.assert_array_equal(full.read(), part.read())
    assert metrics_without_time(a / "metrics.jsonl") == metrics_without_time(b / "metrics.jsonl")


def _stop_then_resume(rank: int, full: Path, part: Path, options: dict) -> None:
    _collect(rank, full, options)
    assert _collect(rank, part, options, stop_after=5)["steps"] == 5
    assert _collect(rank, part, options, resume=True)["steps"] == 10


def test_ranks_with_different_data_are_refused(tmp_path):
    results = run_ranks(_collect_other_data, tmp_path / "run")
    for res in results:
        assert res[:2] == ("error", "ValueError"), res
        assert "first_examples" in res[2] and "same settings, task and data" in res[2]


def _collect_other_data(rank: int, out: Path) -> None:
    collect(cfg(steps=2), out=out, task=tiny_task(seed=rank))


def test_a_setup_error_on_rank_0_stops_every_rank_with_it(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mine.txt").write_text("not a run")
    results = run_ranks(_collect, tmp_path / "run", {"steps": 2})
    for res in results:
        assert res[:2] == ("error", "FileExistsError"), res
    assert "setting up the run failed on rank 0 of 2" in results[1][3]  # the note on rank 1's copy
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["mine.txt"]


# ---------------------------------------------------------------------- one process
def test_one_process_is_unchanged(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with process_group() as ranks:
        assert ranks == Ranks() and not ranks.active and ranks.is_writer
        assert not torch.distributed.is_initialized()
    x = torch.arange(7.0)
    assert ranks.shard(x) is x and ranks.sum_(x) is x
    c = x[:, None]
    assert ranks.gather_examples(c, 7) is c
    assert ranks.agree(None, what="x", payload=3) == [3]
    with pytest.raises(KeyError):
        ranks.agree(KeyError("k"), what="x")
    ranks.check_same({"a": 1}, what="x")


def test_optimizer_hooks_are_refused_on_several_ranks(tmp_path):
    from gradspec.optim import DPAdam
    from gradspec.train._run import _Run

    with pytest.raises(ValueError, match="retrain in one process"):
        _Run(cfg(), tiny_task(), tmp_path, False, DPAdam(), ranks=Ranks(1, 2))


def test_rank_lost_is_a_connection_error():
    assert issubclass(RankLostError, ConnectionError)
