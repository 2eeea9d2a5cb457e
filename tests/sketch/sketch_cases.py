"""Synthetic H with known spectra, sketched by a dense Gaussian J-block S, in a real store.

H = U·diag(σ)·Vᵀ (r×p, U and V Haar-random) with σ flat, a power law k^-0.6 or k^-1, or
exactly low rank. The first ``n_exact`` columns are stored as they are; the others are
sketched block by block: Y_j = H_s·S_jᵀ/√(J·m), S_j (m×(p − n_exact)) i.i.d. N(0, 1), so
E[J·Y_j·Y_jᵀ] = H_s·H_sᵀ. The store's columns are block-major (exact, block 0, block 1,
...), as ``gradspec collect --sketch`` writes them.

``explicit=False`` draws S_j·V_s (m×rank, the only part of S that reaches Y) directly: for
a Gaussian S and V_s with orthonormal columns it *is* an m×rank matrix of i.i.d. N(0, 1)
entries, so Y has exactly the distribution of the explicit sketch at r²·M instead of r·p·M
flops (the large-M and many-seed cases).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gradspec.store import GradientStore, ParamLayout, update_attrs

SKETCH_KEY = "gradspec.sketch"  # gradspec.store's SKETCH_KEY (the collector's schema)


def spectrum(kind: str, r: int) -> np.ndarray:
    i = np.arange(1, r + 1, dtype=np.float64)
    if kind == "flat":
        return np.ones(r)
    if kind == "power06":
        return i**-0.6
    if kind == "power1":
        return i**-1.0
    if kind == "lowrank":
        s = np.zeros(r)
        s[: r // 5] = i[: r // 5] ** -0.5
        return s
    raise ValueError(kind)


@dataclass(frozen=True)
class SketchCase:
    kind: str
    r: int
    p: int
    M: int
    J: int
    seed: int
    n_exact: int = 0
    explicit: bool = True

    @property
    def id(self) -> str:
        return f"{self.kind}-r{self.r}-M{self.M}-J{self.J}-s{self.seed}" + ("-exact" if self.n_exact else "")

    def matrix(self) -> np.ndarray:
        """H (r×p, float64) with the case's spectrum, scaled so σ_1 = 1."""
        rng = np.random.default_rng([self.seed, 1])
        u = np.linalg.qr(rng.standard_normal((self.r, self.r)))[0]
        v = np.linalg.qr(rng.standard_normal((self.p, self.r)))[0]
        return (u * spectrum(self.kind, self.r)) @ v.T

    def sketch(self, h: np.ndarray) -> tuple[np.ndarray, dict]:
        """(Y r×(n_exact + M) float64, the ``gradspec.sketch`` attribute)."""
        rng = np.random.default_rng([self.seed, 2])
        m = self.M // self.J
        e = self.n_exact
        hs = h[:, e:]
        cols = [h[:, :e]]
        if not self.explicit:
            us, ss, _ = np.linalg.svd(hs, full_matrices=False)
            us, ss = us[:, ss > 1e-12 * ss[0]], ss[ss > 1e-12 * ss[0]]
        for _ in range(self.J):
            if self.explicit:
                s = rng.standard_normal((m, hs.shape[1]))
                cols.append(hs @ s.T / np.sqrt(self.J * m))
            else:
                g = rng.standard_normal((m, ss.size))  # S_j·V_s: i.i.d. N(0, 1)
                cols.append((us * ss) @ g.T / np.sqrt(self.J * m))
        y = np.concatenate(cols, axis=1)
        attr = {
            "kind": "dense-gaussian-test", "version": 1, "seed": self.seed, "M": e + self.J * m,
            "requested_M": self.M, "p": self.p,
            "blocks": [[[e + j * m, e + (j + 1) * m]] for j in range(self.J)],
            "exact": [[0, e]] if e else [],
            "scale": 1 / np.sqrt(self.J),
            "params": [{"name": "w", "shape": [self.p], "offset": 0, "kind": "dense"}],
        }
        return y, attr


def write_sketched(path, y: np.ndarray, attr: dict | None, *, cols_per_chunk: int = 1000) -> GradientStore:
    """A per-example gradient store of the rows y, with ``gradspec.sketch`` = attr (None: a plain
    store of y)."""
    r, m = y.shape
    layout = ParamLayout.from_shapes([("cols", (m,))])
    kw = dict(layout=layout, per_example=True, rows_per_chunk=16, cols_per_chunk=cols_per_chunk)
    try:
        store = GradientStore.create(path, sketch=attr, **kw) if attr is not None else GradientStore.create(path, **kw)
    except TypeError:  # a store layer without the sketch argument: set the attribute itself
        store = GradientStore.create(path, **kw)
        update_attrs(store._group, {SKETCH_KEY: attr})
    n_norms = len(attr["params"]) if attr is not None else 1
    meta = {f: np.zeros(r) for f in store.meta_fields}
    meta["example_index"] = np.arange(r)
    meta["clip_factor"] = np.ones(r)
    meta["pre_clip_norm"] = np.linalg.norm(y, axis=1)
    meta["param_norms"] = np.zeros((r, n_norms))
    store.write_rows(0, y.astype(np.float32), meta)
    store.commit(r)
    return GradientStore.open(path)
