"""The exact method hands back the Gram matrix it computed."""

from __future__ import annotations

import numpy as np

from gradspec.linalg import pca


def test_exact_pca_returns_its_gram_matrix() -> None:
    h = np.random.default_rng(0).standard_normal((30, 500))
    res = pca(source=h, k=5, method="gram", rows=slice(4, 24))
    np.testing.assert_allclose(res.gram, h[4:24] @ h[4:24].T, rtol=1e-12, atol=1e-10)
    lam = np.linalg.eigvalsh(res.gram)[::-1][:5]
    np.testing.assert_allclose(res.sigma, np.sqrt(lam), rtol=1e-10)
    assert pca(source=h, k=5, method="krylov").gram is None
