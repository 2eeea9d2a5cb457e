import math

import pytest
import torch

from gradspec.tasks import (
    A_DIAGONALS,
    a_const,
    a_linear,
    a_sqrt,
    make_task,
    restricted_lipschitz_closed_form,
    restricted_lipschitz_coefficients,
)

from ._helpers import flat, vmap_grads


def test_diagonals_follow_the_paper():
    torch.testing.assert_close(a_const(3), torch.ones(3, dtype=torch.float64))
    torch.testing.assert_close(
        a_sqrt(4), torch.tensor([1, 2**-0.5, 3**-0.5, 0.5], dtype=torch.float64)
    )
    torch.testing.assert_close(
        a_linear(4), torch.tensor([1, 1 / 2, 1 / 3, 1 / 4], dtype=torch.float64)
    )
    assert set(A_DIAGONALS) == {"const", "sqrt", "linear"}


def test_closed_form_is_sorted_sqrt_of_the_diagonal():
    a = torch.tensor([0.25, 4.0, 1.0, 0.0], dtype=torch.float64)
    assert [restricted_lipschitz_closed_form(a, k) for k in range(6)] == [
        2.0,
        1.0,
        0.5,
        0.0,
        0.0,
        0.0,
    ]
    for make in A_DIAGONALS.values():
        diag = make(50)
        eig = torch.linalg.eigvalsh(torch.diag(diag).sqrt()).flip(0)  # dense reference, float64
        torch.testing.assert_close(restricted_lipschitz_coefficients(diag), eig, rtol=1e-12, atol=0)
        assert restricted_lipschitz_closed_form(diag, 9) == pytest.approx(eig[9].item(), rel=1e-12)
    with pytest.raises(ValueError):
        restricted_lipschitz_closed_form(a, -1)


def test_data_follow_appendix_a():
    task = make_task("geomedian", d=30, d_min=10, n_train=4000, n_eval=10, seed=0)
    points = task.train.tensors["points"]
    assert points.shape == (4000, 30) and task.eval.tensors["points"].shape == (10, 30)
    assert (points[:, 10:] == 0).all()
    assert (points[:, :10].mean(0) - 1).abs().max() < 0.1
    assert (points[:, :10].std(0) - 1).abs().max() < 0.1
    assert task.params == ("x",) and torch.equal(task.model.x, torch.zeros(30))
    with pytest.raises(ValueError, match="d_min"):
        make_task("geomedian", d=5, d_min=10)
    with pytest.raises(ValueError, match="choose one of"):
        make_task("geomedian", spectrum="cubic")


@pytest.mark.parametrize("spectrum", ["const", "sqrt", "linear"])
def test_gradients_obey_the_restricted_lipschitz_bounds(spectrum):
    d = 40
    task = make_task("geomedian", d=d, d_min=10, spectrum=spectrum, n_train=64, n_eval=4, seed=1)
    batch = task.train.batch(range(64))
    a = A_DIAGONALS[spectrum](d)
    with torch.no_grad():
        task.model.x.copy_(torch.randn(d, generator=torch.Generator().manual_seed(0)))
        values = task.loss(task.forward(task.model, batch), batch)
    diff = task.model.x.detach().double() - batch["points"].double()
    exact = (diff.square() * a).sum(1).sqrt()
    torch.testing.assert_close(values.double(), exact, rtol=1e-5, atol=1e-5)
    grads = flat(vmap_grads(task, batch)).double()
    torch.testing.assert_close(grads, a * diff / exact[:, None], rtol=1e-4, atol=1e-6)
    # A is diagonal with a non-increasing diagonal: Q_k keeps coordinates k..d-1
    for k in (0, 1, 5, 20, 39):
        bound = restricted_lipschitz_closed_form(a, k)
        assert grads[:, k:].norm(dim=1).max() <= bound * (1 + 1e-5)
    assert grads.norm(dim=1).max() > 0.5 * restricted_lipschitz_closed_form(a, 0)


def test_gradient_is_finite_at_a_data_point():
    task = make_task("geomedian", d=12, d_min=4, n_train=3, n_eval=1, seed=0)
    batch = task.train.batch(range(3))
    with torch.no_grad():
        task.model.x.copy_(batch["points"][1])
    grads = flat(vmap_grads(task, batch))
    assert torch.isfinite(grads).all() and grads[1].abs().max() == 0
    assert task.loss(task.forward(task.model, batch), batch)[1].item() == pytest.approx(1e-6)
    assert math.isfinite(task.config["lipschitz_g0"])
