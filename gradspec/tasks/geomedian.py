"""The generalised geometric median (Li et al. 2022, §4.1 and Appendix A).

Minimise ``F(x) = (1/n) sum_i ||x - x_i||_A`` over ``x`` in R^d, with the Mahalanobis
norm ``||v||_A = (v^T A v)^{1/2}`` and a diagonal ``A``, one of

    A_const  = diag(1, 1, ..., 1)
    A_sqrt   = diag(1, 1/sqrt(2), ..., 1/sqrt(d))
    A_linear = diag(1, 1/2, ..., 1/d).

Per-example gradients ``A (x - x_i) / ||x - x_i||_A`` span all of R^d, yet their
restricted Lipschitz coefficients are the eigenvalues of ``A^{1/2}``:
``G_k = lambda_{k+1}(A^{1/2})`` (Li et al., eq. after (12)), so they decay for A_sqrt
and A_linear and are constant for A_const.

Data (Appendix A): the first ``d_min = 10`` coordinates of each ``x_i`` are i.i.d.
normal with mean 1 and standard deviation 1; all others are 0, so the optimum, and the
distance to it from ``x = 0``, is the same for every ``d >= d_min``. The paper uses
``n_train = n_eval = 10000``. ``n_public`` public points (same distribution, drawn after
the others so the training and held-out points do not depend on it) serve the optimizers
that use public data; example ids: training ``0..n_train-1``, held-out next, public last.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from gradspec.tasks._base import Batch, Task, TensorData
from gradspec.tasks._registry import register_task

__all__ = [
    "A_DIAGONALS",
    "GeometricMedian",
    "a_const",
    "a_linear",
    "a_sqrt",
    "geomedian_task",
    "restricted_lipschitz_closed_form",
    "restricted_lipschitz_coefficients",
]


def a_const(d: int) -> Tensor:
    """Diagonal of ``A_const = diag(1, ..., 1)`` (float64, length ``d``)."""
    return torch.ones(d, dtype=torch.float64)


def a_sqrt(d: int) -> Tensor:
    """Diagonal of ``A_sqrt = diag(1, 1/sqrt(2), ..., 1/sqrt(d))`` (float64)."""
    return torch.arange(1, d + 1, dtype=torch.float64).rsqrt()


def a_linear(d: int) -> Tensor:
    """Diagonal of ``A_linear = diag(1, 1/2, ..., 1/d)`` (float64)."""
    return torch.arange(1, d + 1, dtype=torch.float64).reciprocal()


A_DIAGONALS: dict[str, Callable[[int], Tensor]] = {
    "const": a_const,
    "sqrt": a_sqrt,
    "linear": a_linear,
}


def restricted_lipschitz_coefficients(a_diag: Tensor) -> Tensor:
    """All restricted Lipschitz coefficients ``G_0 >= ... >= G_{d-1}`` of the problem.

    ``G_k = lambda_{k+1}(A^{1/2})``: the square roots of A's diagonal, sorted descending
    (Li et al. 2022, §4.1).

    Args:
        a_diag: the diagonal of A, shape (d,), non-negative.
    """
    a_diag = torch.as_tensor(a_diag, dtype=torch.float64)
    if a_diag.ndim != 1 or (a_diag < 0).any():
        raise ValueError("a_diag must be a 1-D tensor of non-negative entries (the diagonal of A)")
    return a_diag.sqrt().sort(descending=True).values


def restricted_lipschitz_closed_form(a_diag: Tensor, k: int) -> float:
    """The k-th restricted Lipschitz coefficient ``G_k = lambda_{k+1}(A^{1/2})``.

    ``G_0 = lambda_1(A^{1/2})`` bounds every per-example gradient norm; ``G_k`` bounds
    the gradient after projecting out the top-k eigenvectors of A. ``G_k = 0`` for
    ``k >= d``.

    Args:
        a_diag: the diagonal of A, shape (d,).
        k: the dimension of the removed subspace, ``k >= 0``.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    coeffs = restricted_lipschitz_coefficients(a_diag)
    return float(coeffs[k]) if k < coeffs.numel() else 0.0


