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

**Privacy: what is released.** Step t releases G_t + B_t (full matrix) or h_t + b_t
(diagonal); everything after it — eigenvalue clipping, the pseudo-inverse, the update —
is post-processing with public quantities. Neighbouring datasets differ by adding or
removing one example (the accountant's ``ADD_OR_REMOVE_ONE``).

**Sensitivity.** Write S_t = Z Z^T with Z = [z_1 .. z_t] (k x t). In a private run
``denominator()`` is the public constant n = q N (Poisson) or B (shuffling), the same for
both datasets, and z_s = V^T (sum over the batch of the clipped gradients) / n. Given the
past releases (adaptive composition: theta_s and V_s are functions of them) and the
batches, removing example x changes z_s by V^T clip(g_x) / n when x is in batch s and not
at all otherwise, and ||V^T clip(g_x)|| <= ||clip(g_x)|| <= L. So, for every batch draw,
||Z - Z'||_F <= L sqrt(t) / n (equality needs x in every batch). When the subspace changes,
S <- R S R^T with R = V_new^T V_old: that is Z <- R Z, and ||R||_2 <= 1 (a product of
matrices with orthonormal columns), so ||R Z - R Z'||_F <= ||Z - Z'||_F and the bound
carries over; later columns add to it as above.

* Full matrix: G_t = (Z Z^T)^{1/2} = |Z^T| (|A| = (A^T A)^{1/2}), and A -> |A| is
  sqrt(2)-Lipschitz in the Frobenius norm (Araki & Yamagami 1981:
  || |A| - |B| ||_F <= sqrt(2) ||A - B||_F; pad Z with zero rows to make it square). So
  ||G_t - G_t'||_F <= Delta_t = sqrt(2) L sqrt(t) / n. The sqrt(2) is needed: at t = 1,
  with z' = s e_1 (the rest of the batch) and x's projected gradient c e_2 (c = L / n),
  ||G - G'||_F -> sqrt(2) c as s / c -> infinity (1.4140 c at s = 39 c). Kairouz et al.'s
  Lemma 4.1 gives O(L sqrt(t) / n); its proof treats S_t - S_t' as positive semi-definite,
  but the cross terms z' g^T + g z'^T are indefinite, and the constant 1 (used here before)
  understates Delta_t by sqrt(2): the preconditioner's real noise multiplier was z_B / sqrt(2).
* Diagonal: h_t = diag(S_t)^{1/2}, so h_j is the Euclidean norm of row j of Z, which is
  1-Lipschitz: ||h - h'||_2 <= ||Z - Z'||_F, and Delta_t = L sqrt(t) / n (tight: z' = 0).
  Its rotation S_jj <- sum_i R_ji^2 S_ii makes h_j the norm of row j of W with
  W_{j,(i,c)} = R_ji Z_ic (k x kt), and ||W - W'||_F^2 = sum_i ||R e_i||^2 ||Z_i - Z_i'||^2
  <= ||Z - Z'||_F^2 because the columns R e_i = V_new^T v_i have norm <= 1.

**Noise.** Writing a symmetric matrix by its diagonal and sqrt(2) times its upper
triangle is an isometry from the Frobenius norm to the Euclidean norm of R^{k(k+1)/2}, and
maps sigma_B M (M ~ GOE: diagonal N(0, 2), off-diagonal N(0, 1)) to i.i.d. N(0, 2 sigma_B^2)
coordinates. So each release is a Gaussian mechanism with sensitivity Delta_t, noise std
sqrt(2) sigma_B and noise multiplier z_B = sqrt(2) sigma_B(t) / Delta_t; we fix z_B
(``precond_noise_multiplier``) and set sigma_B(t) = z_B Delta_t / sqrt(2) (= z_B L sqrt(t) / n
for the full matrix). The diagonal variant adds N(0, 2 sigma_B^2) to each h_j (the diagonal
of sigma_B M) — noise multiplier z_B as well — and clips each entry at 2 sqrt(2) sigma_B
(our per-coordinate analogue of alpha(t)).

**Accounting: no amplification by subsampling, for the gradient either.** G_t is a
function of the past batches, i.e. of the sampling randomness that amplification by
subsampling needs hidden, and it can reveal which steps included an example; composing a
Poisson-subsampled gradient mechanism with releases that read its hidden batches is not
covered by adaptive composition. So the hooks set ``subsampling_amplification = False``
and every step records two plain Gaussian mechanisms: the gradient with multiplier sigma
(the trainer's ``record_gaussian(sigma, 1)``) and G_t + B_t with multiplier z_B
(``record_privacy``). Proof. Let D' = D + {x} (add/remove-one). The sampling of D's
examples and x's inclusion pattern I (the steps whose batch holds x) are drawn
independently of the data, with the same law under D and D'. Fix I and every other
example's inclusion. Then, given the past releases, step t's gradient release is Gaussian
with std sigma C / n and a mean that moves by at most C / n (by clip(g_x) / n when t is in
I, not at all otherwise; n the public denominator): multiplier >= sigma. Its preconditioner
release is Gaussian with std sqrt(2) sigma_B(t) and a mean that moves by at most
Delta_t = L sqrt(t) / n (times sqrt(2) for the full matrix; the bound above holds for every
inclusion pattern): multiplier z_B. Adaptive composition of these 2T Gaussian mechanisms
bounds the privacy loss of the whole transcript, for this pattern, by that of T Gaussians
of multiplier sigma composed with T of multiplier z_B (RDP or PLD of plain Gaussians, both
directions of the neighbouring relation). The transcript's law under D (and D') is the
mixture over patterns of these conditional laws with the same data-independent weights,
and the hockey-stick divergence (and exp((alpha - 1) D_alpha)) is jointly convex, so the
mixtures satisfy the bound that every component does. Shuffled sampling holds by the same
argument with a swap in place of an addition: fixed-size batches drop the remainder of
n // B, so x takes some y's place in one batch per epoch (the trainer's ``record_shuffled``:
one Gaussian of multiplier sigma / 2 per epoch, sensitivity 2C), and every later
preconditioner statistic moves by z_x − z_y, twice Delta_t: T Gaussians of multiplier
z_B / 2 (``SHUFFLED_SENSITIVITY``; before 2026-12-04 both were counted at sensitivity 1).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from gradspec.optim._base import OptimHooks
from gradspec.optim._projectors import Projector
from gradspec.train import StepContext

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
        lipschitz: the bound L on the norm of each clipped per-example gradient (default:
            the clipping norm C, which bounds them). A value below C is trusted, not checked:
            it is right only if the loss is L-Lipschitz.
        seed: seeds the GOE noise (default: the run's seed + 3).
        rcond: relative cut-off of the pseudo-inverse when sigma_B = 0.
    """

    name = "noisy-adagrad"
    own_direction = True
    extra_privacy = True
    # G_t reads the sampled batches (see the module docstring): no amplification.
    subsampling_amplification = False

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

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        if ctx.noise_multiplier > 0 and self.z_b <= 0:
            raise ValueError(
                "noisy AdaGrad's preconditioner is built from private gradients: a private run "
                "needs precond_noise_multiplier > 0"
            )
        self.projector.setup(ctx)
        # shuffled fixed-size batches: one example can take another's place in a batch, which
        # moves the preconditioner's statistic by z_x - z_y: twice Delta_t, as for the gradient
        from gradspec._enums import Sampling, parse_choice
        from gradspec.privacy import SHUFFLED_SENSITIVITY

        shuffled = parse_choice(Sampling, ctx.config.sampling, "sampling") == Sampling.SHUFFLE
        self._sensitivity = SHUFFLED_SENSITIVITY if shuffled else 1.0
        k = self.projector.rank
        shape = (k,) if self.diagonal else (k, k)
        self.S = torch.zeros(shape, dtype=torch.float64, device=ctx.device)
        self.t = 0
        seed = self.seed if self.seed is not None else ctx.config.seed + 3
        self._gen = self._generator(ctx.device, seed)
        self._L = float(self.lipschitz) if self.lipschitz is not None else self._clip

    def on_step_start(self, step: int, ctx: StepContext) -> None:
        super().on_step_start(step, ctx)
        old = self.projector._basis
        if self.projector.update(step, ctx) and old is not None and self.t > 0:
            r = self.projector.basis.double().T @ old.double()
            self.S = (r.square() @ self.S) if self.diagonal else r @ self.S @ r.T

    def before_noise(self, total: Tensor) -> Tensor:
        """Accumulate the clipped mean's subspace coordinates into the preconditioner's
        statistic (released only with its own noise); the sum passes unchanged."""
        z = self.projector.coords(total).double() / self.denominator()
        self.S = self.S + (z.square() if self.diagonal else torch.outer(z, z))
        self.t += 1
        return total

    def sensitivity(self) -> float:
        """Delta_t, the l2 sensitivity of the released statistic (see the module docstring).

        ``sqrt(2) L sqrt(t) / n`` for the full-matrix G_t (Frobenius norm), ``L sqrt(t) / n``
        for the diagonal h_t, with n = ``denominator()``.
        """
        delta = self._L * math.sqrt(max(self.t, 1)) / self.denominator()
        return delta if self.diagonal else math.sqrt(2.0) * delta

    def statistic(self) -> Tensor:
        """The noise-free statistic whose sensitivity is ``sensitivity()``.

        G_t = S_t^{1/2} (k x k), or h_t = diag(S_t)^{1/2} (k,) for the diagonal variant.
        """
        if self.diagonal:
            return self.S.clamp(min=0).sqrt()
        evals, q = torch.linalg.eigh(self.S)
        return (q * evals.clamp(min=0).sqrt()) @ q.T

    def release(self) -> Tensor:
        """The private release: ``statistic()`` plus the Gaussian noise (this step's draw).

        Sets ``sigma_B = z_B Delta_t / sqrt(2)`` and adds sigma_B times a GOE matrix (full
        matrix), or N(0, 2 sigma_B^2) per entry (diagonal): noise multiplier z_B either way.
        """
        k = self.projector.rank
        stat = self.statistic()
        self.sigma_b = self.z_b * self.sensitivity() / math.sqrt(2.0) if self.z_b > 0 else 0.0
        if self.sigma_b == 0:
            return stat
        if self.diagonal:
            from gradspec.privacy import gaussian_noise

            noise = gaussian_noise((k,), math.sqrt(2.0) * self.sigma_b, generator=self._gen,
                                   device=self._device)
            return stat + noise.double()
        return stat + goe(k, self.sigma_b, generator=self._gen, device=self._device)

    def direction(self, grad: Tensor) -> Tensor:
        """Precondition the privatised gradient's subspace coordinates by the noisy
        statistic's inverse (eigenvalues floored, Kairouz et al. Thm 3.1) and lift back."""
        k = self.projector.rank
        y = self.projector.coords(grad).double()
        h = self.release()
        if self.diagonal:
            if self.sigma_b > 0:
                h = h.clamp(min=2 * math.sqrt(2.0) * self.sigma_b)
            d = y * self._inverse(h)
        else:
            lam, q = torch.linalg.eigh((h + h.T) / 2)
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
            accountant.record_gaussian(self.z_b / self._sensitivity, 1)

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
