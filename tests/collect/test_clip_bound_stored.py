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
