"""The ball-constrained GLM task (Kairouz et al. 2021 setting) and its float64 optimum."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from gradspec.optim import RandomProjector
from gradspec.tasks import ball_basis, ball_optimum, logistic_risk, make_task

from ._helpers import flat, vmap_grads


def test_data_are_unit_norm_rank_r_and_gradients_stay_in_the_span_with_norm_below_one():
    task = make_task("ballglm", n=80, n_eval=20, n_public=30, d=40, r=3, seed=1)
    x = task.train.tensors["inputs"].double()
    torch.testing.assert_close(x.norm(dim=1), torch.ones(80, dtype=torch.float64), atol=1e-6, rtol=0)
    basis = ball_basis(task)
    torch.testing.assert_close(basis.T @ basis, torch.eye(3, dtype=torch.float64))
    assert (x - x @ basis @ basis.T).norm() < 1e-5 * x.norm()
    with torch.no_grad():
        task.model.weight.copy_(torch.randn(1, 40, generator=torch.Generator().manual_seed(3)))
    grads = flat(vmap_grads(task, task.train.batch(range(80)))).double()
    assert (grads - grads @ basis @ basis.T).norm() < 1e-5 * grads.norm()
    assert grads.norm(dim=1).max() < 1.0  # 1-Lipschitz: clipping at C = 1 never acts
    # the loss the trainer optimises is the one logistic_risk measures
    out = task.forward(task.model, task.train.batch(range(80)))
    assert abs(float(task.loss(out, task.train.batch(range(80))).detach().double().mean())
               - logistic_risk(task.model.weight.detach().reshape(-1), task.train)) < 1e-5


def test_random_projector_at_the_task_seed_is_not_the_data_span():
    # regression: the task once drew B exactly as RandomProjector draws its basis
    for seed in (0, 1, 5):
        task = make_task("ballglm", n=10, n_eval=5, n_public=0, d=50, r=4, seed=seed)
        p = RandomProjector(4, seed=seed)
        g = torch.randn(50, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        p._basis = torch.linalg.qr(g)[0]  # what RandomProjector.setup draws
        cosines = torch.linalg.svdvals(ball_basis(task).T @ p._basis)
        assert cosines.max() < 0.9


def _reference(task, radius):
    """SLSQP on the full d-dimensional problem with the norm constraint (independent path)."""
    x = task.train.tensors["inputs"].double().numpy()
    s = 2.0 * task.train.tensors["labels"].double().numpy() - 1.0

    def f(t):
        return np.logaddexp(0.0, -s * (x @ t)).mean()

    def g(t):
        return -(x.T @ (s / (1.0 + np.exp(s * (x @ t))))) / len(s)

    cons = {"type": "ineq", "fun": lambda t: radius**2 - t @ t, "jac": lambda t: -2 * t}
    res = minimize(f, np.zeros(x.shape[1]), jac=g, constraints=[cons], method="SLSQP",
                   options={"ftol": 1e-15, "maxiter": 1000})
    return res.fun, res.x


@pytest.mark.parametrize("radius", [0.3, 2.0, 50.0])
def test_ball_optimum_matches_an_independent_solver_and_certifies_itself(radius):
    task = make_task("ballglm", n=200, n_eval=10, n_public=0, d=12, r=3, margin=1.0, seed=4)
    opt = ball_optimum(task.train, radius)
    ref_value, ref_theta = _reference(task, radius)
    assert opt.risk <= ref_value + 1e-9
    assert abs(opt.risk - ref_value) < 1e-7
    assert float(opt.theta.norm()) <= radius * (1 + 1e-9)
    assert opt.gap < 1e-9 and opt.kkt_residual < 1e-8
    b = ball_basis(task).numpy()
    # the loss sees only the in-span part; out of the span the reference may wander freely
    np.testing.assert_allclose(opt.theta.numpy(), b @ (b.T @ ref_theta), atol=1e-4)
    assert abs(opt.risk - logistic_risk(opt.theta, task.train)) < 1e-12
    if radius == 50.0:  # margin 1, n = 200: the unconstrained minimiser lies inside
        assert opt.multiplier == 0.0 and float(opt.theta.norm()) < 50.0
    elif radius == 0.3:
        assert opt.multiplier > 0 and abs(float(opt.theta.norm()) - radius) < 1e-9
    # the basis given or estimated gives the same answer
    same = ball_optimum(task.train, radius, basis=ball_basis(task))
    assert abs(same.risk - opt.risk) < 1e-12


def test_separable_data_have_an_active_constraint():
    task = make_task("ballglm", n=30, n_eval=5, n_public=0, d=8, r=1, margin=50.0, seed=0)
    s = 2.0 * task.train.tensors["labels"].double() - 1.0
    b = ball_basis(task)[:, 0]
    margins = s * (task.train.tensors["inputs"].double() @ b)
    if not ((margins > 0).all() or (margins < 0).all()):
        pytest.skip("this draw is not separable")
    opt = ball_optimum(task.train, 5.0)
    assert opt.multiplier > 0 and abs(float(opt.theta.norm()) - 5.0) < 1e-9 and opt.gap < 1e-9


@pytest.mark.parametrize(("options", "match"), [
    (dict(d=3, r=4), "1 <= r <= d"), (dict(n=0), "positive"), (dict(margin=-1.0), "margin"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        make_task("ballglm", **options)


def test_bad_radius_and_wrong_task_are_refused():
    task = make_task("ballglm", n=10, n_eval=5, d=6, r=2)
    with pytest.raises(ValueError, match="radius"):
        ball_optimum(task.train, 0.0)
    with pytest.raises(ValueError, match="ballglm"):
        ball_basis(make_task("lowrank", n=10, n_eval=2, d=6, r=2))