class GeometricMedian(nn.Module):
    """Holds the estimate ``x`` (initialised to 0) and returns ``||x - x_i||_A`` per point.

    The norm is computed as ``sqrt((x - x_i)^T A (x - x_i) + eps^2)``, which differs from
    the exact norm by at most ``eps`` and has a finite gradient (zero) at ``x = x_i``;
    its gradient norm stays below ``lambda_1(A^{1/2})``.
    """

    def __init__(self, a_diag: Tensor, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.zeros(a_diag.shape[0]))
        self.register_buffer("a_diag", a_diag.to(torch.float32))
        self.eps = eps

    def forward(self, points: Tensor) -> Tensor:
        diff = self.x - points
        return (diff.square() * self.a_diag).sum(-1).add(self.eps**2).sqrt()


def _identity_loss(outputs: Tensor, batch: Batch) -> Tensor:
    return outputs


def _mean_loss(outputs: Tensor, batch: Batch) -> dict[str, float]:
    return {"loss": outputs.mean().item()}


def _points_forward(call: Callable[..., Tensor], batch: Batch) -> Tensor:
    return call(batch["points"])


def _sample_points(n: int, d: int, d_min: int, generator: torch.Generator) -> Tensor:
    points = torch.zeros(n, d)
    points[:, :d_min] = 1.0 + torch.randn(n, d_min, generator=generator)
    return points


@register_task("geomedian")
def geomedian_task(
    *,
    seed: int = 0,
    d: int = 100,
    spectrum: str = "sqrt",
    d_min: int = 10,
    n_train: int = 10_000,
    n_eval: int = 10_000,
    n_public: int = 100,
    eps: float = 1e-6,
) -> Task:
    """The generalised geometric median task of Li et al. (2022), §4.1.

    Args:
        seed: draws the data points.
        d: the dimension of ``x``.
        spectrum: which A: ``"const"``, ``"sqrt"`` or ``"linear"`` (``A_const``,
            ``A_sqrt``, ``A_linear``).
        d_min: number of non-zero data coordinates (Appendix A uses 10); ``<= d``.
        n_train: training points (Appendix A: 10000).
        n_eval: held-out points (Appendix A: 10000).
        n_public: public points, disjoint from both (0 for none).
        eps: smoothing of the norm at ``x = x_i`` (see :class:`GeometricMedian`).

    Returns:
        A task with data ``{"points": (n, d)}``, whose loss is ``||x - x_i||_A`` per point
        and whose single parameter is ``x`` (``p = d``).
    """
    if spectrum not in A_DIAGONALS:
        raise ValueError(f"unknown spectrum {spectrum!r}; choose one of {list(A_DIAGONALS)}")
    if not 1 <= d_min <= d:
        raise ValueError(f"need 1 <= d_min <= d, got d_min={d_min}, d={d}")
    if n_train < 1 or n_eval < 1 or n_public < 0:
        raise ValueError(f"n_train and n_eval must be positive and n_public >= 0, got "
                         f"{n_train}, {n_eval}, {n_public}")
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be positive, got {eps}")
    generator = torch.Generator().manual_seed(seed)
    train = _sample_points(n_train, d, d_min, generator)
    held_out = _sample_points(n_eval, d, d_min, generator)
    public = _sample_points(n_public, d, d_min, generator)
    ids = torch.arange(n_train + n_eval + n_public)
    a_diag = A_DIAGONALS[spectrum](d)
    return Task(
        name="geomedian",
        model=GeometricMedian(a_diag, eps=eps),
        train=TensorData({"points": train}, ids[:n_train]),
        eval=TensorData({"points": held_out}, ids[n_train : n_train + n_eval]),
        public=TensorData({"points": public}, ids[n_train + n_eval :]) if n_public else None,
        forward=_points_forward,
        loss=_identity_loss,
        metrics=_mean_loss,
        params=("x",),
        config={"lipschitz_g0": restricted_lipschitz_closed_form(a_diag, 0),
                "ids": "train 0..n_train-1, eval next n_eval, public last (drawn in that order)"},
    )
