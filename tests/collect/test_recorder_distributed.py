"""The recorder inside a user's own distributed loop: 2 gloo processes on the CPU (a DDP loop,
an Opacus DPDDP loop, a Hugging Face Trainer), against the same loop in one process.

Rank 0 writes the one store; rank 1 opens nothing in the run directory for writing (it would
fail: ``_forbid_writing``). Rows of a DDP loop are DDP's average of the ranks' mean
gradients; with equal shares that is the global batch's mean gradient, equal to the
one-process row to float32 rounding of the other summation order (``atol = 1e-6``,
``rtol = 1e-5``, as in tests/train/test_distributed.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gradspec.collect import GradientRecorder
from gradspec.store import GradientStore

from ..train._ranks import run_ranks
from ..train.test_distributed import ROWS, _forbid_writing, _ok
from ._tiny import Tiny, tiny_task

STEPS, BATCH = 4, 16


def _loop(out: Path, rank: int, world: int, **options) -> dict:
    """A plain loop over fixed global batches of 16; each rank takes the examples rank::world
    (``options``: the recorder's, e.g. a sketch)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model: torch.nn.Module = Tiny()
    if world > 1:
        dist.init_process_group("gloo")
        if rank != 0:
            _forbid_writing(out)
        model = DistributedDataParallel(model)
    data = tiny_task().train
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with GradientRecorder(out=out, model=model, **options) as rec:
        for step in range(STEPS):
            idx = torch.arange(step * BATCH, (step + 1) * BATCH) % len(data)
            batch = data.batch(idx[rank::world])
            loss = torch.nn.functional.cross_entropy(model(batch["tokens"]), batch["labels"])
            opt.zero_grad()
            loss.backward()
            rec.record_step(loss=loss.item(), batch_size=len(batch["labels"]))
            opt.step()
    if world > 1:
        dist.destroy_process_group()
    result = {"store": rec.store is not None, "ranks": (rec.ranks.rank, rec.ranks.world_size)}
    return result if rec.plan is None else {**result, "plan": rec.plan.to_dict()}


def _ddp_rank(rank: int, out: Path) -> dict:
    return _loop(out, rank, 2)


def test_a_ddp_loop_records_one_store_on_rank_0_equal_to_one_process(tmp_path):
    lead, other = _ok(run_ranks(_ddp_rank, tmp_path / "ddp"))
    assert lead == {"store": True, "ranks": (0, 2)} and other == {"store": False, "ranks": (1, 2)}
    _loop(tmp_path / "one", 0, 1)
    two, one = GradientStore.open(tmp_path / "ddp" / "gradients.zarr"), GradientStore.open(tmp_path / "one" / "gradients.zarr")
    assert two.status == "complete" and two.n_rows == one.n_rows == STEPS
    # DDP's "module." prefix is not in the names: the layout is the one-process store's
    assert two.layout.to_list() == one.layout.to_list() and not two.layout.names[0].startswith("module.")
    np.testing.assert_allclose(two.read(), one.read(), **ROWS)
    a, b = one.row_meta(), two.row_meta()
    np.testing.assert_array_equal(b["batch_size"], np.full(STEPS, BATCH))  # the global batch, not 8
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)  # the ranks' losses weighted by their examples


# ---------------------------------------------------------------------- Opacus DPDDP
C = 0.5


def _dpddp_rank(rank: int, out: Path) -> dict:
    """Opacus DPDDP over fixed shards: rank r's batch of step s is examples 16 s + (r::2)."""
    import torch.distributed as dist
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

    dist.init_process_group("gloo")
    if rank != 0:
        _forbid_writing(out)
    torch.manual_seed(0)
    model = DPDDP(Tiny())
    data = tiny_task().train
    idx = torch.cat([torch.arange(s * BATCH, (s + 1) * BATCH)[rank::2] for s in range(STEPS)])
    shard = torch.utils.data.TensorDataset(data.batch(idx)["tokens"], data.batch(idx)["labels"])
    loader = torch.utils.data.DataLoader(shard, batch_size=BATCH // 2, shuffle=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader, noise_multiplier=1.0,
                                             max_grad_norm=C, poisson_sampling=False)
    with GradientRecorder(out=out, model=model) as rec:
        rec.attach_opacus(opt)
        for tokens, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(tokens), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()
    return {"names": rec.names, "store": rec.store is not None}


def _clipped_mean(model: torch.nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """The mean over the examples of each gradient clipped as Opacus clips it (C / (norm + 1e-6))."""
    rows = []
    for x, y in zip(tokens, labels, strict=True):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[None]), y[None]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        rows.append(g * min(1.0, C / (float(g.norm()) + 1e-6)))
    return torch.stack(rows).mean(0).numpy()


