"""The optimizers inside the real DP-SGD loop: reductions, low-rank recovery, privacy, resume."""

from __future__ import annotations

import json

import dp_accounting as dpa
import pytest
import torch

from gradspec.collect import collect
from gradspec.optim import (
    PDPSGD,
    AdaDPS,
    DPAdam,
    FixedProjector,
    NoisyAdaGrad,
    RandomProjector,
    SubspaceRetrain,
    make_algorithm,
    retrain,
)
from gradspec.privacy import RDP_ORDERS
from gradspec.tasks.lowrank import row_space_basis
from gradspec.train import StepHooks

from ._cases import LOWRANK, config, lowrank_task

D = LOWRANK["d"]


def train(cfg, hooks, tmp_path, name, **kw) -> torch.Tensor:
    task = lowrank_task(seed=cfg.seed)
    collect(cfg, out=tmp_path / name, task=task, hooks=hooks, write_store=False, **kw)
    return task.model.weight.detach().clone()


REDUCTIONS = [  # (id, hooks that must reduce to DP-SGD with k = p, exact?)
    ("subspace-full-noise", lambda: SubspaceRetrain(FixedProjector(torch.eye(D))), True),
    ("subspace-noise-in-subspace",
     lambda: SubspaceRetrain(FixedProjector(torch.eye(D)), noise="subspace"), True),
    ("pdp-random-k=p", lambda: PDPSGD(RandomProjector(D, seed=1)), False),
    ("adadps-all-ones", lambda: AdaDPS(rule="fixed", side_information=torch.ones(D)), True),
]


@pytest.mark.parametrize("sigma", [0.0, 1.0], ids=["sigma0", "sigma1"])
@pytest.mark.parametrize(("make", "exact"), [pytest.param(m, e, id=i) for i, m, e in REDUCTIONS])
def test_with_k_equal_p_each_reduces_to_dp_sgd(tmp_path, make, exact, sigma):
    cfg = config(noise_multiplier=sigma)
    ref = train(cfg, StepHooks(), tmp_path, "ref")
    got = train(cfg, make(), tmp_path, "got")
    if exact:
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    else:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sigma", [0.0, 1.0], ids=["sigma0", "sigma1"])
def test_dp_adam_hooks_equal_adam_on_the_privatised_gradient(tmp_path, sigma):
    ref = train(config(noise_multiplier=sigma, optimizer="adam", lr=0.05), StepHooks(), tmp_path, "ref")
    got = train(config(noise_multiplier=sigma, optimizer="sgd", lr=0.05), DPAdam(), tmp_path, "got")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def _final_loss(tmp_path, name, hooks, **kw) -> float:
    cfg = config(noise_multiplier=0.0, steps=40, lr=0.5, **kw)
    task = lowrank_task()
    res = collect(cfg, out=tmp_path / name, task=task, hooks=hooks, write_store=False)
    return res.final_metrics["eval_loss"]


def test_lowrank_projected_training_with_the_true_rank_matches_full_training(tmp_path):
    """Gradients of the lowrank task lie in its rank-r row space: projecting onto it
    (fixed, or estimated from public gradients) changes nothing without noise."""
    r = LOWRANK["r"]
    full = _final_loss(tmp_path, "full", StepHooks())
    start = lowrank_task().eval.tensors["targets"].square().mean().item() / 2  # loss at w = 0
    assert full < 0.2 * start  # training did something
    basis = row_space_basis(lowrank_task())
    fixed = _final_loss(tmp_path, "fixed", SubspaceRetrain(FixedProjector(basis, rank=r)))
    public = _final_loss(tmp_path, "public", make_algorithm("pdp-sgd", rank=r, public_size=20))
    assert fixed == pytest.approx(full, rel=1e-4)
    assert public == pytest.approx(full, rel=1e-4)
    # a rank below the truth cannot get there
    low = _final_loss(tmp_path, "low", SubspaceRetrain(FixedProjector(basis, rank=r - 2)))
    assert low > 2 * full


@pytest.mark.parametrize("method", ["rdp", "pld"])
def test_noisy_adagrad_epsilon_composes_gradient_and_preconditioner_noise(tmp_path, method):
    """epsilon = T Gaussians (sigma; not amplified by subsampling: the preconditioner reads
    the sampled batches) composed with T Gaussians (z_B), computed here with dp-accounting
    directly (PLD to its discretisation, RDP exactly)."""
    sigma, z_b, steps = 1.3, 8.0, 8
    cfg = config(noise_multiplier=sigma, steps=steps, accounting=method, log_every=steps)
    hooks = NoisyAdaGrad(RandomProjector(3, seed=0), precond_noise_multiplier=z_b)
    res = retrain(config=cfg, algorithm=hooks, out=tmp_path / "run", task=lowrank_task())
    event = dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(sigma), steps),
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z_b), steps),
    ])
    if method == "rdp":
        acc = dpa.rdp.RdpAccountant(list(RDP_ORDERS), dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
        expected, rel = acc.compose(event).get_epsilon(res.delta), 1e-9
    else:
        acc = dpa.pld.PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
        expected, rel = acc.compose(event).get_epsilon(res.delta), 2e-2
    assert res.epsilon == pytest.approx(expected, rel=rel)
    if method == "pld":
        return
    # and it is more than the gradient noise alone
    alone = retrain(config=cfg, algorithm="dp-sgd", out=tmp_path / "alone", task=lowrank_task())
    assert res.epsilon > alone.epsilon * 1.01


RESUMABLE = {
    "subspace": lambda: make_algorithm("subspace", projector="random", rank=3, noise="subspace"),
    "pdp-sgd": lambda: make_algorithm("pdp-sgd", rank=3, public_size=20, period=3),
    "rpdp-sgd": lambda: make_algorithm("rpdp-sgd", rank=4, start_epoch=0.5),
    "noisy-adagrad": lambda: make_algorithm("noisy-adagrad", rank=3, public_size=20, period=2,
                                            precond_noise_multiplier=5.0),
    "noisy-adagrad-diag": lambda: make_algorithm("noisy-adagrad", projector="random", rank=3,
                                                 diagonal=True, precond_noise_multiplier=5.0),
    "adadps-rmsprop": lambda: make_algorithm("adadps", public_size=20),
    "adadps-adam": lambda: make_algorithm("adadps", rule="adam", public_size=20, public_batch=8),
    "dp-adam": lambda: make_algorithm("dp-adam"),
}


def _metrics(path):
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in open(path)]


@pytest.mark.parametrize("name", list(RESUMABLE))
def test_hooks_state_round_trips_through_resume(tmp_path, name):
    cfg = config(lr=0.1)
    full = train(cfg, RESUMABLE[name](), tmp_path, "full")
    train(cfg, RESUMABLE[name](), tmp_path, "part", stop_after=3)  # checkpoint mid-run
    task = lowrank_task()
    collect(out=tmp_path / "part", task=task, hooks=RESUMABLE[name](), write_store=False, resume=True)
    torch.testing.assert_close(task.model.weight.detach(), full, rtol=0, atol=0)
    assert _metrics(tmp_path / "full" / "metrics.jsonl") == _metrics(tmp_path / "part" / "metrics.jsonl")


def test_resume_with_other_hooks_settings_is_refused(tmp_path):
    cfg = config()
    train(cfg, make_algorithm("rpdp-sgd", rank=4, seed=0), tmp_path, "part", stop_after=3)
    with pytest.raises(ValueError, match="seed"):
        collect(out=tmp_path / "part", task=lowrank_task(), resume=True, write_store=False,
                hooks=make_algorithm("rpdp-sgd", rank=4, seed=1))
