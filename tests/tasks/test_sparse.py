"""The sparse linear regression of AdaDPS's Figure 3 (Li, Zaheer, Reddi, Smith 2022, §4.1)."""

from __future__ import annotations

import pytest
import torch

from gradspec.tasks import available_tasks, make_task, sparse_side_information


def test_generated_as_the_paper_specifies():
    task = make_task("sparselinear", seed=3, n=4000, n_eval=500, n_public=40)
    x = task.train.tensors["inputs"].double()
    assert task.config["n_frequent"] == 50 and x.shape == (4000, 500)
    assert set(x.unique().tolist()) == {0.0, 1.0}
    freq = x.mean(0)
    # P(x_j = 1) = 0.9 for the first 10%, 0.01 for the rest (binomial s.e. 0.005 and 0.0016)
    assert (freq[:50] - 0.9).abs().max() < 0.03
    assert (freq[50:] - 0.01).abs().max() < 0.012 and abs(freq[50:].mean() - 0.01) < 0.001
    # y = <w*, x> + N(0, 0.01^2) with w* = 0.01 / 1.0: least squares recovers w* and the noise level
    y = task.train.tensors["targets"].double()
    w_hat = torch.linalg.lstsq(x, y[:, None]).solution.squeeze(1)
    seen = x[:, 50:].sum(0) > 0
    assert (w_hat[50:][seen] - 1.0).abs().max() < 0.05
    assert (x @ w_hat - y).std() < 0.011
    # the model starts at w ~ N(0, 0.1^2), without bias
    w0 = task.model.weight.detach().flatten()
    assert task.model.bias is None and 0.08 < w0.std() < 0.12
    # splits: disjoint ids, same distribution
    assert len(task.eval) == 500 and len(task.public) == 40
    assert not set(task.public.ids.tolist()) & set(task.train.ids.tolist())


def test_paper_side_information_and_loss():
    task = make_task("sparselinear", seed=0, n=50, n_eval=10, d=40)
    a = sparse_side_information(task)
    assert a.shape == (40,) and torch.all(a[:4] == 1.0) and torch.all(a[4:] == 0.01)
    batch = task.train.batch(range(5))
    out = task.forward(task.model, batch)
    ref = 0.5 * (batch["inputs"] @ task.model.weight.detach().flatten() - batch["targets"]) ** 2
    torch.testing.assert_close(task.loss(out, batch), ref)
    with pytest.raises(ValueError, match="make_task\\('sparselinear'\\)"):
        sparse_side_information(make_task("lowrank", n=10, n_eval=2, d=6, r=2))


def test_deterministic_train_independent_of_public_and_validated():
    assert "sparselinear" in available_tasks()
    a = make_task("sparselinear", seed=1, n=30, n_eval=5, n_public=0, d=20)
    b = make_task("sparselinear", seed=1, n=30, n_eval=5, n_public=7, d=20)
    assert a.public is None and len(b.public) == 7
    assert torch.equal(a.train.tensors["inputs"], b.train.tensors["inputs"])
    assert torch.equal(a.eval.tensors["targets"], b.eval.tensors["targets"])
    with pytest.raises(ValueError, match="probability"):
        make_task("sparselinear", p_rare=1.5)
    with pytest.raises(ValueError, match="n_public >= 0"):
        make_task("sparselinear", n_public=-1)