def test_an_opacus_dpddp_loop_records_the_global_clipped_mean(tmp_path):
    pytest.importorskip("opacus")
    lead, other = _ok(run_ranks(_dpddp_rank, tmp_path / "dp"))
    assert lead["store"] and not other["store"]
    store = GradientStore.open(tmp_path / "dp" / "gradients.zarr")
    torch.manual_seed(0)
    names = [n for n, _ in Tiny().named_parameters()]
    assert lead["names"] == names == store.layout.names  # neither GradSampleModule's nor DPDDP's prefix
    assert store.status == "complete" and store.n_rows == STEPS
    np.testing.assert_array_equal(store.row_meta()["batch_size"], np.full(STEPS, BATCH))
    # step 0: the clipped mean over all 16 examples of the global batch, at the initial weights, before noise
    torch.manual_seed(0)
    model = Tiny()  # the ranks' initial weights
    data = tiny_task().train.batch(torch.arange(BATCH))
    want = _clipped_mean(model, data["tokens"], data["labels"])
    np.testing.assert_allclose(store.read(slice(0, 1))[0], want, **ROWS)


# ---------------------------------------------------------------------- Hugging Face Trainer
def _hf_rank(rank: int, out: Path, tmp: Path) -> dict:
    """The Trainer finds torchrun's variables (set by run_ranks) and joins the gloo group itself."""
    from gradspec.collect import GradientRecorderCallback

    from .test_hf_adapter import train

    if rank != 0:
        _forbid_writing(out)
    callback = GradientRecorderCallback(out=out)
    train(tmp / f"rank{rank}", callback, steps=3, batch_size=2)
    return {"store": callback.recorder.store is not None}


@pytest.mark.slow
def test_a_hugging_face_trainer_under_two_ranks_records_one_store(tmp_path):
    """Each rank's callback builds a recorder: rank 1's opens nothing (no DirectoryBusyError), and
    rank 0's rows are the gradient the optimizer receives: at step 0 a one-process Trainer's with
    the global batch (2 x 2 = 4), times 2 — the Trainer multiplies the loss by the number of
    processes (average_tokens_across_devices) for a model that takes loss keywords, and BERT's
    classifier then ignores num_items_in_batch (DIVISOR_HF says so)."""
    pytest.importorskip("accelerate")
    from gradspec.collect import GradientRecorderCallback
    from gradspec.collect._hf import DIVISOR_HF

    from .test_hf_adapter import train

    lead, other = _ok(run_ranks(_hf_rank, tmp_path / "hf", tmp_path))
    assert lead["store"] and not other["store"]
    train(tmp_path / "one-trainer", GradientRecorderCallback(out=tmp_path / "one"), steps=3, batch_size=4)
    two, one = GradientStore.open(tmp_path / "hf" / "gradients.zarr"), GradientStore.open(tmp_path / "one" / "gradients.zarr")
    assert two.status == "complete" and two.layout.to_list() == one.layout.to_list()
    np.testing.assert_array_equal(two.row_meta()["batch_size"], one.row_meta()["batch_size"])
    # step 0 (the same weights; the doubled gradient then moves the two runs apart)
    np.testing.assert_allclose(two.read(slice(0, 1)), 2 * one.read(slice(0, 1)), **ROWS)
    assert two.config["row_divisor"] == DIVISOR_HF and "number of processes" in DIVISOR_HF


# ---------------------------------------------------------------------- without processes
def test_a_recorder_on_another_rank_opens_nothing_and_refuses_per_example_rows(tmp_path, monkeypatch):
    from gradspec.collect import _recorder_ranks
    from gradspec.train import Ranks

    with pytest.raises(ValueError, match="distributed=True needs an initialised"):
        GradientRecorder(out=tmp_path / "x", model=Tiny(), distributed=True)
    assert not (tmp_path / "x").exists()
    monkeypatch.setattr(_recorder_ranks, "current_ranks", lambda: Ranks(1, 2))
    rec = GradientRecorder(out=tmp_path / "r1", model=Tiny())
    assert rec.store is None and rec.rows_recorded == 0 and rec.rewind(0) == 0
    rec.update_config(note=1)
    rec.commit(wait=True)
    rec.close()
    assert not (tmp_path / "r1").exists()
    with pytest.raises(ValueError, match="per-example rows from 2 ranks into one store are not supported"):
        GradientRecorder(out=tmp_path / "r2", model=Tiny(), per_example=True)
    # distributed=False: every process records on its own, as before
    with GradientRecorder(out=tmp_path / "own", model=Tiny(), distributed=False) as own:
        assert own.store is not None and own.ranks == Ranks()
