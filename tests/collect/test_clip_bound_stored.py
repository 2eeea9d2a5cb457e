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
