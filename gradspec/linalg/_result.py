"""The result of a spectral run and the accuracy report shared by every method.

Every method produces orthonormal left vectors U (r×k) and σ; the final pass
streams V = Hᵀ·U·Σ⁻¹ (p×k) to a sink and measures in the same pass, with the
V actually stored, what the chosen check needs (``verify``, see ``_verify``):

- ``residual_h``  ‖H·v_i − σ_i·u_i‖/σ_i (= ‖HHᵀu_i − σ_i²u_i‖/σ_i²; bounds
  |σ_i² − σ²_true|/σ_i² by Bauer–Fike for the symmetric HHᵀ): with the default
  ``"cheap"`` check an upper bound from Gaussian probes of H·V that holds for all
  k jointly with probability ``_verify.CONFIDENCE``; with ``"full"`` measured from
  the product H·V; with ``"none"`` the method's own estimate (or NaN),
- ``residual_ht`` ‖Hᵀ·u_i − σ_i·v_i‖/σ_i of the V stored, measured, never assumed: V formed
  by float32 products differs from Hᵀ·U·Σ⁻¹ by the float32 arithmetic that formed it
  (~√r·2⁻²⁴ relative, measured 3.5e-7…6.5e-7 on the main store), which nothing else in the
  pass sees. With the ``"cheap"`` check and float32 products: an upper bound from s Gaussian
  probes of Hᵀ·U − V·Σ from the p side in float64 (``_passes.HtProbes``), holding for all k
  jointly with probability ``_verify.CONFIDENCE``, as residual_h's; with float64 products:
  the rounding of V to its stored dtype, measured exactly (V is formed in float64, ~1e-16
  relative, which is not counted); with ``"full"``: measured (Hᵀ·U in float64 for float32
  products); with ``"none"``: not measured, NaN. The σ it is measured against is the final
  (refined) one. ``check["residual_ht"]`` says which,
- ``residuals``   the triplet residual √(residual_h² + residual_ht²) (a residual_ht that was
  not measured counts as 0: with ``"none"`` the residuals are the method's own estimates),
- the reconstruction error ‖H − H·V·Vᵀ‖_F/‖H‖_F: from H·V, VᵀV and ‖H‖_F² with the
  full check, else √(1 − Σσ²/‖H‖_F²) (exact for exact triplets, which the residuals
  vouch for),
- ``check``: which check ran, its confidence, U's orthogonality, the Gram's
  eigen-residual (exact method), the rounding terms, and ``flags`` (``ok``).

Which directions are kept. A direction whose σ is below what the block-product
precision resolves is not a singular direction but rounding: its u is noise and
V = Hᵀu/σ is not a unit vector (measured: σ ≈ 2e-4·σ_1 and ‖v‖ ≈ 1e-4 for the
null directions of a rank-5 H in float32). ``finalize`` keeps only σ_i above
``rank_rtol(r, precision)``·σ_1 — the numerical-rank floor of a float64
Gram/Ritz, or where the precision's σ error (``_precision``: ~1e-6·(σ_1/σ_i)² for
float32, ~1e-3·(σ_1/σ_i)² for tf32) reaches 10% — and then, with ``verify``,
drops any trailing directions whose stored V column is not a unit vector to
within ``V_UNIT_ATOL`` (the tolerance `gradspec decay` checks) — as long as the
precision (and float32 underflow) can explain the deviation; one far beyond it
is a wrong answer, kept and flagged (``unit``). The result holds the k
directions kept; ``params`` records ``k_requested``, ``k``, ``rank_rtol`` and
the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gradspec.linalg._operator_base import ArraySink, verify_mode
from gradspec.linalg._verify import (
    CONFIDENCE,
    UNDERFLOW_ERROR,
    describe_check,
    flags,
    gram_residual,
    orthogonality,
    probe_bounds,
    rounding,
)
from gradspec.store import V_UNIT_ATOL

logger = logging.getLogger(__name__)


def sign_fix(u: np.ndarray) -> np.ndarray:
    """Flip columns so that the largest-|·| entry of each is positive (deterministic signs)."""
    if u.size == 0:
        return u
    idx = np.argmax(np.abs(u), axis=0)
    signs = np.sign(u[idx, np.arange(u.shape[1])])
    signs[signs == 0] = 1.0
    return u * signs


def sort_desc(theta: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(theta)[::-1]
    return theta[order], w[:, order]


def null_floor(sigma1: float, r: int) -> float:
    """σ below this are numerically zero for a Gram/Ritz computed in float64."""
    return float(sigma1) * float(np.sqrt(max(r, 1) * np.finfo(np.float64).eps)) * 10


#: Relative σ error of each block-product precision at σ_i: ~coef·(σ_1/σ_i)² (see ``_precision``).
SIGMA_ERROR = {"float64": 0.0, "auto": 0.0, "float32": 1e-6, "tf32": 1e-3}


def rank_rtol(r: int, precision: str = "float64") -> float:
    """σ_i ≤ rank_rtol·σ_1 are not resolved: the float64 null floor, or a 10% σ error."""
    base = null_floor(1.0, r)
    coef = SIGMA_ERROR.get(str(precision), SIGMA_ERROR["float32"])
    return float(max(base, np.sqrt(coef / 0.1)))


@dataclass
class PcaResult:
    """Top-k singular triplets of H with their accuracy report.

    ``V`` is None when it was streamed to a spectrum store (read it there).
    """

    sigma: np.ndarray
    U: np.ndarray
    V: np.ndarray | None
    method: str
    frob2: float
    residual_h: np.ndarray
    residual_ht: np.ndarray
    reconstruction_error: float
    params: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    passes: int = 0
    rank: int | None = None
    gram: np.ndarray | None = field(default=None, repr=False)
    """H·Hᵀ (r×r, float64) of the selected rows: the exact method computes it anyway, and
    it answers questions about row subsets without another pass (``gradspec.spectrum``)."""
    row_sq_norms: np.ndarray | None = field(default=None, repr=False)
    """‖h_i‖² of the selected rows as the first pass computed them (the Gram's diagonal when
    it formed a Gram): stored beside U, they give an exact spectrum's in-sample G_k without
    another pass over H (``gradspec.spectrum.row_projections_from_svd``)."""
    hv: np.ndarray | None = field(default=None, repr=False)
    """H·V (r×k, float64) of the stored V, measured where H·V = U·Σ does not hold exactly (a
    replay with ``check``: Ritz vectors of span(Hᵀ·U_K)); with the row norms it gives the rows'
    G_k onto span(v_1..v_k) (``gradspec.spectrum``)."""
    check: dict[str, Any] = field(default_factory=dict)
    """Which accuracy check ran, its confidence, its other measurements and its flags
    (``_verify``); part of :meth:`accuracy`."""

    @property
    def k(self) -> int:
        """The number of singular triplets."""
        return int(self.sigma.shape[0])

    @property
    def residuals(self) -> np.ndarray:
        """√(residual_h² + residual_ht²); a residual_ht not measured (NaN, ``verify="none"``)
        adds nothing: the residuals are then residual_h, the method's own estimates."""
        return np.sqrt(self.residual_h**2 + np.nan_to_num(self.residual_ht, nan=0.0) ** 2)

    @property
    def explained_variance_ratio(self) -> np.ndarray:
        """σ_i²/‖H‖_F² per component."""
        return self.sigma**2 / self.frob2 if self.frob2 > 0 else np.zeros_like(self.sigma)

    @property
    def cumulative_explained_variance(self) -> np.ndarray:
        """Σ_{j≤i} σ_j²/‖H‖_F²: the explained-variance ratio of the top-i subspace, for each i ≤ k."""
        return np.cumsum(self.explained_variance_ratio)

    def accuracy(self) -> dict[str, Any]:
        """The accuracy report: residuals, reconstruction error, explained variance, and which
        check measured them (``check``, ``confidence``, ``ok``, ``flags``, see ``_verify``)."""
        res = self.residuals
        return {
            "max_residual": float(res.max()) if res.size else 0.0,
            "median_residual": float(np.median(res)) if res.size else 0.0,
            "reconstruction_error": float(self.reconstruction_error),
            "explained_variance": float(self.cumulative_explained_variance[-1])
            if res.size
            else 0.0,
            **self.check,
        }

    def summary(self) -> dict[str, Any]:
        """A JSON-able digest: method, k, shape, the top five σ, the accuracy, passes and timings."""
        return {
            "method": self.method,
            "k": self.k,
            "shape": self.source.get("shape"),
            "sigma_top": [float(s) for s in self.sigma[:5]],
            "accuracy": self.accuracy(),
            "passes": self.passes,
            "timings": self.timings,
            "params": self.params,
        }


