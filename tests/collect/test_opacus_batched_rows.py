"""Per-example rows from Opacus go to the writer as whole blocks (issue 22): the stored rows and
their norms equal a row-by-row reference bit for bit; partial chunks are written at close; a
writer error surfaces as one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gradspec._norms import row_norms64
from gradspec.collect import GradientRecorder
from gradspec.collect._rows import example_rows_per_chunk
from gradspec.privacy import bound_rows_
from gradspec.store import GradientStore, WriterError

pytest.importorskip("opacus")
from opacus import PrivacyEngine  # noqa: E402
from opacus.utils.batch_memory_manager import BatchMemoryManager  # noqa: E402

C = 0.3  # most examples are clipped, so the clip and the bound re-check both act
N, D, K, B = 90, 12, 4, 10


def _private(batch: int = B, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, K)).to(dtype)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randn(N, D, generator=g) * 50).to(dtype), torch.randint(0, K, (N,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    return PrivacyEngine().make_private(module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=1.0,
                                        max_grad_norm=C, noise_generator=torch.Generator().manual_seed(2),
                                        poisson_sampling=False)


def _reference_rows(model, optimizer):
    """Each example's clipped row, pre-clip norm, Opacus clip factor and norm per parameter, one
    row at a time, as the per-row path formed them."""
    gs = [p.grad_sample for p in optimizer.params]
    per_param = torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in gs], dim=1)
    norms = per_param.norm(2, dim=1)
    factor = (C / (norms + 1e-6)).clamp(max=1.0)
    for i in range(len(norms)):
        row = torch.cat([(factor[i : i + 1, None] * g[i : i + 1].reshape(1, -1)) for g in gs], dim=1)
        yield row, norms[i : i + 1].double(), factor[i : i + 1].double(), per_param[i : i + 1].double()


def _run(tmp, *, batched: bool, steps: int, virtual: bool = False, dtype: torch.dtype = torch.float32,
         **kw) -> GradientStore:
    model, optimizer, loader = _private(batch=2 * B if virtual else B, dtype=dtype)
    rec = GradientRecorder(out=tmp, model=model, per_example=True, max_grad_norm=C, **kw)
    if batched:
        rec.attach_opacus(optimizer)
    done = 0
    with BatchMemoryManager(data_loader=loader, max_physical_batch_size=B, optimizer=optimizer) if virtual \
            else _Plain(loader) as batches:
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if not batched:  # the per-row path: one record_examples call per row
                for row, norm, factor, per_param in _reference_rows(model, optimizer):
                    rec.record_examples(grads=row, step=done, norms=norm, max_grad_norm=C, clip_factors=factor,
                                        param_norms=per_param)
            skipped = optimizer._check_skip_next_step(pop_next=False)
            optimizer.step()
            optimizer.zero_grad()
            done += not skipped
            if done == steps:
                break
    rec.close()
    return GradientStore.open(tmp / "gradients.zarr")


class _Plain:
    def __init__(self, loader):
        self.loader = loader

    def __enter__(self):
        return self.loader

    def __exit__(self, *exc):
        return False


def _arrays(store: GradientStore) -> dict[str, np.ndarray]:
    meta = store.row_meta()
    return {"rows": store.read(), "pre_clip_norm": store.row_norms(), "clip_factor": store.clip_factors(),
            "param_norms": store.param_norms(), **{k: meta[k] for k in ("step", "batch_size", "norm_max")}}


@pytest.mark.parametrize(("background", "dtype"), [(True, torch.float32), (False, torch.float32),
                                                   (True, torch.float64)], ids=["thread", "sync", "float64-model"])
def test_batched_rows_equal_the_per_row_path_bit_for_bit(tmp_path, background, dtype, monkeypatch):
    import importlib

    rows_module = importlib.import_module("gradspec.collect._rows")  # gradspec.collect is also a function

    ref = _arrays(_run(tmp_path / "ref", batched=False, steps=7, background=False, commit_every=1, dtype=dtype))
    bounded = []  # rows the batched path re-bounded: Opacus's clip rounded them above C

    def counting(rows, max_norm, **kw):
        norms = kw.get("norms")  # the batched path bounds its rows in place, given their norms
        bounded.append(len(rows) if norms is None else int((norms > max_norm).sum()))
        return bound_rows_(rows, max_norm, **kw)

    monkeypatch.setattr(rows_module, "bound_rows_", counting)
    new_store = _run(tmp_path / "new", batched=True, steps=7, background=background, dtype=dtype)
    if dtype == torch.float32:  # Opacus's float32 clip leaves some rows just above C
        assert sum(bounded) > 0
    new = _arrays(new_store)
    assert new["rows"].shape == (7 * B, new_store.p)
    # commit_every (32 steps) is never reached: every row is in one partial chunk, written at close
    assert new_store.chunks[0] == example_rows_per_chunk(new_store.p) > 7 * B
    assert new_store.status == "complete" and new_store.n_rows == 7 * B
    assert (new["clip_factor"] < 1).mean() > 0.5
    for name, want in ref.items():
        if name in ("batch_size", "norm_max"):  # the reference called record_examples per row
            continue
        np.testing.assert_array_equal(new[name], want, err_msg=name)


def test_virtual_steps_keep_norms_aligned_with_their_rows(tmp_path):
    """Two physical batches per step: each row's pre_clip_norm, clip_factor and param_norms are
    its own (the row's norm is c_i ||g_i||, the parameters' norms compose ||g_i||)."""
    store = _run(tmp_path / "v", batched=True, steps=3, virtual=True)
    got = _arrays(store)
    assert got["rows"].shape[0] == 3 * 2 * B
    np.testing.assert_array_equal(got["step"], np.repeat(np.arange(3), 2 * B))
    np.testing.assert_allclose(np.linalg.norm(got["param_norms"], axis=1), got["pre_clip_norm"], rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got["rows"].astype(np.float64), axis=1),
                               got["clip_factor"] * got["pre_clip_norm"], rtol=1e-5)
    assert (np.linalg.norm(got["rows"].astype(np.float64), axis=1) <= C).all()
    ref = _arrays(_run(tmp_path / "ref", batched=False, steps=6, background=False))  # same examples, in order
    np.testing.assert_array_equal(got["pre_clip_norm"][:B], ref["pre_clip_norm"][:B])


def test_a_failed_write_surfaces_as_one_line_and_committed_rows_stay(tmp_path, monkeypatch):
    model, optimizer, loader = _private()
    rec = GradientRecorder(out=tmp_path, model=model, per_example=True, max_grad_norm=C, commit_every=2,
                           commit_seconds=0)
    rec.attach_opacus(optimizer)
    real, calls = rec.store.write_rows, []

    def write_rows(start, rows, meta):
        calls.append(len(rows))
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        real(start, rows, meta)

    monkeypatch.setattr(rec.store, "write_rows", write_rows)
    with pytest.raises(WriterError) as err:
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        rec.close()
    message = str(err.value)
    assert "\n" not in message and "No space left on device" in message and f"{2 * B} rows were committed before it" in message
    rec.fail(err.value)
    assert GradientStore.open(tmp_path / "gradients.zarr").n_rows == 2 * B


def test_bound_rows_in_place_with_the_recorders_norms_equals_bound_rows_on_a_copy():
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(64, 3001, generator=g)
    norms = rows.double().norm(dim=1, keepdim=True)
    rows = (rows.double() * (C / norms)).float()  # clipped to C, float32 rounding: about half lie above C
    rows[::3] *= 0.5
    want = bound_rows_(rows.clone(), C)
    n = row_norms64(rows)
    assert (n > C).sum() > 5
    got = bound_rows_(rows, C, norms=n)
    assert torch.equal(got, want)
    assert (torch.linalg.vector_norm(got, dim=1, dtype=torch.float64) <= C).all()


@pytest.mark.parametrize(("p", "rows"), [(10, 2048), (5210, 1024), (115_210, 64), (262_144, 32), (10**7, 32)])
def test_per_example_row_chunks_hold_about_32_mib(p, rows):
    assert example_rows_per_chunk(p) == rows


def test_reused_row_blocks_never_change_rows_the_writer_has_not_copied(tmp_path, monkeypatch):
    """The per-example row blocks come back to a pool once the writer has copied them. With a
    writer slower than the steps, some blocks are reused and others are still queued when the
    next step forms its rows: every stored row must still equal the per-row reference."""
    import time

    from gradspec.collect import _opacus
    from gradspec.collect._rows import RowPool
    from gradspec.store import _writer

    ref = _arrays(_run(tmp_path / "ref", batched=False, steps=9, background=False, commit_every=1))
    take_rows, record = _writer.BackgroundWriter._take_rows, _opacus.OpacusRecording._record
    monkeypatch.setattr(_writer.BackgroundWriter, "_take_rows",
                        lambda self, rows, meta: (time.sleep(0.045), take_rows(self, rows, meta))[1])
    monkeypatch.setattr(_opacus.OpacusRecording, "_record", lambda self: (time.sleep(0.03), record(self))[1])
    reused = []
    take = RowPool.take

    def counting(self, b, p):
        free = {t.data_ptr() for t in self._free}
        block = take(self, b, p)
        reused.append(block.data_ptr() in free)
        return block

    monkeypatch.setattr(RowPool, "take", counting)
    new = _arrays(_run(tmp_path / "new", batched=True, steps=9, background=True))
    assert any(reused) and not all(reused[1:]), reused  # reuse happened while blocks were still queued
    for name in ("rows", "pre_clip_norm", "clip_factor", "param_norms", "step"):
        np.testing.assert_array_equal(new[name], ref[name], err_msg=name)
