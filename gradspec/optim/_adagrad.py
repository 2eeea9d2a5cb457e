"""Noisy AdaGrad with a gradient-subspace oracle (Kairouz et al. 2021, Algorithm 1).

In the k-dimensional subspace of an orthonormal V (the oracle's estimate, e.g. a
:class:`PublicProjector`), with z_t = V^T grad_t the coordinates of the average
clipped gradient (before noise)::

    S_t = S_{t-1} + z_t z_t^T,   G_t = S_t^{1/2},   B_t = sigma_B(t) M,  M ~ GOE(k)
    H_t = V^T (G_t + B_t) V   (= Pi_t (G_t + B_t) restricted to the subspace)
    theta_{t+1} = theta_t - eta V H_t^+ V^T (grad_t + b_t)

A GOE matrix has N(0, 1) off-diagonal and N(0, 2) diagonal entries (Def. A.1); the
projection V^T M_p V of a p-dimensional GOE is a k-dimensional GOE, so it is drawn in
k dimensions. The outer optimizer is SGD with lr eta (``own_direction``).

**Guard against an indefinite H_t — eigenvalue clipping.** The eigenvalues of H_t
are clipped from below at alpha(t) = 2 sqrt(k) sigma_B(t), the floor that the proof
of Theorem 3.1 assumes "by construction" (every nonzero eigenvalue of H_t is at least
2 sqrt(k) sigma_B); this also removes negative eigenvalues. With sigma_B = 0 the
Moore-Penrose pseudo-inverse is used (eigenvalues <= rcond * max are dropped).

**Privacy.** Lemma 4.1 bounds the l2 (Frobenius) sensitivity of G_t by
Delta_t = L sqrt(t) / n for per-example gradients of norm <= L averaged over n; here
L = C (the clipping norm) and n is the step's denominator (q n under Poisson
sampling). Writing a symmetric matrix by its diagonal and sqrt(2) times its upper
triangle makes the Frobenius norm Euclidean and sigma_B M isotropic Gaussian with std
sqrt(2) sigma_B. So each release of H_t is a Gaussian mechanism with noise multiplier
z_B = sqrt(2) sigma_B(t) / Delta_t; we fix z_B (``precond_noise_multiplier``) and set
sigma_B(t) = z_B Delta_t / sqrt(2). G_t depends on every past batch, so no subsampling
amplification is claimed: each step records one plain Gaussian mechanism with
multiplier z_B next to the subsampled gradient mechanism, and the accountant composes
both. When the subspace changes, S is carried over by rotating it into the new basis
(``R S R^T`` with ``R = V_new^T V_old``), a contraction that keeps the sensitivity bound.

The diagonal variant (for large k) keeps only diag(S_t) (per-coordinate AdaGrad in the
subspace), adds the diagonal of sigma_B GOE (std sqrt(2) sigma_B) — the same z_B — and
clips each entry at 2 sqrt(2) sigma_B (our per-coordinate analogue of alpha(t)).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from gradspec.optim._base import OptimHooks
from gradspec.optim._projectors import Projector

__all__ = ["NoisyAdaGrad", "goe"]


def goe(k: int, scale: float, *, generator: torch.Generator, device: torch.device) -> Tensor:
    """``scale`` times a k x k GOE matrix (float64), drawn with ``gradspec.privacy.gaussian_noise``.

    ``(A + A^T) / sqrt(2)`` for A with i.i.d. N(0, 1) entries has N(0, 1) off-diagonal
    and N(0, 2) diagonal entries.
    """
    from gradspec.privacy import gaussian_noise

    a = gaussian_noise((k, k), 1.0, generator=generator, device=device).double()
    return scale * (a + a.T) / math.sqrt(2.0)


class NoisyAdaGrad(OptimHooks):
    """Noisy full-matrix (or diagonal) AdaGrad in a gradient subspace (Kairouz et al. 2021).

    Args:
        projector: the subspace oracle V_t (public, fixed or random).
        precond_noise_multiplier: z_B, the noise multiplier of each preconditioner release
            (see the module docstring); must be > 0 when the run is private.
        diagonal: keep only the diagonal of S_t (for large k).
        lipschitz: the per-example gradient norm bound L of Lemma 4.1 (default: the
            clipping norm C, which bounds the clipped gradients).
        seed: seeds the GOE noise (default: the run's seed + 3).
        rcond: relative cut-off of the pseudo-inverse when sigma_B = 0.
    """

    name = "noisy-adagrad"
    own_direction = True
    extra_privacy = True

    def __init__(
        self, projector: Projector, *, precond_noise_multiplier: float = 1.0,
        diagonal: bool = False, lipschitz: float | None = None, seed: int | None = None,
        rcond: float = 1e-7,
    ) -> None:
        if precond_noise_multiplier < 0:
            raise ValueError(f"precond_noise_multiplier must be >= 0, got {precond_noise_multiplier}")
        if lipschitz is not None and lipschitz <= 0:
            raise ValueError(f"lipschitz must be > 0, got {lipschitz}")
        self.projector = projector
        self.z_b = float(precond_noise_multiplier)
        self.diagonal = bool(diagonal)
        self.lipschitz = lipschitz
        self.seed = seed
        self.rcond = float(rcond)
        self.t = 0
        self.sigma_b = 0.0

    def setup(self, run: Any) -> None:
        super().setup(run)
        if run.sigma > 0 and self.z_b <= 0:
            raise ValueError(
                "noisy AdaGrad's preconditioner is built from private gradients: a private run "
                "needs precond_noise_multiplier > 0"
            )
        self.projector.setup(run)
        k = self.projector.rank
        shape = (k,) if self.diagonal else (k, k)
        self.S = torch.zeros(shape, dtype=torch.float64, device=run.device)
        self.t = 0
        seed = self.seed if self.seed is not None else run.config.seed + 3
        self._gen = self._generator(run.device, seed)
        self._L = float(self.lipschitz) if self.lipschitz is not None else self._clip

    def on_step_start(self, step: int, run: Any) -> None:
        super().on_step_start(step, run)
        old = self.projector._basis
        if self.projector.update(step, run) and old is not None and self.t > 0:
            r = self.projector.basis.double().T @ old.double()
            self.S = (r.square() @ self.S) if self.diagonal else r @ self.S @ r.T

    def before_noise(self, total: Tensor) -> Tensor:
        z = self.projector.coords(total).double() / self.denominator()
        self.S = self.S + (z.square() if self.diagonal else torch.outer(z, z))
        self.t += 1
        return total

    def sensitivity(self) -> float:
        """Delta_t = L sqrt(t) / n: the Lemma 4.1 bound on the change of G_t (Frobenius)."""
        return self._L * math.sqrt(max(self.t, 1)) / self.denominator()

    def direction(self, grad: Tensor) -> Tensor:
        k = self.projector.rank
        y = self.projector.coords(grad).double()
        self.sigma_b = self.z_b * self.sensitivity() / math.sqrt(2.0) if self.z_b > 0 else 0.0
        if self.diagonal:
            h = self.S.clamp(min=0).sqrt()
            if self.sigma_b > 0:
                from gradspec.privacy import gaussian_noise

                noise = gaussian_noise((k,), math.sqrt(2.0) * self.sigma_b, generator=self._gen,
                                       device=self._device)
                h = (h + noise.double()).clamp(min=2 * math.sqrt(2.0) * self.sigma_b)
            d = y * self._inverse(h)
        else:
            evals, q = torch.linalg.eigh(self.S)
            g = (q * evals.clamp(min=0).sqrt()) @ q.T
            if self.sigma_b > 0:
                g = g + goe(k, self.sigma_b, generator=self._gen, device=self._device)
            lam, q = torch.linalg.eigh((g + g.T) / 2)
            if self.sigma_b > 0:
                lam = lam.clamp(min=2 * math.sqrt(k) * self.sigma_b)  # alpha(t), Thm 3.1
            d = q @ (self._inverse(lam) * (q.T @ y))
        return self.projector.lift(d).to(grad.dtype)

    def _inverse(self, lam: Tensor) -> Tensor:
        top = lam.abs().max().clamp(min=torch.finfo(lam.dtype).tiny)
        keep = lam > self.rcond * top
        return torch.where(keep, 1.0 / torch.where(keep, lam, torch.ones_like(lam)), torch.zeros_like(lam))

    def record_privacy(self, accountant: Any, step: int) -> None:
        if self._sigma > 0 and self.z_b > 0:
            accountant.record_gaussian(self.z_b, 1)

    def state_dict(self) -> dict[str, Any]:
        return {
            "projector": self.projector.state_dict(), "S": self.S.detach().cpu().clone(),
            "t": self.t, "generator": self._gen.get_state(), "z_b": self.z_b,
            "diagonal": self.diagonal,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("z_b", "diagonal"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"the checkpoint's noisy AdaGrad has {key}={state.get(key)}, "
                                 f"this run {getattr(self, key)}")
        if tuple(state["S"].shape) != tuple(self.S.shape):
            raise ValueError(f"the checkpoint's preconditioner has shape {tuple(state['S'].shape)}, "
                             f"expected {tuple(self.S.shape)}")
        self.projector.load_state_dict(state["projector"])
        self.S = state["S"].to(self.S.device, torch.float64)
        self.t = int(state["t"])
        self._gen.set_state(state["generator"])
