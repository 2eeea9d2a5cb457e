"""The accuracy check of a spectral run that costs much less than one more product with V.

Multiplying H by the stored V (``verify="full"``) costs a second GEMM the size of
the one that forms V. The default check (``"cheap"``) measures instead, with the V
actually stored:

1. **Probes of H·V** (randomized, end to end). For s Gaussian probes Ω (r×s),
   Ωᵀ·e_i with e_i = H·v_i − σ_i·u_i is measured in the V pass (Ωᵀ·P per panel,
   then times V's rows: 2ps(r + k) flops against V's 2prk). ‖Ωᵀe‖² = ‖e‖²·χ²_s for
   a Gaussian Ω, so with q the (1 − c)/k quantile of χ²_s, every
   ``residual_h_i ≤ ‖Ωᵀe_i‖/(√q·σ_i)`` holds jointly with probability ≥ c
   (``CONFIDENCE``): these bounds are what ``residual_h`` reports. A wrong G, U, σ
   or V column shows here whatever caused it.
2. **The Gram's eigen-residual** (exact method, deterministic, float64):
   ‖G·u_i − λ_i·u_i‖/λ_i of the Gram the eigenvectors came from, and U's
   orthogonality max|UᵀU − I|.
3. **What rounding can add** (a priori, from r, p, ‖H‖_F and σ): with the usual
   model of an inner product of length n in unit roundoff u erring by about
   √n·u·Σ|x_j y_j| (Higham & Mary, SIAM J. Sci. Comput. 2019), the float32 Gram moves
   λ_i by at most about √w·u·‖H‖_F²/λ_i relative (w: panel width; Weyl), forming V
   in float32 adds about √r·u·σ_1·‖H‖_F/σ_i² to residual_h and storing it rounded
   u·σ_1/σ_i; products that underflow (gradual underflow: each loses ≤ 2^-150) move
   λ_i by at most r·p·2^-150/λ_i. The first three are the expected size of the
   rounding (``rounding``); the underflow term is a bound (``underflow``).

The report flags (``flags``; ``ok`` is False with any) a residual bound over
``RESIDUAL_FLAG``, U not orthonormal to ``ORTHOGONALITY_FLAG``, a Gram residual over
``GRAM_RESIDUAL_FLAG``, and an underflow bound over ``UNDERFLOW_FLAG``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Joint confidence of the probe bounds on residual_h (all k at once).
CONFIDENCE = 0.999
#: A residual above this: the triplet is wrong or an iterative method stopped short.
RESIDUAL_FLAG = 1e-2
ORTHOGONALITY_FLAG = 1e-6
GRAM_RESIDUAL_FLAG = 1e-3
#: An underflow bound on λ_k's relative change above this: the products do not resolve H.
UNDERFLOW_FLAG = 0.1
#: Unit roundoff of a block-product precision (tf32 keeps 10 mantissa bits).
UNIT_ROUNDOFF = {"float64": 2.0**-53, "auto": 2.0**-53, "float32": 2.0**-24, "tf32": 2.0**-11}
#: The largest error of one product that underflows (half the smallest float32 subnormal).
UNDERFLOW_ERROR = 2.0**-150


def probe_factor(s: int, k: int, confidence: float = CONFIDENCE) -> float:
    """√(s/q), q the ((1 − confidence)/k)-quantile of χ²_s: for all k jointly, ‖e‖ is at most
    this factor times the probe estimate ‖Ωᵀe‖/√s."""
    from scipy.stats import chi2

    q = float(chi2.ppf((1.0 - confidence) / max(k, 1), s))
    return float(np.sqrt(s / q))


def probe_bounds(probe: np.ndarray, omega_u: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, float]:
    """-> (upper bounds on ‖H·v_i − σ_i·u_i‖/σ_i at ``CONFIDENCE`` jointly; the factor over the
    probe estimate)."""
    s, k = probe.shape
    estimate = np.linalg.norm(probe - omega_u * sigma, axis=0) / np.sqrt(s)
    factor = probe_factor(s, k)
    safe = np.where(sigma > 0, sigma, 1.0)
    return estimate * factor / safe, factor


def gram_residual(gram: np.ndarray, u: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """‖G·u_i − λ_i·u_i‖/λ_i in float64."""
    safe = np.where(lam > 0, lam, 1.0)
    return np.linalg.norm(gram @ u - u * lam, axis=0) / safe


def orthogonality(u: np.ndarray) -> float:
    """max|UᵀU − I|."""
    if u.size == 0:
        return 0.0
    return float(np.abs(u.T @ u - np.eye(u.shape[1])).max())


def rounding(
    *,
    sigma: np.ndarray,
    frob2: float,
    r: int,
    p: int,
    panel_cols: int,
    precision: str,
    gram_products: bool,
    v_rounded_to: str | None,
) -> dict[str, float]:
    """The a priori rounding terms (see the module note), each the largest over the k directions.

    ``gram_products``: σ and U came from a Gram accumulated in ``precision`` (the exact
    method); ``v_rounded_to``: the dtype V was stored in when narrower than its products.
    """
    uc = UNIT_ROUNDOFF.get(precision, UNIT_ROUNDOFF["float32"])
    lam = np.maximum(sigma**2, np.finfo(np.float64).tiny)
    s1 = float(sigma[0]) if sigma.size else 0.0
    fro = float(np.sqrt(max(frob2, 0.0)))
    gram = np.sqrt(panel_cols) * uc * frob2 / lam if gram_products else np.zeros_like(lam)
    v_form = np.sqrt(r) * uc * s1 * fro / lam
    v_store = (UNIT_ROUNDOFF.get(v_rounded_to, 0.0) if v_rounded_to else 0.0) * s1 / np.sqrt(lam)
    narrow = precision in ("float32", "tf32")
    underflow = (r * p * UNDERFLOW_ERROR / lam) if narrow else np.zeros_like(lam)
    total = gram + v_form + v_store
    return {
        "rounding": float(total.max()) if total.size else 0.0,
        "rounding_gram": float(gram.max()) if gram.size else 0.0,
        "rounding_v": float((v_form + v_store).max()) if total.size else 0.0,
        "underflow": float(underflow.max()) if underflow.size else 0.0,
    }


def flags(report: dict[str, Any], residual_h: np.ndarray, residual_ht: np.ndarray | None = None) -> dict[str, str]:
    """{kind: one line} per finding that makes the answer untrustworthy (empty: nothing found).

    Kinds: ``residual``, ``residual_ht``, ``orthogonality``, ``gram``, ``unit``, ``underflow``.
    """
    out = {}
    if residual_h.size and np.nanmax(residual_h) > RESIDUAL_FLAG:
        i = int(np.nanargmax(residual_h))
        how = "a probe bound" if report.get("check") == "cheap" else "measured"
        out["residual"] = (
            f"H·v_{i + 1} differs from sigma_{i + 1}·u_{i + 1} by {residual_h[i]:.2e} relative ({how}, "
            f"over {RESIDUAL_FLAG:g}): a wrong or unconverged triplet"
        )
    if residual_ht is not None and residual_ht.size and np.nanmax(residual_ht, initial=0.0) > RESIDUAL_FLAG:
        i = int(np.nanargmax(residual_ht))
        how = "a probe bound" if str(report.get("residual_ht_check", "")).startswith("bound") else "measured"
        out["residual_ht"] = (
            f"Hᵀ·u_{i + 1} differs from sigma_{i + 1}·v_{i + 1} by {residual_ht[i]:.2e} relative ({how}, "
            f"over {RESIDUAL_FLAG:g}): the stored V is not Hᵀ·U·Σ⁻¹"
        )
    orth = report.get("orthogonality_u")
    if orth is not None and orth > ORTHOGONALITY_FLAG:
        out["orthogonality"] = f"U is not orthonormal: max|UᵀU − I| = {orth:.2e} (over {ORTHOGONALITY_FLAG:g})"
    g = report.get("gram_residual")
    if g is not None and g > GRAM_RESIDUAL_FLAG:
        out["gram"] = (
            f"U and sigma are not eigenpairs of the Gram they came from: residual {g:.2e} "
            f"(over {GRAM_RESIDUAL_FLAG:g})"
        )
    nu = report.get("v_not_unit")
    if nu:
        i = nu["index"]
        out["unit"] = (
            f"v_{i + 1} is not a unit vector (|‖v‖ − 1| = {nu['deviation']:.2e}) where the products' "
            f"precision explains {nu['expected']:.1e}: U, sigma or the Gram is wrong"
        )
    uf = report.get("underflow", 0.0)
    if uf > UNDERFLOW_FLAG:
        out["underflow"] = (
            f"float32 products underflow at this scale of H: they can move sigma_k^2 by {uf:.2g} "
            "of itself; rerun with --precision float64"
        )
    return out


def describe_check(mode: str, *, probes: int | None = None, factor: float | None = None,
                   residual_ht: str | None = None) -> str:
    """What ran, in words (the report's ``check_text``); ``residual_ht``: how residual_ht was
    measured (the report's ``residual_ht_check``)."""
    ht = ""
    if residual_ht and residual_ht.startswith("bound"):
        ht = f"; Hᵀ·U − V·Σ by {probes} more from the p side in float64: residual_ht bounds likewise"
    elif residual_ht:
        ht = f"; residual_ht {residual_ht}"
    if mode == "cheap":
        return (
            f"{probes} Gaussian probes of H·V: residual_h bounds hold jointly with probability "
            f"{CONFIDENCE:g} ({factor:.1f}x the probe estimate){ht}"
        )
    if mode == "full":
        return f"the products H·V and VᵀV, measured{ht}"
    return "no check: residuals are the method's own estimates, or NaN; residual_ht not measured (NaN)"