def finalize(
    op: Any,
    u: np.ndarray,
    sigma: np.ndarray,
    *,
    method: str,
    sink: Any = None,
    out_dtype: Any = np.float32,
    verify: bool | str = True,
    params: dict | None = None,
    history: list | None = None,
    est_residual: np.ndarray | None = None,
    timings: dict | None = None,
    gram: np.ndarray | None = None,
    seed: int = 0,
) -> PcaResult:
    """Sign-fix U, stream V = Hᵀ·U·Σ⁻¹ to ``sink`` (kept in memory if None), build the report.

    ``verify``: ``"cheap"`` (or True, the default), ``"full"`` or ``"none"`` (or False),
    see ``_verify``; ``seed`` seeds the probes of the cheap check.
    """
    import time

    mode = verify_mode(verify, default="cheap")
    r = op.shape[0]
    sigma = np.asarray(sigma, dtype=np.float64)
    u = sign_fix(np.asarray(u, dtype=np.float64))
    k_requested = int(sigma.size)
    precision = str(getattr(op, "precision", "float64"))
    rtol = rank_rtol(r, precision)
    if not sigma.size or not sigma[0] > 0:
        raise ValueError("H is zero (no singular value above 0): check the rows and parameters selected")
    kept = int((sigma > rtol * sigma[0]).sum())  # σ descending: a prefix
    reason = None
    if kept < k_requested:
        reason = (
            f"sigma_{kept + 1} = {sigma[kept]:.3g} is below {rtol:.2g}·sigma_1, what {precision} "
            "products resolve"
            + (" (H's numerical rank)" if SIGMA_ERROR.get(precision, 1.0) == 0.0 else "")
        )
        logger.info("keeping %d of %d directions: %s", kept, k_requested, reason)
        sigma, u = sigma[:kept], u[:, :kept]
        if est_residual is not None:
            est_residual = np.asarray(est_residual)[:kept]
    keep = sink is None
    if keep:
        sink = ArraySink(op.shape[1], sigma.size, out_dtype)
    t0 = time.perf_counter()
    stats = op.project(u, sigma, sink, out_dtype=out_dtype, verify=mode, gram=gram, seed=seed) or {}
    if hasattr(sink, "flush"):
        sink.flush()  # every row of V has landed before the report is made
    timings = dict(timings or {})
    timings["project"] = time.perf_counter() - t0
    n2 = np.asarray(stats["n2"], dtype=np.float64) if "n2" in stats else None
    if mode == "full":
        n2 = np.diag(stats["vtv"]).copy()
    report: dict[str, Any] = {"check": mode}
    if mode != "none" and n2 is not None:
        dev = np.abs(np.sqrt(np.maximum(n2, 0.0)) - 1.0)
        bad = np.flatnonzero(dev > V_UNIT_ATOL)
        # What the products' precision (and underflow) can do to ‖v_i‖; far beyond it, a column
        # that is not a unit vector is a wrong answer, not a limit of the precision: flag it and
        # keep every direction (dropping them would hide it behind a plausible reason).
        expected = SIGMA_ERROR.get(precision, SIGMA_ERROR["float32"]) * (sigma[0] / sigma) ** 2
        if precision in ("float32", "tf32"):
            expected = expected + r * op.shape[1] * UNDERFLOW_ERROR / sigma**2
        wrong = np.flatnonzero((dev > V_UNIT_ATOL) & (dev > 10 * expected))
        if wrong.size:
            report["v_not_unit"] = {"index": int(wrong[0]), "deviation": float(dev[wrong[0]]),
                                    "expected": float(expected[wrong[0]])}
        elif bad.size:
            j = int(bad[0])
            if j == 0:
                raise ValueError(
                    f"the first stored direction is not a unit vector (|‖v_1‖ − 1| = {dev[0]:.2e}); "
                    f"{precision} products do not resolve this H: rerun with --precision float64"
                )
            reason = (
                f"v_{j + 1} of the stored V is not a unit vector (|‖v‖ − 1| = {dev[j]:.2e} > "
                f"{V_UNIT_ATOL}); {precision} products do not resolve sigma_{j + 1} = {sigma[j]:.3g}"
            )
            logger.info("keeping %d of %d directions: %s", j, k_requested, reason)
            kept = j
            sigma, u = sigma[:j], u[:, :j]
            stats = _cut(stats, j)
            if est_residual is not None:
                est_residual = np.asarray(est_residual)[:j]
            if keep:
                sink.array = np.ascontiguousarray(sink.array[:, :j])
    n2 = None if n2 is None else n2[: sigma.size]
    sigma_gram = sigma
    if precision in ("float32", "tf32") and n2 is not None:
        # One refinement step for float32 products: σ_i ← ‖Hᵀu_i‖ = σ_i·‖v_i‖ (u_i unit), the
        # Rayleigh quotient of HHᵀ at u_i. Its error is second order in u_i's (|ρ − λ| ≤
        # ‖HHᵀu − ρu‖²/gap), where the float32 Gram's eigenvalue is first order.
        refined = sigma * np.sqrt(np.maximum(n2, 0.0))
        # Keep σ descending: a swap would come from equal σ (a cluster), within the error.
        refined = np.minimum.accumulate(refined)
        if "rt2" in stats:
            # e_i = Hᵀu_i − σ_old·v_i was measured (full check: Hᵀ·U in float64, with eᵀv_i);
            # against the refined σ it is e_i + (σ_old − σ_new)·v_i. The p-side probes of the
            # cheap check take the refined σ in ``probe_bounds`` below.
            d = sigma - refined
            stats["rt2"] = stats["rt2"] + 2 * d * stats.get("rt_cross", 0.0) + d**2 * n2
        params = {**(params or {}), "sigma_refined": "rayleigh quotient ‖Hᵀu‖ (float64 sums)",
                  "sigma_refinement_max_rel": float(np.max(np.abs(refined - sigma) / sigma))
                  if sigma.size else 0.0}
        sigma = refined
    frob2 = op.frob2
    safe = np.where(sigma > 0, sigma, 1.0)
    if "probe_ht" in stats:
        # Gᵀ·(Hᵀ·U − V_s·Σ) for the p-side probes G: (Gᵀ·Hᵀ)·U against (Gᵀ·V_s)·Σ, in float64.
        res_ht, _ = probe_bounds(stats["probe_ht"] @ u, stats["probe_ht_v"], sigma)
        s = stats["probe_ht"].shape[0]
        report["residual_ht_check"] = f"bound: {s} Gaussian probes of Hᵀ·U − V·Σ in float64"
    elif "rt2" in stats:
        res_ht = np.sqrt(np.maximum(stats["rt2"], 0.0)) / safe
        report["residual_ht_check"] = (
            "measured: Hᵀ·U in float64" if "rt_cross" in stats
            else "measured: the rounding of V (formed in float64) to its stored dtype"
        )
    else:
        res_ht = np.full(sigma.size, np.nan)  # not measured
        report["residual_ht_check"] = None
    rec2 = frob2 - float((sigma**2).sum())  # exact for exact triplets (the residuals say how far)
    if mode == "full":
        res_h = np.linalg.norm(stats["hv"] - u * sigma, axis=0) / safe
        a = stats["hv"].T @ stats["hv"]
        rec2 = frob2 - 2 * np.trace(a) + np.trace(a @ stats["vtv"])
        report["confidence"] = 1.0
    elif mode == "cheap":
        res_h, factor = probe_bounds(stats["probe"], stats["omega_u"], sigma)
        report.update(confidence=CONFIDENCE, probes=int(stats["probe"].shape[0]), probe_factor=factor)
    else:
        res_h = (
            np.asarray(est_residual, dtype=np.float64)
            if est_residual is not None
            else np.full(sigma.size, np.nan)
        )
        report["confidence"] = None
    if mode != "none":
        report["orthogonality_u"] = orthogonality(u)
        if gram is not None:
            report["gram_residual"] = float(gram_residual(gram, u, sigma_gram**2).max()) if sigma.size else 0.0
        stored32 = np.dtype(out_dtype) == np.float32 and precision == "float64"
        report.update(rounding(
            sigma=sigma, frob2=frob2, r=r, p=op.shape[1], panel_cols=int(getattr(op, "panel_cols", 8192)),
            precision=precision, gram_products=gram is not None, v_rounded_to="float32" if stored32 else None,
        ))
    report["check_text"] = describe_check(mode, probes=report.get("probes"), factor=report.get("probe_factor"),
                                          residual_ht=report.get("residual_ht_check"))
    if mode != "none":
        found = flags(report, res_h, res_ht)
        report.update(ok=not found, flags=found)
    rec = float(np.sqrt(max(rec2, 0.0) / frob2)) if frob2 > 0 else 0.0
    params = {
        **(params or {}),
        "k": int(sigma.size),
        "k_requested": k_requested,
        "rank_rtol": rtol,
        "k_reason": reason,
    }
    return PcaResult(
        sigma=sigma,
        U=u,
        V=sink.array if keep else None,
        method=method,
        frob2=frob2,
        residual_h=res_h,
        residual_ht=res_ht,
        reconstruction_error=rec,
        params=params,
        history=list(history or []),
        timings=timings,
        source=op.describe(),
        passes=op.passes,
        rank=kept,
        row_sq_norms=_row_norms(op),
        check=report,
    )


def _row_norms(op: Any) -> np.ndarray | None:
    """The squared row norms the operator's first pass recorded (None: it records none)."""
    norms = getattr(op, "row_sq_norms", None)
    return None if norms is None else np.array(norms, dtype=np.float64)


def _cut(stats: dict[str, Any], j: int) -> dict[str, Any]:
    """The measured products of the first j directions."""
    out = dict(stats)
    for name in ("n2", "rt2", "rt_cross"):
        if name in out:
            out[name] = np.asarray(out[name])[:j]
    if "probe_ht_v" in out:
        out["probe_ht_v"] = out["probe_ht_v"][:, :j]
    if "hv" in out:
        out["hv"], out["vtv"] = out["hv"][:, :j], out["vtv"][:j, :j]
    if "probe" in out:
        out["probe"], out["omega_u"] = out["probe"][:, :j], out["omega_u"][:, :j]
    return out
