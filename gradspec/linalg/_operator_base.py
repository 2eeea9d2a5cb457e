"""What every backend of the streamed operator offers: the argument checks and the contract.

``GradientOperator`` (local passes, ``_operator``) and ``DaskGradientOperator``
(dask graphs, ``_dask``) compute the same products of the r×p matrix H. This
base class owns their public methods — the shapes each accepts, vectors as
one-column matrices, where a streamed result goes — and each backend supplies
the products themselves (``_matmat``, ``_rmatmat``, ``_hht``, ``_project``,
``_norms_pass``), called with checked float64 arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: ``sink(offset, rows)``: receives the rows of a streamed p×b result, in order.
Sink = Callable[[int, np.ndarray], None]

#: What the final pass measures: Gaussian probes of H·V, the full products, or nothing.
VERIFY_MODES = ("cheap", "full", "none")
#: Gaussian probes of the cheap check (s): 2ps(r + k) flops against V's 2prk.
PROBES = 16


def verify_mode(verify: bool | str, default: str = "full") -> str:
    """``True`` -> ``default``, ``False`` -> ``"none"``, or one of ``VERIFY_MODES``.

    Raises:
        ValueError: another value (naming the valid ones).
    """
    if verify is True:
        return default
    if verify is False:
        return "none"
    if isinstance(verify, str) and verify in VERIFY_MODES:
        return verify
    raise ValueError(f"unknown verify mode {verify!r}; choose one of: {', '.join(VERIFY_MODES)}")


class ArraySink:
    """Collects streamed rows of a p×k result (V, or Hᵀ·Y) in memory."""

    def __init__(self, p: int, k: int, dtype: Any = np.float32) -> None:
        self.array = np.zeros((p, k), dtype=dtype)
        self.dtype = np.dtype(dtype)

    def __call__(self, offset: int, block: np.ndarray) -> None:
        self.array[offset : offset + block.shape[0]] = block


def _matrix(a: Any, rows: int, what: str) -> tuple[np.ndarray, bool]:
    """-> (a as a float64 matrix with ``rows`` rows, whether it was a vector)."""
    a = np.asarray(a, dtype=np.float64)
    vec = a.ndim == 1
    a2 = a[:, None] if vec else a
    if a2.ndim != 2 or a2.shape[0] != rows:
        raise ValueError(f"{what} with {rows} rows, got shape {a.shape}")
    return a2, vec


class OperatorBase:
    """The r×p gradient matrix H as a linear operator; each product is one pass over H.

    Subclasses set ``shape``, ``passes`` and ``row_sq_norms`` (the squared row
    norms of H, recorded by the first pass) and implement the underscore methods.
    """

    shape: tuple[int, int]
    passes: int
    row_sq_norms: np.ndarray | None

    @property
    def r(self) -> int:
        """Rows of H (gradient samples)."""
        return self.shape[0]

    @property
    def p(self) -> int:
        """Columns of H (parameter entries)."""
        return self.shape[1]

    @property
    def frob2(self) -> float:
        """‖H‖_F² (from the first pass; a pass is run if none has been)."""
        if self.row_sq_norms is None:
            self._norms_pass()
        return float(self.row_sq_norms.sum())  # type: ignore[union-attr]

    def matmat(self, x: np.ndarray) -> np.ndarray:
        """H·X for X of shape (p, b) (or (p,)), float64."""
        x2, vec = _matrix(x, self.p, "matmat needs X")
        z = self._matmat(x2)
        return z[:, 0] if vec else z

    def rmatmat(self, y: np.ndarray, sink: Sink | None = None) -> np.ndarray | None:
        """Hᵀ·Y for Y of shape (r, b); streamed to ``sink(offset, rows)`` if given, else returned."""
        y2, vec = _matrix(y, self.r, "rmatmat needs Y")
        w = self._rmatmat(y2, sink)
        if sink is not None:
            return None
        return w[:, 0] if vec else w

    def hht(self, q: np.ndarray) -> np.ndarray:
        """H·Hᵀ·Q (r×b, float64) in one pass."""
        q2, vec = _matrix(q, self.r, "hht needs Q")
        z = self._hht(q2)
        return z[:, 0] if vec else z

    def project(
        self,
        u: np.ndarray,
        sigma: np.ndarray,
        sink: Sink,
        *,
        out_dtype: Any = np.float32,
        verify: bool | str = True,
        gram: np.ndarray | None = None,
        probes: int = PROBES,
        seed: int = 0,
    ) -> dict[str, np.ndarray] | None:
        """Stream V = Hᵀ·U·Σ⁻¹ to ``sink`` and measure what the accuracy report needs.

        Args:
            u: r×k orthonormal left vectors.
            sigma: their k singular values (a σ ≤ 0 gives a zero column).
            sink: receives V's rows as they are formed, rounded to ``out_dtype``.
            out_dtype: the dtype V is stored in.
            verify: what to measure with the V actually stored (see ``_passes._Project``):
                ``"full"`` (or True) H·V, VᵀV and ‖Hᵀu − σv‖²; ``"cheap"`` Ωᵀ·H·V for
                ``probes`` Gaussian probes Ω, and Hᵀu − σv by as many probes from the p side
                (float32 products) or V's rounding (float64 products); ``"none"`` (or False)
                only ‖v_i‖².
            gram: H·Hᵀ from an earlier pass, which a backend may use to save a float64
                product in the full check.
            probes: the number s of Gaussian probes of the cheap check.
            seed: seed of the probes.

        Returns:
            ``n2`` (‖v_i‖² in float64) and, by ``verify``: ``hv``, ``vtv``, ``rt2`` (‖Hᵀu_i −
            σ_i·v_i‖²) and, for float32 products, ``rt_cross`` ((Hᵀu_i − σ_i·v_i)ᵀv_i) (full);
            ``probe`` (Ωᵀ·H·V_s, s×k), ``omega_u`` (Ωᵀ·U) and either ``rt2`` (float64 products)
            or ``probe_ht`` (Gᵀ·Hᵀ, s×r) and ``probe_ht_v`` (Gᵀ·V_s, s×k) for p-side probes G
            (cheap).
        """
        mode = verify_mode(verify)
        u2, _ = _matrix(u, self.r, "project needs U")
        sigma = np.asarray(sigma, dtype=np.float64).reshape(-1)
        if sigma.size != u2.shape[1]:
            raise ValueError(f"project needs one sigma per column of U ({u2.shape[1]}), got {sigma.size}")
        omega = None
        if mode == "cheap":
            if isinstance(probes, bool) or not isinstance(probes, (int, np.integer)) or probes < 1:
                raise ValueError(f"probes must be a positive integer, got {probes!r}")
            omega = np.random.default_rng(seed).standard_normal((self.r, int(probes)))
        stats = self._project(u2, sigma, sink, out_dtype=out_dtype, verify=mode, gram=gram, omega=omega,
                              seed=seed)
        if omega is not None and stats is not None:
            stats["omega_u"] = omega.T @ u2
        return stats

    def to_scipy(self):
        """A ``scipy.sparse.linalg.LinearOperator`` (float64); each product is one pass."""
        return scipy_operator(self)

    # ------------------------------------------------------------------ the backend's part
    def _norms_pass(self) -> None:
        raise NotImplementedError

    def _matmat(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _rmatmat(self, y: np.ndarray, sink: Sink | None) -> np.ndarray | None:
        raise NotImplementedError

    def _hht(self, q: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _project(
        self, u: np.ndarray, sigma: np.ndarray, sink: Sink, *, out_dtype: Any, verify: str,
        gram: np.ndarray | None, omega: np.ndarray | None, seed: int = 0,
    ) -> dict[str, np.ndarray] | None:
        raise NotImplementedError


def scipy_operator(op: Any):
    """Wrap anything with ``shape``, ``matmat`` and ``rmatmat`` as a scipy LinearOperator."""
    from scipy.sparse.linalg import LinearOperator

    return LinearOperator(
        op.shape,
        dtype=np.float64,
        matvec=op.matmat,
        rmatvec=op.rmatmat,
        matmat=op.matmat,
        rmatmat=op.rmatmat,
    )
