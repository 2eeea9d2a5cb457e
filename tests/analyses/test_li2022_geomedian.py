"""Li et al. 2022 Fig. 1 reproduction (analyses.li2022_restricted_lipschitz.geomedian)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from analyses.li2022_restricted_lipschitz import geomedian as gm
from gradspec.tasks import A_DIAGONALS, make_task


def _task(spectrum: str, d: int = 30, n: int = 64, seed: int = 0):
    task = make_task("geomedian", seed=seed, d=d, spectrum=spectrum, d_min=10, n_train=n, n_eval=8, n_public=0)
    task.model.double()
    # the task's model holds A in float32; the reference here is float64 throughout
    task.model.a_diag = A_DIAGONALS[spectrum](d)
    return task


@pytest.mark.parametrize("spectrum", gm.SPECTRA)
def test_gradient_is_the_tasks_autograd_gradient(spectrum):
    task = _task(spectrum)
    points = task.train.tensors["points"]
    x = torch.randn(3, 30, dtype=torch.float64)
    a = A_DIAGONALS[spectrum](30).expand(3, 30)
    idx = torch.tensor([5, 17])
    ours = gm.make_grad_fn(points, a, task.model.eps)(x, idx)
    for r in range(3):
        for b, i in enumerate(idx.tolist()):
            with torch.no_grad():
                task.model.x.copy_(x[r])
            task.model.zero_grad()
            task.model(points[i : i + 1].double()).sum().backward()
            torch.testing.assert_close(ours[r, b], task.model.x.grad, rtol=1e-10, atol=1e-12)
    assert float(ours.norm(dim=-1).max()) <= 1.0  # G_0 = lambda_1(A^{1/2}) = 1: clipping never binds


@pytest.mark.parametrize("spectrum", gm.SPECTRA)
def test_structured_loss_equals_the_dense_loss(spectrum):
    task = _task(spectrum)
    points = task.train.tensors["points"].double()
    x = torch.randn(4, 30, dtype=torch.float64)
    a = A_DIAGONALS[spectrum](30).expand(4, 30)
    ours = gm.losses(x, a, points[:, :10], task.model.eps).mean(1)
    for r in range(4):
        with torch.no_grad():
            task.model.x.copy_(x[r])
            dense = task.model(points).mean()
        assert float(ours[r]) == pytest.approx(float(dense), rel=1e-12)


def test_empirical_minimiser_is_the_minimum():
    task = _task("sqrt", n=300)
    head = task.train.tensors["points"][:, :10].double()
    a_head = A_DIAGONALS["sqrt"](10)
    x_hat, gnorm = gm.empirical_minimiser(head, a_head, 1e-6)
    assert gnorm < 1e-10
    f = lambda x: float(gm.losses(x[None], a_head[None], head, 1e-6).mean())  # noqa: E731
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert f(x_hat) < f(x_hat + 1e-3 * torch.randn(10, generator=g, dtype=torch.float64))
    # and zero beyond d_min is optimal: any tail raises the loss (checked in d = 30)
    a30 = A_DIAGONALS["sqrt"](30)
    x30 = torch.cat([x_hat, torch.zeros(20, dtype=torch.float64)])
    tail = x30.clone()
    tail[15] = 1e-2
    assert float(gm.losses(x30[None], a30[None], head, 1e-6).mean()) < float(
        gm.losses(tail[None], a30[None], head, 1e-6).mean())


def test_population_minimiser_is_the_centre_of_symmetry():
    pop = gm.population_head(seed=5, n_pop=200_000, d_min=10)
    a = A_DIAGONALS["linear"](10)[None]
    star = torch.ones(1, 10, dtype=torch.float64)
    base = gm.losses(star, a, pop, 1e-6)[0]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        other = star + 0.2 * torch.randn(1, 10, generator=g, dtype=torch.float64)
        diff = gm.losses(other, a, pop, 1e-6)[0] - base
        assert float(diff.mean()) > 3 * float(diff.std()) / math.sqrt(diff.numel())


@pytest.mark.slow
def test_quick_mode_writes_a_sane_results_file(tmp_path):
    gm.main(["--quick", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["config"]["seeds"] == [0, 1, 2] and res["config"]["quick"]
    assert {r["spectrum"] for r in res["table"]} == set(gm.SPECTRA)
    for r in res["table"]:
        assert math.isfinite(r["growth_emp"]) and r["growth_emp"] > 0 and r["reproduced"] in ("yes", "no")
    for row in res["runs"]:
        for k in ("excess_emp_avg", "excess_emp_last", "excess_pop_avg", "excess_pop_last"):
            assert math.isfinite(row[k])
        assert row["excess_emp_avg"] > -1e-9  # above the exact empirical minimum
        if not row["private"]:
            assert row["sigma"] == 0
    assert len(res["runs"]) == 2 * 3 * 2 * 3  # dims x spectra x (private, non-private) x seeds
    assert (tmp_path / "fig1_excess_loss_vs_d.png").stat().st_size > 10_000
    assert "| claim | paper | ours | reproduced? |" in (tmp_path / "table.md").read_text()
