"""Stored clipped per-example rows never exceed C, in every store dtype and through every
path that reaches the recorder (plain loop, Opacus, HF, gradspec's trainer all hand it rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec.collect import GradientRecorder
from gradspec.store import GradientStore, ParamLayout

C = 0.5


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rows_clipped_elsewhere_are_stored_at_most_C(tmp_path, dtype):
    """Rows a source clipped with float32 norms (here: norm C(1 + 1e-5), as Opacus/HF rows at
    p ~ 1M were) and rows far under C: the stored values' float64 norms are <= C, and rows
    under C are stored as the store's dtype would store them anyway."""
    p = 300_000
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(6, p, generator=g, dtype=torch.float64)
    rows = rows / rows.norm(dim=1, keepdim=True) * torch.tensor([C * (1 + 1e-5)] * 4 + [0.3 * C] * 2)[:, None]
    layout = ParamLayout.from_shapes([("w", (p,))])
    with GradientRecorder(out=tmp_path, layout=layout, per_example=True, max_grad_norm=C, dtype=dtype) as rec:
        rec.record_examples(grads=rows.float(), step=0)
    stored = GradientStore.open(tmp_path / "gradients.zarr").read().astype(np.float64)
    norms = np.linalg.norm(stored, axis=1)
    assert (norms <= C).all(), norms
    assert (norms[:4] >= C * (1 - 1e-2)).all()  # shrunk by rounding margins only
    np.testing.assert_allclose(norms[4:], 0.3 * C, rtol=1e-2)


@pytest.mark.parametrize("backend, dtype", [
    ("vmap", "bfloat16"),
    *(pytest.param(b, d, marks=pytest.mark.slow) for b, d in
      [("vmap", "float32"), ("vmap", "float16"), ("hooks", "float32"), ("hooks", "float16"),
       ("hooks", "bfloat16")]),
])
def test_the_trainers_per_example_rows_at_5M_parameters_never_exceed_C(tmp_path, backend, dtype):
    """gradspec's trainer, per-example mode, p = 5.05M: every stored row <= C, read back in float64."""
    from gradspec import CollectConfig, collect

    from ._tiny import Tiny, tiny_task

    task = tiny_task(n=16)
    torch.manual_seed(0)
    task.model = Tiny(d=2500, h=2000, c=3)  # fc1 alone: 5M weights
    config = CollectConfig(task="tiny", steps=2, batch_size=4, sampling="shuffle", noise_multiplier=1.0,
                           max_grad_norm=1e-3, lr=1e-3, optimizer="sgd", eval_every=0, log_every=1,
                           checkpoint_every=10, mode="per-example", backend=backend, dtype=dtype,
                           microbatch=4)
    collect(config, out=tmp_path, task=task)
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert store.p > 5_000_000 and store.n_rows == 8
    norms = np.linalg.norm(store.read().astype(np.float64), axis=1)
    assert (norms <= 1e-3).all() and (norms > 0.99e-3).all(), norms  # all clipped, none over C


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_16bit_store_records_what_rounding_the_clipped_rows_lost(tmp_path, dtype):
    """The store's precision record (dtype_stats) is of the real rounding: per row, ‖stored −
    given‖² and ‖given‖², checked here against the rows read back. Bounding the rounded rows
    under C costs no more than the rounding (it shrank every clipped 16-bit row by ~1.4u and
    tripled its error), and the writer is handed the 16-bit rows, not float32 copies."""
    import zarr

    p = 300_000
    g = torch.Generator().manual_seed(2)
    rows = torch.randn(6, p, generator=g, dtype=torch.float64)
    rows = (rows / rows.norm(dim=1, keepdim=True) * C).float()  # clipped in float64, rounded to float32
    layout = ParamLayout.from_shapes([("w", (p,))])
    handed = []
    with GradientRecorder(out=tmp_path, layout=layout, per_example=True, max_grad_norm=C, dtype=dtype) as rec:
        put = rec._writer.put
        rec._writer.put = lambda r, meta, **kw: (handed.append(np.asarray(r).dtype), put(r, meta, **kw))[-1]
        rec.record_examples(grads=rows, step=0)
    assert handed == [np.dtype("uint16" if dtype == "bfloat16" else "float16")]
    store = GradientStore.open(tmp_path / "gradients.zarr")
    stored = store.read().astype(np.float64)
    given = rows.double().numpy()
    assert (np.linalg.norm(stored, axis=1) <= C).all()
    err_sq = ((stored - given) ** 2).sum(1)
    stats = np.asarray(zarr.open_group(str(tmp_path / "gradients.zarr"))["dtype_stats"])
    np.testing.assert_allclose(stats[:, 3], err_sq, rtol=1e-5)  # (the store subtracts in float32)
    np.testing.assert_allclose(stats[:, 4], (given**2).sum(1), rtol=1e-6)
    cast = rows.to(getattr(torch, dtype)).double().numpy()  # what the cast alone loses
    plain = np.sqrt(((cast - given) ** 2).sum(1))
    assert (np.sqrt(err_sq) <= plain * 1.01).all(), (np.sqrt(err_sq) / plain)
    rep = store.dtype_report
    assert rep["rel_error"] == pytest.approx(np.sqrt(err_sq.sum() / stats[:, 4].sum()), rel=1e-5)
    assert rep["rel_error"] > 0.3 * 2.0 ** {"float16": -11, "bfloat16": -8}[dtype]  # it read 0 before
