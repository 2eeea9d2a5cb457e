"""AdaDPS Option 1 (Li et al. 2022, Alg. 1): the preconditioner A_t estimates sqrt(E[g^_t^2]).

With the parameters held fixed and the public mini-batch the whole public set, the public
gradient g^ is the same every step, so the paper's A_t = sqrt(E[(g^_t)^2]) + eps is |g^| + eps
at every t (Theorem 2's beta^t >= 1 - 1/t gives v_1 = g^_1^2; the authors' code divides by
the mean of g^^2 over public batches). An RMSProp average without bias correction was
sqrt(1 - beta2^t) |g^| instead: 0.03 |g^| at t = 1 for beta2 = 0.999.
"""

from __future__ import annotations

import pytest
import torch

from gradspec.optim import AdaDPS

from ._cases import LOWRANK, fake_run, lowrank_task

D = LOWRANK["d"]


def _public_mean_gradient(task, public) -> torch.Tensor:
    """The reference: float64 autograd on each public example as a batch of one, averaged."""
    w = task.model.weight.detach().double().clone().requires_grad_(True)
    grads = []
    for i in range(len(public)):
        x = public.tensors["inputs"][i].double()
        y = public.tensors["targets"][i].double()
        loss = 0.5 * (x @ w.flatten() - y) ** 2
        (g,) = torch.autograd.grad(loss, w)
        grads.append(g.flatten())
    return torch.stack(grads).mean(0)


@pytest.mark.parametrize("rule", ["rmsprop", "adam"])
def test_preconditioner_is_the_root_mean_square_of_public_gradients_from_step_one(rule):
    task = lowrank_task(n_public=20)
    with torch.no_grad():
        task.model.weight.copy_(torch.randn(1, D, generator=torch.Generator().manual_seed(3)))
    hooks = AdaDPS(rule=rule, public_size=20, public_batch=20, beta2=0.999, eps=1e-8, seed=1)
    run = fake_run(D, task=task)
    hooks.setup(run)
    ghat = _public_mean_gradient(task, hooks.public)
    for step in range(5):
        hooks.on_step_start(step, run)
        torch.testing.assert_close(hooks.A.double(), ghat.abs() + 1e-8, rtol=1e-5, atol=1e-7)
    grads = torch.randn(3, D)
    if rule == "rmsprop":
        torch.testing.assert_close(hooks.precondition(grads), grads / hooks.A)
    else:  # (beta g + (1 - beta) M_t) / A_t with beta = 1 - beta1 and M_t = g^ (bias-corrected)
        ref = (0.1 * grads.double() + 0.9 * ghat) / (ghat.abs() + 1e-8)
        torch.testing.assert_close(hooks.precondition(grads).double(), ref, rtol=1e-4, atol=1e-5)


def test_adagrad_accumulates_squares():
    task = lowrank_task(n_public=20)
    with torch.no_grad():
        task.model.weight.copy_(torch.randn(1, D, generator=torch.Generator().manual_seed(4)))
    hooks = AdaDPS(rule="adagrad", public_size=20, public_batch=20, eps=1e-8, seed=1)
    run = fake_run(D, task=task)
    hooks.setup(run)
    ghat = _public_mean_gradient(task, hooks.public)
    for step in range(4):
        hooks.on_step_start(step, run)
        torch.testing.assert_close(hooks.A.double(), (step + 1) ** 0.5 * ghat.abs() + 1e-8, rtol=1e-5, atol=1e-7)
