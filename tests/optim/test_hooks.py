"""Each optimizer's step pieces against a dense float64 reference (p x p matrices in the test)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradspec.optim import (
    PDPSGD,
    AdaDPS,
    DPAdam,
    FixedProjector,
    NoisyAdaGrad,
    RandomProjector,
    SubspaceRetrain,
)
from gradspec.privacy import gaussian_noise

from ._cases import fake_run, orthonormal

P, K = 12, 4


def test_subspace_projects_the_clipped_sum_before_noise():
    v = orthonormal(P, K)
    hooks = SubspaceRetrain(FixedProjector(v))
    hooks.setup(fake_run(P))
    total = torch.randn(P)
    expected = (v @ v.T) @ total.double()
    torch.testing.assert_close(hooks.before_noise(total).double(), expected, rtol=1e-5, atol=1e-6)
    # full noise: exactly DP-SGD's draw
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    torch.testing.assert_close(hooks.noise(P, 2.0, g1, torch.device("cpu")),
                               gaussian_noise((P,), 2.0, generator=g2))


def test_subspace_noise_lies_in_the_subspace_with_the_right_scale():
    v = orthonormal(P, K)
    hooks = SubspaceRetrain(FixedProjector(v), noise="subspace")
    hooks.setup(fake_run(P))
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([hooks.noise(P, 3.0, g, torch.device("cpu")) for _ in range(4000)]).double()
    outside = draws - draws @ v @ v.T
    assert outside.abs().max() < 1e-5
    # E||b||^2 = k std^2; the mean of 4000 chi^2_k/k has relative sd sqrt(2/(k*4000)) = 1.1%
    ratio = draws.square().sum(1).mean().item() / (K * 9.0)
    assert abs(ratio - 1) < 0.06  # > 5 standard errors


def test_pdp_projects_the_noisy_gradient_after_start():
    v = orthonormal(P, K)
    run = fake_run(P, q=0.25)  # 4 steps per epoch
    hooks = PDPSGD(FixedProjector(v), start_epoch=1.0)
    hooks.setup(run)
    g = torch.randn(P)
    hooks.on_step_start(3, run)
    torch.testing.assert_close(hooks.after_noise(g), g)  # plain DP-SGD before the start epoch
    hooks.on_step_start(4, run)
    torch.testing.assert_close(hooks.after_noise(g).double(), (v @ v.T) @ g.double(),
                               rtol=1e-5, atol=1e-6)


def test_pdp_shrinks_the_noise_norm_by_sqrt_k_over_p():
    """E||V V^T b||^2 / E||b||^2 = k/p exactly for isotropic b.

    Tolerance: ||Pb||^2/||b||^2 ~ Beta(k/2, (p-k)/2) has sd sqrt((k/p)(1-k/p)/(p/2+1));
    over N draws the mean's sd is that / sqrt(N); we allow 5 of those (seeded, so
    deterministic; a fresh seed would fail with probability < 1e-6).
    """
    p, k, n = 400, 20, 300
    run = fake_run(p)
    hooks = PDPSGD(RandomProjector(k, seed=1))
    hooks.setup(run)
    hooks.on_step_start(0, run)
    gen = torch.Generator().manual_seed(0)
    ratios, noise_sq, proj_sq = [], [], []
    for _ in range(n):
        b = hooks.noise(p, 1.5, gen, torch.device("cpu"))
        pb = hooks.after_noise(b)
        ratios.append((pb.square().sum() / b.square().sum()).item())
        noise_sq.append(b.square().sum().item())
        proj_sq.append(pb.square().sum().item())
    frac = k / p
    se = math.sqrt(frac * (1 - frac) / (p / 2 + 1)) / math.sqrt(n)
    assert abs(np.mean(ratios) - frac) < 5 * se
    shrink = math.sqrt(np.mean(proj_sq) / np.mean(noise_sq))
    assert shrink == pytest.approx(math.sqrt(frac), rel=0.05)


def _adagrad_reference(totals, grads, v, z_b, denom, clip, seed, diagonal=False, rcond=1e-7):
    """Dense p x p noisy AdaGrad (Kairouz et al. Alg. 1): the directions, float64."""
    p, k = v.shape
    proj = v @ v.T
    s = torch.zeros(p, p, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t, (total, g) in enumerate(zip(totals, grads, strict=True), start=1):
        nabla = proj @ (total.double() / denom)
        s += torch.outer(nabla, nabla)
        # Delta_t = L sqrt(t)/n (diagonal) or sqrt(2) L sqrt(t)/n (full matrix); sigma_B = z_B Delta_t / sqrt(2)
        sigma_b = z_b * clip * math.sqrt(t) / denom / (math.sqrt(2) if diagonal else 1.0)
        if diagonal:
            sd = torch.diagonal(v.T @ s @ v)
            h = sd.sqrt()
            if sigma_b > 0:
                h = h + gaussian_noise((k,), math.sqrt(2) * sigma_b, generator=gen).double()
                h = h.clamp(min=2 * math.sqrt(2) * sigma_b)
            out.append(v @ ((v.T @ g.double()) / h))
            continue
        w, q = torch.linalg.eigh(s)
        root = (q * w.clamp(min=0).sqrt()) @ q.T  # G_t = S_t^(1/2), p x p
        noise = torch.zeros(p, p, dtype=torch.float64)
        if sigma_b > 0:
            a = gaussian_noise((k, k), 1.0, generator=gen).double()
            noise = v @ (sigma_b * (a + a.T) / math.sqrt(2)) @ v.T  # GOE in the subspace
        h = proj @ (root + noise) @ proj  # Pi (G + B), p x p
        lam, u = torch.linalg.eigh((h + h.T) / 2)
        if sigma_b > 0:
            inside = (v.T @ u).square().sum(0) > 0.5  # the k eigenvectors in span(V)
            lam, u = lam[inside].clamp(min=2 * math.sqrt(k) * sigma_b), u[:, inside]
            out.append(u @ ((u.T @ g.double()) / lam))
        else:
            out.append(torch.linalg.pinv(h, rtol=rcond, hermitian=True) @ g.double())
    return out


@pytest.mark.parametrize("diagonal", [False, True], ids=["full-matrix", "diagonal"])
@pytest.mark.parametrize("z_b", [0.0, 2.0], ids=["no-precond-noise", "precond-noise"])
def test_noisy_adagrad_matches_dense_reference(diagonal, z_b):
    v = orthonormal(P, K, seed=2)
    sigma = 1.0 if z_b > 0 else 0.0
    run = fake_run(P, sigma=sigma, q=0.25, n=40, clip=0.7)
    hooks = NoisyAdaGrad(FixedProjector(v), precond_noise_multiplier=z_b, diagonal=diagonal, seed=5)
    hooks.setup(run)
    gen = torch.Generator().manual_seed(9)
    totals = [torch.randn(P, generator=gen) for _ in range(5)]
    grads = [torch.randn(P, generator=gen) for _ in range(5)]
    got = []
    for step, (total, g) in enumerate(zip(totals, grads, strict=True)):
        hooks.on_step_start(step, run)
        hooks.precondition(torch.zeros(8, P))  # 8 examples drawn (the denominator when sigma = 0)
        hooks.before_noise(total)
        got.append(hooks.direction(g).double())
    denom = 0.25 * 40 if sigma > 0 else 8
    ref = _adagrad_reference(totals, grads, v, z_b, denom, 0.7, 5, diagonal=diagonal)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=1e-5)


def test_noisy_adagrad_with_k_equal_p_and_no_noise_is_full_matrix_adagrad():
    run = fake_run(P, sigma=0.0)
    hooks = NoisyAdaGrad(FixedProjector(torch.eye(P, dtype=torch.float64)), precond_noise_multiplier=0)
    hooks.setup(run)
    s = torch.zeros(P, P, dtype=torch.float64)
    for step in range(2 * P):
        grad = torch.randn(P)
        hooks.on_step_start(step, run)
        hooks.precondition(torch.zeros(1, P))
        hooks.before_noise(grad)
        s += torch.outer(grad.double(), grad.double())
        w, q = torch.linalg.eigh(s)
        root = (q * w.clamp(min=0).sqrt()) @ q.T
        expected = torch.linalg.pinv(root, rtol=1e-7, hermitian=True) @ grad.double()
        torch.testing.assert_close(hooks.direction(grad).double(), expected, rtol=1e-4, atol=1e-5)


def test_noisy_adagrad_rotates_its_preconditioner_when_the_subspace_changes():
    run = fake_run(P, sigma=0.0)
    v, w = orthonormal(P, K), orthonormal(P, K, seed=7)
    proj = FixedProjector(v)
    hooks = NoisyAdaGrad(proj, precond_noise_multiplier=0)
    hooks.setup(run)
    hooks.on_step_start(0, run)
    hooks.before_noise(torch.randn(P))
    r = (w.T @ v).double()
    expected = r @ hooks.S @ r.T  # S expressed in the new basis: V_new^T V_old S V_old^T V_new
    proj.update = lambda step, run: setattr(proj, "_basis", w.float()) or True  # a new oracle answer
    hooks.on_step_start(1, run)
    torch.testing.assert_close(hooks.S, expected, rtol=1e-5, atol=1e-7)


def test_adadps_divides_per_example_gradients_before_clipping():
    side = torch.rand(P) + 0.5
    run = fake_run(P)
    hooks = AdaDPS(rule="fixed", side_information=side)
    hooks.setup(run)
    grads = torch.randn(5, P)
    torch.testing.assert_close(hooks.precondition(grads), grads / side)


def test_dp_adam_direction_is_torch_adam():
    p = torch.zeros(P, requires_grad=True)
    ref = torch.optim.Adam([p], lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    theta = torch.zeros(P)
    hooks = DPAdam(betas=(0.8, 0.99), eps=1e-6)
    hooks.setup(fake_run(P))
    for _ in range(6):
        g = torch.randn(P)
        p.grad = g.clone()
        ref.step()
        theta -= 0.01 * hooks.direction(g)
    torch.testing.assert_close(theta, p.detach(), rtol=1e-5, atol=1e-7)


def test_own_direction_hooks_refuse_an_adaptive_outer_optimizer():
    with pytest.raises(ValueError, match="optimizer='sgd'"):
        DPAdam().setup(fake_run(P, optimizer="adam"))


def test_private_noisy_adagrad_needs_preconditioner_noise():
    with pytest.raises(ValueError, match="precond_noise_multiplier > 0"):
        NoisyAdaGrad(FixedProjector(orthonormal(P, K)), precond_noise_multiplier=0).setup(fake_run(P))
