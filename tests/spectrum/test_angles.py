"""Principal angles and eigengaps against dense float64 references (scipy, closed forms)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

from gradspec.spectrum import compare_subspaces, eigengap, principal_angles

CASES = [  # (p, k_a, k_b, seed)
    (50, 5, 5, 0),
    (200, 10, 3, 1),
    (30, 2, 12, 2),
    (1000, 40, 40, 3),
]


@pytest.mark.parametrize(("p", "ka", "kb", "seed"), CASES)
def test_matches_scipy_on_random_subspaces(p: int, ka: int, kb: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((p, ka)), rng.standard_normal((p, kb))
    ours = principal_angles(a, b)
    ref = np.sort(scipy.linalg.subspace_angles(a, b))
    assert ours.shape == (min(ka, kb),)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)
    assert np.all(np.diff(ours) >= 0)


def test_known_angles_and_small_angle_accuracy() -> None:
    # span{e1, cos t e2 + sin t e3} vs span{e1, e2}: angles exactly 0 and t, t down to 1e-9
    for t in (1e-9, 1e-4, 0.3, 1.2, np.pi / 2):
        a = np.zeros((5, 2))
        a[0, 0] = 1.0
        a[1, 1], a[2, 1] = np.cos(t), np.sin(t)
        b = np.eye(5)[:, :2]
        theta = principal_angles(a, b)
        np.testing.assert_allclose(theta, [0.0, t], rtol=1e-9, atol=1e-15)


def test_orthonormal_flag_and_torch_input_agree_with_qr_path() -> None:
    rng = np.random.default_rng(7)
    qa, _ = np.linalg.qr(rng.standard_normal((80, 6)))
    qb, _ = np.linalg.qr(rng.standard_normal((80, 6)))
    fast = principal_angles(torch.from_numpy(qa).float(), torch.from_numpy(qb).float(), orthonormal=True)
    ref = np.sort(scipy.linalg.subspace_angles(qa, qb))
    np.testing.assert_allclose(fast, ref, atol=1e-6)


def test_compare_subspaces_projection_distance_is_spectral_norm() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((60, 4)), rng.standard_normal((60, 4))
    cmp = compare_subspaces(a, b)
    qa, qb = np.linalg.qr(a)[0], np.linalg.qr(b)[0]
    dist = np.linalg.norm(qa @ qa.T - qb @ qb.T, 2)
    assert cmp.projection_distance == pytest.approx(dist, abs=1e-12)
    assert cmp.mean_cos2 == pytest.approx(np.linalg.norm(qa.T @ qb, "fro") ** 2 / 4, abs=1e-12)
    same = compare_subspaces(a, a @ rng.standard_normal((4, 4)))
    assert same.projection_distance < 1e-7 and same.mean_cos2 == pytest.approx(1.0)


def test_random_subspace_mean_cos2_is_k_over_p() -> None:
    rng = np.random.default_rng(11)
    p, k = 2000, 20
    vals = [compare_subspaces(rng.standard_normal((p, k)), rng.standard_normal((p, k))).mean_cos2
            for _ in range(20)]
    assert np.mean(vals) == pytest.approx(k / p, rel=0.15)


def test_eigengap() -> None:
    lam = [5.0, 3.0, 2.5, 0.5]
    assert eigengap(lam, 1) == 2.0
    assert eigengap(lam, 3) == 2.0
    assert eigengap(lam, 2, relative=True) == pytest.approx(0.1)
    assert eigengap(torch.tensor(lam, dtype=torch.float64), 2) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: principal_angles(np.ones((5, 2)), np.eye(6)[:, :2]), "different dimensions"),
        (lambda: principal_angles(np.ones((5, 2)), np.eye(5)[:, :2]), "linearly dependent"),
        (lambda: principal_angles(np.ones(5), np.eye(5)[:, :2]), "p x k"),
        (lambda: principal_angles(np.full((5, 1), np.nan), np.eye(5)[:, :1]), "NaN"),
        (lambda: compare_subspaces(np.eye(5)[:, :2], np.eye(5)[:, :3]), "equal rank"),
        (lambda: eigengap([3.0, 2.0], 2), "needs 3 eigenvalues"),
        (lambda: eigengap([1.0, 2.0, 0.0], 1), "sorted descending"),
        (lambda: eigengap([1.0, 0.0], 0), "k must be"),
    ],
)
def test_bad_inputs(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_second_moment_distance_matches_dense() -> None:
    from gradspec.spectrum import second_moment_distance

    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((7, 40)), rng.standard_normal((12, 40)) * 0.5 + 0.1
    dense = np.linalg.norm(a.T @ a / 7 - b.T @ b / 12, 2)
    assert second_moment_distance(a, b) == pytest.approx(dense, rel=1e-10)
    assert second_moment_distance(torch.from_numpy(a), a) == pytest.approx(0.0, abs=1e-10)
    with pytest.raises(ValueError, match="same width"):
        second_moment_distance(a, b[:, :10])


def test_davis_kahan_bound_holds_for_sampled_second_moments() -> None:
    from gradspec.spectrum import second_moment_distance

    # rows with a planted rank-3 structure: the top-3 subspace of a subsample lies within
    # the Davis-Kahan bound of the full set's (Zhou et al. 2021, Theorem 2's argument)
    rng = np.random.default_rng(9)
    basis = np.linalg.qr(rng.standard_normal((60, 3)))[0]
    full = rng.standard_normal((400, 3)) * [5.0, 4.0, 3.0] @ basis.T + 0.3 * rng.standard_normal((400, 60))
    sub = full[rng.choice(400, 80, replace=False)]
    def top(rows, k):
        w, v = np.linalg.eigh(rows.T @ rows / len(rows))
        return w[::-1], v[:, ::-1][:, :k]
    lam, v_full = top(full, 3)
    _, v_sub = top(sub, 3)
    sin_max = compare_subspaces(v_sub, v_full, orthonormal=True).projection_distance
    bound = 2 * second_moment_distance(sub, full) / eigengap(lam, 3)
    assert 0 < sin_max <= bound
