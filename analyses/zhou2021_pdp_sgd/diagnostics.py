"""Subspace diagnostics along a PDP-SGD run (Zhou et al. 2021, §3.1, Theorem 2).

At scheduled steps, after the public projector has (re)computed its basis ``V̂_k``,
:class:`DiagnosedPDPSGD` measures, at the current parameters w_t:

* the private full-data top-k eigenspace ``V_k`` of ``M_priv = (1/n) Σ_i ∇ℓ_i ∇ℓ_iᵀ``
  (unclipped per-example gradients of every private training example, as the public
  second moment is unclipped) and its eigengap ``λ_k − λ_{k+1}``;
* the principal angles between ``V̂_k`` and ``V_k`` (and, as the control, between a
  random k-subspace and ``V_k``);
* the energy of the private gradients in each subspace, ``‖G V‖_F² / ‖G‖_F²``, and the
  fraction of the full-batch private gradient it keeps, ``‖P ḡ‖² / ‖ḡ‖²``;
* the deviation ``‖M_pub − M_priv‖₂`` and the Davis–Kahan bound
  ``min(1, 2 ‖M_pub − M_priv‖₂ / (λ_k − λ_{k+1}))`` on ``sin θ_max``.

These read the private data but are measurements only: nothing they compute reaches
the model (the hook returns before the step's gradients are drawn, uses no random
state of the run, and the trained parameters are the same as without it; a test checks
this), so they do not change the run's privacy.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from gradspec.optim import PDPSGD, PublicProjector, top_eigenvectors_from_rows
from gradspec.spectrum import compare_subspaces, eigengap, second_moment_distance
from gradspec.train import StepContext

logger = logging.getLogger(__name__)

__all__ = ["DiagnosedPDPSGD"]


def _rows(ctx: StepContext, data: Any) -> torch.Tensor:
    grads = [g for g, _ in ctx.per_example.iter_microbatches(
        {k: v.to(ctx.device) for k, v in data.batch(slice(None)).items()})]
    return torch.cat(grads).double()


def _energy(rows: torch.Tensor, v: torch.Tensor) -> float:
    return float((rows @ v).square().sum() / rows.square().sum())


def _mean_kept(mean: torch.Tensor, v: torch.Tensor) -> float:
    return float((v.T @ mean).square().sum() / mean.square().sum())


class DiagnosedPDPSGD(PDPSGD):
    """PDP-SGD with a public projector that records subspace diagnostics every ``every`` steps.

    Args:
        projector: the :class:`PublicProjector` (the run's PDP-SGD).
        start_epoch: as :class:`PDPSGD`.
        every: diagnose at active steps ``t`` with ``(t - start) % every == 0``, and at the last step.
        last_step: the run's final step index (diagnosed too).
        seed: seeds the random control subspace (not the run's generators).
    """

    def __init__(self, projector: PublicProjector, *, start_epoch: float = 0.0, every: int = 10,
                 last_step: int | None = None, seed: int = 0) -> None:
        super().__init__(projector, start_epoch=start_epoch)
        self.every, self.last_step, self.seed = int(every), last_step, int(seed)
        self.records: list[dict[str, Any]] = []

    def on_step_start(self, step: int, ctx: StepContext) -> None:
        super().on_step_start(step, ctx)
        if not self.active:
            return
        due = (step - self.start_step) % self.every == 0 or step == self.last_step
        if due:
            with torch.no_grad():
                self.records.append(self._diagnose(step, ctx))

    def _diagnose(self, step: int, ctx: StepContext) -> dict[str, Any]:
        proj = self.projector
        k = proj.rank
        private = _rows(ctx, ctx.task.train)
        public = _rows(ctx, proj.public)
        fill = torch.Generator().manual_seed(self.seed)
        lam, v_priv = top_eigenvectors_from_rows(private, k + 1, generator=fill)
        pub_lam, _ = top_eigenvectors_from_rows(public, min(k + 1, len(public)), generator=fill)
        v_priv = v_priv[:, :k]
        v_pub = proj.basis.double()
        gen = torch.Generator().manual_seed(self.seed + 7919 * step)
        v_rand, _ = torch.linalg.qr(torch.randn(v_pub.shape, generator=gen, dtype=torch.float64))
        pub = compare_subspaces(v_pub, v_priv, orthonormal=True)
        rnd = compare_subspaces(v_rand, v_priv, orthonormal=True)
        deviation = second_moment_distance(public, private)
        gap = eigengap(lam, k)
        mean = private.mean(0)
        record = {
            "step": step,
            "k": k,
            "public_size": len(public),
            "private_size": len(private),
            "angles_public": [float(x) for x in pub.angles],
            "mean_cos2_public": pub.mean_cos2,
            "sin_max_public": pub.projection_distance,
            "mean_cos2_random": rnd.mean_cos2,
            "sin_max_random": rnd.projection_distance,
            "eigengap_private": gap,
            "eigengap_private_relative": eigengap(lam, k, relative=True),
            "lambda1_private": float(lam[0]),
            "eigengap_public_relative": (eigengap(pub_lam, k, relative=True)
                                         if len(pub_lam) > k and pub_lam[0] > 0 else None),
            "deviation": deviation,
            "davis_kahan_bound": min(1.0, 2 * deviation / gap) if gap > 0 else 1.0,
            "energy_private_topk": _energy(private, v_priv),
            "energy_public": _energy(private, v_pub),
            "energy_random": _energy(private, v_rand),
            "mean_grad_kept_public": _mean_kept(mean, v_pub),
            "mean_grad_kept_private_topk": _mean_kept(mean, v_priv),
            "mean_grad_kept_random": _mean_kept(mean, v_rand),
        }
        logger.info("diagnostics step %d: sin_max public %.3f (random %.3f), energy public %.3f "
                    "(private top-k %.3f, random %.4f), rel. eigengap %.3g, DK bound %.3g",
                    step, record["sin_max_public"], record["sin_max_random"], record["energy_public"],
                    record["energy_private_topk"], record["energy_random"],
                    record["eigengap_private_relative"], record["davis_kahan_bound"])
        return record
