"""Each per-example row keeps its example's own pre-clip norm, clip factor and norms per
parameter (issue 22), from every source that records per-example rows: gradspec's trainer
(``vmap`` and ``hooks``; ``ghost`` forms no rows and records per-step rows only), Opacus, a
plain loop. Checked against a batch-of-one autograd loop on a real small model: the stored
norm is that loop's float64 norm of the unclipped gradient, the factor is min(1, C / norm),
and the stored row is factor x gradient in the store's dtype."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from gradspec.collect import GradientRecorder, collect, record_opacus
from gradspec.store import GradientStore

from ._tiny import tiny_task
from .test_collect import cfg

C = 1.6  # the tiny model's norms at its initial weights lie around 1.3..2: some rows are clipped, some not


def batch_of_one(task, index: int) -> tuple[torch.Tensor, list[float]]:
    """The unclipped gradient of one example (float64 copy of float32 autograd) and its norm per
    parameter, in ``named_parameters`` order (the store's layout)."""
    model = task.model
    params = list(model.parameters())
    batch = task.train.batch([index])
    loss = task.loss(task.forward(model, batch), batch).sum()
    grads = [g.double().reshape(-1) for g in torch.autograd.grad(loss, params)]
    return torch.cat(grads), [float(g.norm()) for g in grads]


def widen(rows: np.ndarray) -> np.ndarray:
    return rows.astype(np.float64)


@pytest.mark.parametrize("backend, dtype", [("vmap", "float32"), ("hooks", "float32"), ("vmap", "bfloat16")])
def test_the_trainer_keeps_each_examples_norm_and_clip_factor(tmp_path, backend, dtype):
    res = collect(cfg(mode="per-example", steps=1, max_grad_norm=C, backend=backend, dtype=dtype, sampling="shuffle"),
                  out=tmp_path / "r", task=tiny_task())
    store = GradientStore.open(res.store)
    rows, meta = widen(store.read()), store.row_meta()
    norms, factors, per_param = store.row_norms(), store.clip_factors(), store.param_norms()
    assert norms.dtype == factors.dtype == per_param.dtype == np.float64
    assert rows.shape[0] == norms.shape[0] == factors.shape[0] == per_param.shape[0] == 16
    assert per_param.shape[1] == len(store.layout.params)
    # min(1, C / norm), as torch divided (a scalar over a tensor may differ from numpy's in the last bit)
    np.testing.assert_allclose(factors, C / np.maximum(norms, C), rtol=4e-16, atol=0)
    assert (factors < 1).any() and (factors == 1).any()  # both kinds of row are checked
    # the step's statistics are those of the same norms
    assert meta["norm_max"][0] == np.float32(norms.max()) and meta["frac_clipped"][0] == np.float32((norms > C).mean())
    np.testing.assert_allclose(np.sqrt((per_param**2).sum(1)), norms, rtol=1e-10)

    task = tiny_task()  # same seed: the initial weights of the step
    u = {"float32": 2.0**-24, "bfloat16": 2.0**-8}[dtype]  # the store dtype's unit roundoff
    for i, example in enumerate(meta["example_index"]):
        g, want_param = batch_of_one(task, int(example))
        assert norms[i] == pytest.approx(float(g.norm()), rel=2e-5)
        np.testing.assert_allclose(per_param[i], want_param, rtol=2e-5, atol=1e-9)
        want = factors[i] * g.numpy()
        # A row that rounding to the store's dtype put above C is shrunk by a few u more
        # (gradspec.privacy.bound_rows_, margins u, 4u, ... a pass): the stored row is
        # s * c_i * g_i, 1 - 21 u <= s <= 1 in three passes, up to the rounding of its entries
        # (s is measured as a projection, within u of it).
        shrink = float(rows[i] @ want / (want @ want))
        assert 1 - 22 * u - 2e-5 <= shrink <= 1 + u + 2e-5, shrink
        # each entry rounded to the store's dtype, twice where the row was shrunk: <= 2 u
        np.testing.assert_allclose(rows[i], shrink * want, rtol=max(2e-5, 2 * u), atol=1e-7)
        assert np.linalg.norm(rows[i]) <= C


def test_a_resume_keeps_them_aligned_with_the_rows(tmp_path):
    """A run stopped at a checkpoint whose store has rows committed after it (a kill between the
    commit and the checkpoint): the resume truncates the norms with the rows and rewrites both
    as the uninterrupted run wrote them."""
    config = cfg(mode="per-example", steps=6, checkpoint_every=2, batch_size=8, max_grad_norm=C)
    full = collect(config, out=tmp_path / "full", task=tiny_task())
    part = collect(config, out=tmp_path / "part", task=tiny_task(), stop_after=3)
    store = GradientStore.open(part.store, mode="r+")
    kept = store.n_rows
    rows, meta = store.read(rows=slice(0, 4)), store.row_meta(slice(0, 4))
    meta["param_norms"] = 3 * store.param_norms(slice(0, 4))
    meta["pre_clip_norm"] = 3 * meta["pre_clip_norm"]
    store.append(rows, meta)  # committed rows past the checkpoint, with other norms
    assert store.n_rows == kept + 4
    done = collect(out=tmp_path / "part", task=tiny_task(), resume=True)
    a, b = GradientStore.open(full.store), GradientStore.open(done.store)
    assert a.n_rows == b.n_rows > kept
    np.testing.assert_array_equal(a.read(), b.read())
    np.testing.assert_array_equal(a.row_norms(), b.row_norms())
    np.testing.assert_array_equal(a.clip_factors(), b.clip_factors())
    np.testing.assert_array_equal(a.param_norms(), b.param_norms())
    np.testing.assert_array_equal(a.row_meta()["example_index"], b.row_meta()["example_index"])


def test_a_plain_loop_rows_given_clipped_with_their_norms_and_rows_given_unclipped(tmp_path):
    """``record_examples`` with clipped rows and their pre-clip ``norms`` (norms per parameter
    are the rows' over the factor), and with unclipped rows and nothing else (the recorder
    clips them: its factors and the rows' own norms are kept)."""
    task = tiny_task()
    grads = torch.stack([batch_of_one(task, i)[0] for i in range(6)])
    want = torch.stack([torch.tensor(batch_of_one(task, i)[1]) for i in range(6)]).numpy()
    norms = grads.norm(dim=1)
    factors = (C / norms.clamp(min=C))
    with GradientRecorder(out=tmp_path, model=task.model, per_example=True, max_grad_norm=C) as rec:
        rec.record_examples(grads=(grads * factors[:, None]).float(), norms=norms, step=0, loss=1.0)
        rec.record_examples(grads=grads.float(), step=1, loss=1.0)
    store = GradientStore.open(tmp_path / "gradients.zarr")
    np.testing.assert_allclose(store.row_norms(), np.concatenate([norms] * 2), rtol=1e-6)
    np.testing.assert_allclose(store.clip_factors(), np.concatenate([factors] * 2), rtol=1e-6)
    np.testing.assert_allclose(store.param_norms(), np.concatenate([want] * 2), rtol=1e-5, atol=1e-9)
    clipped = (grads * factors[:, None]).numpy()
    np.testing.assert_allclose(widen(store.read()), np.concatenate([clipped] * 2), rtol=1e-5, atol=1e-8)
    with GradientRecorder(out=tmp_path / "bad", model=task.model, per_example=True, max_grad_norm=C) as rec:
        with pytest.raises(ValueError, match="clip_factors of step 0"):
            rec.record_examples(grads=grads.float(), norms=norms, clip_factors=torch.full((6,), 2.0), step=0)
        with pytest.raises(ValueError, match="param_norms of step 0 have shape"):
            rec.record_examples(grads=grads.float(), param_norms=torch.ones(6, 2), step=0)
        assert rec.rows_recorded == 0


def test_opacus_rows_keep_the_factor_opacus_applied(tmp_path):
    pytest.importorskip("opacus")
    from .test_opacus_adapter import make_model, private, snapshot

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, (model, optimizer, loader) = private()
        refs = []
        with GradientRecorder(out=tmp_path, model=model, per_example=True) as recorder:
            record_opacus(optimizer, recorder=recorder)
            for step, (x, y) in enumerate(loader):
                if step == 2:
                    break
                ref = snapshot(model)
                for i in range(len(x)):
                    loss = nn.functional.cross_entropy(ref(x[i : i + 1]), y[i : i + 1])
                    refs.append([g.double().reshape(-1) for g in torch.autograd.grad(loss, list(ref.parameters()))])
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert store.n_rows == len(refs) > 0 and len(store.layout.params) == len(list(make_model().parameters()))
    grads = torch.stack([torch.cat(r) for r in refs])
    want_norms = grads.norm(dim=1).numpy()
    norms, factors = store.row_norms(), store.clip_factors()
    np.testing.assert_allclose(norms, want_norms, rtol=2e-5)  # Opacus's own (float32) norms
    c = float(optimizer.max_grad_norm)
    np.testing.assert_allclose(factors, np.minimum(1.0, c / (norms + 1e-6)), rtol=1e-6)  # Opacus's formula
    assert (factors < 1).any()
    np.testing.assert_allclose(store.param_norms(), [[float(g.norm()) for g in r] for r in refs], rtol=2e-5, atol=1e-9)
    np.testing.assert_allclose(widen(store.read()), factors[:, None] * grads.numpy(), rtol=2e-5, atol=1e-7)
