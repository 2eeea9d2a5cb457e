"""dp_sgd_averaged (Li et al. 2022, Algorithm 1) against a direct transcription of the algorithm."""

from __future__ import annotations

import pytest
import torch

from gradspec.optim import dp_sgd_averaged
from gradspec.privacy import gaussian_noise


def _quadratic_problem(n: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n, d, generator=g, dtype=torch.float64)

    def grad_fn(x, idx):  # f_i(x) = 1/2 ||x - c_i||^2 -> gradient x - c_i (clipped at G by the algorithm)
        return x[:, None, :] - centres[idx][None]

    return centres, grad_fn


def _reference(centres, *, x0, steps, lr, sigma, alpha, clip, batch_size, seed):
    """Algorithm 1 written out for one configuration, drawing the same indices and noise."""
    n, d = centres.shape
    index_gen = torch.Generator().manual_seed(seed)
    noise_gen = torch.Generator().manual_seed(seed + 1)
    x = x0.clone().double()
    iterates = []
    for _ in range(steps):
        if batch_size == 1:
            idx = torch.randint(n, (1,), generator=index_gen)
        else:
            idx = torch.randperm(n, generator=index_gen)[:batch_size]
        g = torch.zeros(d, dtype=torch.float64)
        for i in idx.tolist():
            gi = x - centres[i]
            g += gi * min(1.0, clip / float(gi.norm()))
        g /= batch_size
        zeta = gaussian_noise((d,), 1.0, generator=noise_gen, dtype=torch.float64)
        step = g + alpha * (x - x0) + clip * sigma * zeta / batch_size
        x = x - lr * step
        iterates.append(x)
    return torch.stack(iterates).mean(0), x


@pytest.mark.parametrize("batch_size", [1, 3])
def test_matches_a_direct_transcription_of_algorithm_1(batch_size):
    n, d, steps = 12, 5, 40
    centres, grad_fn = _quadratic_problem(n, d)
    x0 = torch.linspace(-1, 1, d, dtype=torch.float64)
    lrs, sigmas, alphas = [0.05, 0.2, 0.1], [0.0, 1.3, 0.7], [0.0, 0.5, 2.0]
    res = dp_sgd_averaged(grad_fn=grad_fn, x0=x0, n=n, steps=steps, lr=torch.tensor(lrs, dtype=torch.float64),
                          noise_multiplier=torch.tensor(sigmas, dtype=torch.float64), alpha=torch.tensor(alphas, dtype=torch.float64), clip=0.8,
                          batch_size=batch_size, seed=7)
    assert res.average.shape == (3, d) and res.last.shape == (3, d)
    for i in range(3):
        avg, last = _reference(centres, x0=x0, steps=steps, lr=lrs[i], sigma=sigmas[i], alpha=alphas[i],
                               clip=0.8, batch_size=batch_size, seed=7)
        torch.testing.assert_close(res.average[i], avg, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(res.last[i], last, rtol=1e-12, atol=1e-12)


def test_noise_has_the_stated_variance():
    # zero gradients, no ridge: x_T = -lr * (G sigma / B) * sum_t zeta_t, so Var = T (lr G sigma / B)^2
    d, steps, lr, sigma, clip, b = 20_000, 50, 0.1, 1.5, 2.0, 2
    res = dp_sgd_averaged(grad_fn=lambda x, idx: torch.zeros(x.shape[0], idx.numel(), x.shape[1],
                                                            dtype=torch.float64),
                          x0=torch.zeros(d), n=10, steps=steps, lr=lr, noise_multiplier=sigma, clip=clip,
                          batch_size=b, seed=0)
    var = float(res.last.var())
    expected = steps * (lr * clip * sigma / b) ** 2
    assert abs(var / expected - 1) < 0.05  # 20,000 coordinates: s.e. of the ratio ~ 1%
    # the average of a random walk: Var = (lr G sigma / B)^2 * sum_k (k/T)^2 ~ T/3 (...)^2
    expected_avg = (lr * clip * sigma / b) ** 2 * sum((k / steps) ** 2 for k in range(1, steps + 1))
    assert abs(float(res.average.var()) / expected_avg - 1) < 0.05


def test_clips_per_example_gradients_at_g():
    d = 4
    big = torch.tensor([3.0, 4.0, 0.0, 0.0], dtype=torch.float64)  # norm 5
    res = dp_sgd_averaged(grad_fn=lambda x, idx: big.expand(x.shape[0], 1, d).clone(), x0=torch.zeros(d), n=3,
                          steps=1, lr=1.0, noise_multiplier=0.0, clip=0.5, seed=0)
    torch.testing.assert_close(res.last[0], -0.5 * big / 5)


def test_bad_inputs_say_what_to_do():
    _, grad_fn = _quadratic_problem(4, 2)
    with pytest.raises(ValueError, match="batch_size"):
        dp_sgd_averaged(grad_fn=grad_fn, x0=torch.zeros(2), n=4, steps=1, lr=0.1, noise_multiplier=1.0,
                        clip=1.0, batch_size=5)
    with pytest.raises(ValueError, match="one entry per configuration"):
        dp_sgd_averaged(grad_fn=grad_fn, x0=torch.zeros(2), n=4, steps=1, lr=torch.tensor([0.1, 0.2], dtype=torch.float64),
                        noise_multiplier=torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64), clip=1.0)
    with pytest.raises(ValueError, match="float64"):
        dp_sgd_averaged(grad_fn=grad_fn, x0=torch.zeros(2), n=4, steps=1, lr=0.1,
                        noise_multiplier=torch.tensor([1.2495]), clip=1.0)
    with pytest.raises(ValueError, match="lr must be finite"):
        dp_sgd_averaged(grad_fn=grad_fn, x0=torch.zeros(2), n=4, steps=1, lr=-1.0, noise_multiplier=1.0, clip=1.0)
