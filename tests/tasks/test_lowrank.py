import pytest
import torch

from gradspec.tasks import make_task, row_space_basis

from ._helpers import flat, vmap_grads


def numerical_rank(matrix: torch.Tensor, rtol: float = 1e-4) -> int:
    s = torch.linalg.svdvals(matrix.double())
    return int((s > rtol * s[0]).sum())


@pytest.mark.parametrize("kind", ["linear", "logistic"])
@pytest.mark.parametrize(("d", "r"), [(30, 1), (30, 4), (12, 12)])
def test_per_example_gradients_have_rank_r(kind, d, r):
    task = make_task("lowrank", kind=kind, n=60, n_eval=10, d=d, r=r, seed=2)
    assert numerical_rank(task.train.tensors["inputs"]) == r
    batch = task.train.batch(range(60))
    for weight in (
        torch.zeros(1, d),
        torch.randn(1, d, generator=torch.Generator().manual_seed(0)),
    ):
        with torch.no_grad():
            task.model.weight.copy_(weight)
        grads = flat(vmap_grads(task, batch)).double()
        assert grads.shape == (60, d)
        assert numerical_rank(grads) == r
        basis = row_space_basis(task)
        assert basis.shape == (d, r)
        torch.testing.assert_close(basis.T @ basis, torch.eye(r, dtype=torch.float64))
        residual = grads - grads @ basis @ basis.T
        assert residual.norm() <= 1e-5 * grads.norm()


def test_labels_come_from_the_planted_model():
    linear = make_task("lowrank", kind="linear", n=500, n_eval=50, d=20, r=3, noise=0.1, seed=0)
    targets = linear.train.tensors["targets"]
    assert targets.dtype == torch.float32 and 0.9 < targets.std() < 1.1
    x = linear.train.tensors["inputs"].double()
    w_hat = torch.linalg.lstsq(x, targets.double()[:, None]).solution
    assert (x @ w_hat).squeeze(1).sub(targets).std() < 0.12  # fits down to the noise
    logistic = make_task("lowrank", kind="logistic", n=500, n_eval=50, d=20, r=3, seed=0)
    labels = logistic.train.tensors["labels"]
    assert labels.dtype == torch.long and 0.3 < labels.float().mean() < 0.7
    assert "targets" not in logistic.train.tensors


def test_deterministic_and_validated():
    a = make_task("lowrank", n=10, n_eval=2, d=6, r=2, seed=5)
    b = make_task("lowrank", n=10, n_eval=2, d=6, r=2, seed=5)
    assert torch.equal(a.train.tensors["inputs"], b.train.tensors["inputs"])
    assert not torch.equal(
        a.train.tensors["inputs"],
        make_task("lowrank", n=10, d=6, r=2, seed=6).train.tensors["inputs"],
    )
    with pytest.raises(ValueError, match="r <= d"):
        make_task("lowrank", d=3, r=4)
    with pytest.raises(ValueError, match="choose one of"):
        make_task("lowrank", kind="poisson")
    with pytest.raises(ValueError, match="lowrank"):
        row_space_basis({"task": "cnn"})
