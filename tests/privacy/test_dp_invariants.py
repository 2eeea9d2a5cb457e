"""DP invariants of every registered private optimizer, through the real training step.

For each algorithm of the registry (:class:`gradspec.optim.Algorithm`; an algorithm
without a case in ``_dp_cases.CASES`` fails here) and both per-example backends, a
probed ``gradspec.optim.retrain`` run of a tiny task (10 steps, Poisson batches of
about 12 out of 48, several microbatches a step, a layer used twice) checks, step by step:

(a) the per-example gradient matrix has one row per example of the Poisson batch, and
    each row is that example's gradient alone (a batch-of-one autograd reference);
(b) every clipped row has norm <= C, and the clipped rows are what the step sums;
(c) removing one example (the accountant's add/remove-one relation) moves each
    pre-noise release by at most its stated sensitivity: the clipped sum (or its projection) by C — in fact by exactly the
    example's clipped row —, noisy AdaGrad's preconditioner G_t by ``sensitivity()``;
    public side information (projector bases, AdaDPS's A_t) does not move at all;
(d) the noise added to each release has the std that the accountant's mechanism stands
    for: noise multiplier x sensitivity (/ the step's denominator for the gradient);
(e) every noisy release is one accounted mechanism of the right (sigma, q), and the
    run's epsilon is dp-accounting's for those mechanisms.

The neighbouring run of (c) trains on D - {j} with the same other randomness: each
batch is the base run's batch without j (coupled Poisson sampling) and every step starts
from the base run's parameters, i.e. it is conditioned on the same released outputs, as
in the adaptive-composition argument the accountant relies on.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import dp_accounting as dpa
import pytest
import torch
from scipy import stats
from torch import Tensor, nn

from gradspec.optim import Algorithm, make_algorithm, retrain
from gradspec.privacy import RDP_ORDERS
from gradspec.tasks._base import Task, TensorData

from ._dp_cases import (
    BACKENDS,
    BATCH,
    CASES,
    CLIP,
    DELTA,
    MICROBATCH,
    N_TRAIN,
    SIGMA,
    STEPS,
    Z_B,
    Case,
    P,
    Probe,
    SharedMLP,
    config,
    shared_task,
    train,
)

#: Two-sided false-failure rate of each statistical noise check (see `_assert_standard_normal`).
ALPHA = 1e-6


# ---------------------------------------------------------------------- the runs
@dataclass
class Runs:
    case: Case
    base: Probe  # the run on D
    removed: int  # j: the training example in the most batches of the base run
    neighbour: Probe  # the coupled run on D - {j}


def _case_params() -> list:
    """Every registered algorithm with each of its cases; None marks one without a case."""
    params = []
    for algorithm in Algorithm:
        for case in CASES.get(algorithm) or [None]:
            params.append(pytest.param((algorithm, case),
                                       id=case.id if case else f"{algorithm}-NO-CASE"))
    return params


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models: torch's intra-op threads only add overhead (and spin on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def _cache(tmp_path_factory) -> dict:
    return {"root": tmp_path_factory.mktemp("dp-invariants")}


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(params=_case_params())
def runs(request, backend, _cache) -> Runs:
    algorithm, case = request.param
    if case is None:
        pytest.fail(f"the registered algorithm {str(algorithm)!r} has no DP-invariant case: "
                    "add one to CASES in tests/privacy/_dp_cases.py")
    key = (case.id, backend)
    if key not in _cache:
        _cache[key] = _train_pair(case, backend, _cache["root"] / f"{case.id}-{backend}")
    return _cache[key]


def _train_pair(case: Case, backend: str, out) -> Runs:
    base = train(case, backend, out / "D")
    batches = [s.batch for s in base.steps]
    j = int(torch.bincount(torch.cat(batches), minlength=N_TRAIN).argmax())
    shifted = [b[b != j] - (b[b != j] > j).long() for b in batches]  # indices into D - {j}
    neighbour = train(case, backend, out / "D-j", task=shared_task(drop=j),
                      thetas=[s.theta for s in base.steps], batches=shifted)
    return Runs(case, base, j, neighbour)


# ---------------------------------------------------------------------- helpers
def _rows(chunks: list[Tensor]) -> Tensor:
    return torch.cat(chunks) if chunks else torch.zeros(0, P)


def _reference_rows(theta: Tensor, batch: dict[str, Tensor], task: Task) -> Tensor:
    """Each example's gradient alone, by plain autograd on a batch of one."""
    model = SharedMLP()
    torch.nn.utils.vector_to_parameters(theta.clone(), model.parameters())
    rows = []
    for i in range(len(batch["x"])):
        one = {k: v[i : i + 1] for k, v in batch.items()}
        loss = task.loss(task.forward(model, one), one).sum()
        rows.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, model.parameters())]))
    return torch.stack(rows)


def _sqrt_psd(s: Tensor) -> Tensor:
    """G = S^{1/2}: the matrix square root, or the entrywise one of a diagonal S (a vector)."""
    s = s.double()
    if s.ndim == 1:
        return s.clamp(min=0).sqrt()
    evals, q = torch.linalg.eigh(s)
    return (q * evals.clamp(min=0).sqrt()) @ q.T


def _assert_standard_normal(x: Tensor, what: str) -> None:
    """x holds N independent draws that must be N(0, 1).

    Then sum x^2 ~ chi^2_N. We accept iff it lies between the chi^2_N quantiles at
    ALPHA/2 and 1 - ALPHA/2, so a correct implementation fails with probability 1e-6
    per check (about 3e-5 over the 22 checks of this module for a fresh seed; the seeds
    are fixed, so the outcome is deterministic). It accepts an empirical std within
    [0.78, 1.23] of the stated one for N = 240 (the smallest sample here: 24 coordinates
    x 10 steps), [0.82, 1.19] for N = 360, [0.92, 1.08] for N = 1710 (p = 171 x 10
    steps): a std off by sqrt(2) (a factor 2 in variance, as in a wrong sensitivity
    constant) fails every one of them.
    """
    x = x.double().flatten()
    n = x.numel()
    stat = float(x.square().sum())
    lo, hi = stats.chi2.ppf(ALPHA / 2, n), stats.chi2.isf(ALPHA / 2, n)
    ratio = math.sqrt(stat / n)
    assert lo <= stat <= hi, (
        f"{what}: empirical std / stated std = {ratio:.3f} over {n} draws; a correct noise "
        f"gives a ratio in [{math.sqrt(lo / n):.3f}, {math.sqrt(hi / n):.3f}] w.p. 1 - {ALPHA:g}"
    )


# ---------------------------------------------------------------------- the registry
def test_every_registered_algorithm_has_a_case():
    assert set(CASES) == set(Algorithm), "CASES must cover exactly the registered algorithms"
    ids = [c.id for cases in CASES.values() for c in cases]
    assert len(ids) == len(set(ids))
    for algorithm, cases in CASES.items():
        assert cases, f"{algorithm} has an empty case list"
        for case in cases:
            assert case.algorithm == algorithm
            assert case.hooks().name == str(algorithm)  # the case builds what it claims


# ---------------------------------------------------------------------- (a)
def test_one_gradient_row_per_example(runs):
    task = shared_task()
    steps = runs.base.steps
    assert len(steps) == STEPS
    sizes = [len(s.batch) for s in steps]
    assert len(set(sizes)) > 1, "Poisson batches should vary in size"
    for s in steps:
        rows = _rows(s.rows)
        assert rows.shape == (len(s.batch), P), f"step {s.index}: {len(s.batch)} examples"
        assert all(0 < len(r) <= MICROBATCH for r in s.rows)
    assert max(len(s.rows) for s in steps) > 1, "some step should span several microbatches"
    for s in steps[:3]:
        expected = _reference_rows(s.theta, task.train.batch(s.batch), task)
        torch.testing.assert_close(_rows(s.rows), expected, rtol=1e-4, atol=1e-6)


class _BatchSharedInput(nn.Module):
    """Position embeddings looked up with ids of batch size 1, broadcast over the batch
    (as GPT-2's ``wpe``): a layer Opacus's hooks sum over the examples."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(10, 4)
        self.pos = nn.Embedding(5, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, tokens: Tensor) -> Tensor:
        pos = self.pos(torch.arange(tokens.shape[1], device=tokens.device)[None])
        return self.head((self.tok(tokens) + pos).mean(1))


def _batch_shared_task() -> Task:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 10, (40, 5), generator=g)
    labels = torch.randint(0, 3, (40,), generator=g)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _BatchSharedInput()
    return Task(name="batch-shared", model=model,
                train=TensorData({"tokens": tokens[:32], "labels": labels[:32]}),
                eval=TensorData({"tokens": tokens[32:], "labels": labels[32:]}),
                forward=lambda call, b: call(b["tokens"]), params=("pos.weight",))


def test_a_batch_shared_input_gets_one_row_per_example_or_is_refused(backend, tmp_path):
    """The trained parameter's layer sees one input for the whole batch. Either each
    example gets its own row, or the run refuses before releasing anything; one summed
    row clipped as if it were one example would break the sensitivity silently."""
    task = _batch_shared_task()
    reference = copy.deepcopy(task.model)
    probe = Probe(make_algorithm("dp-sgd"))
    try:
        with probe.patched():
            probe.result = retrain(config=config(backend, steps=3, microbatch=None), out=tmp_path,
                                   algorithm=probe.hooks, task=task)
    except ValueError as err:  # a refusal names the parameter it cannot differentiate
        assert "pos.weight" in str(err), err
        assert all(s.noisy is None and not s.mechanisms for s in probe.steps), "released first"
        return
    for s in probe.steps:
        with torch.no_grad():
            reference.pos.weight.copy_(s.theta.view_as(reference.pos.weight))
        expected = []
        for i in s.batch.tolist():
            one = task.train.batch([i])
            loss = task.loss(task.forward(reference, one), one).sum()
            expected.append(torch.autograd.grad(loss, reference.pos.weight)[0].flatten())
        torch.testing.assert_close(_rows(s.rows), torch.stack(expected), rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------- (b)
def test_every_clipped_row_has_norm_at_most_C(runs):
    clipped_any = False
    for s in runs.base.steps:
        pre = _rows(s.pre)
        torch.testing.assert_close(torch.cat(s.norms).double(), pre.double().norm(dim=1), rtol=1e-5, atol=1e-7)
        clipped = s.clipped
        norms = clipped.double().norm(dim=1)
        assert float(norms.max()) <= CLIP, f"step {s.index}: a clipped norm > C (exactly, float64)"
        short = pre.norm(dim=1) <= CLIP
        torch.testing.assert_close(clipped[short], pre[short])  # short rows are left alone
        clipped_any |= bool((~short).any())
        # these rows are what the step sums into the clipped sum it releases
        torch.testing.assert_close(clipped.sum(0), s.total, rtol=1e-5, atol=1e-6 * CLIP)
    assert clipped_any, "no row was clipped: the bound was not exercised"


# ---------------------------------------------------------------------- (c)
def test_removing_one_example_moves_each_release_by_at_most_its_sensitivity(runs):
    case, j = runs.case, runs.removed
    projector = getattr(runs.base.hooks, "projector", None)
    present = 0
    for s, t in zip(runs.base.steps, runs.neighbour.steps, strict=True):
        torch.testing.assert_close(t.theta, s.theta, rtol=0, atol=0)  # the same trajectory
        change = (s.release.double() - t.release.double())
        if j in s.batch:
            present += 1
            row = s.clipped[int((s.batch == j).nonzero())].double()
            expected = row
            if case.pre_noise == "project":
                expected = projector.project(row).double()
            elif case.pre_noise == "complement":
                expected = projector.project_out(row).double()
            # D and D - {j} differ by exactly j's (projected) clipped contribution ...
            torch.testing.assert_close(change, expected, rtol=1e-4, atol=1e-5 * CLIP)
            # ... so the released sum moves by at most C
            assert float(change.norm()) <= CLIP * (1 + 1e-5), f"step {s.index}"
        else:
            assert float(change.abs().max()) <= 1e-6 * CLIP, f"step {s.index}: j not in batch"
    assert present >= 2
    if case.public:  # public side information is computed without the private data
        for s, t in zip(runs.base.steps, runs.neighbour.steps, strict=True):
            torch.testing.assert_close(t.public, s.public, rtol=0, atol=1e-6)
    if case.preconditioner is None:
        return
    ratios = []
    for s, t in zip(runs.base.steps, runs.neighbour.steps, strict=True):
        # the statistic the hooks release is S_t^{1/2} (entrywise for the diagonal variant)
        torch.testing.assert_close(s.statistic, _sqrt_psd(s.second_moment), rtol=1e-6, atol=1e-9)
        gap = float((s.statistic - t.statistic).norm())
        assert gap <= s.sensitivity * (1 + 1e-6), (
            f"step {s.index}: ||G_t(D) - G_t(D - j)||_F = {gap:.4g} > stated {s.sensitivity:.4g}")
        ratios.append(gap / s.sensitivity)
    assert max(ratios) > 0.05, "the preconditioner did not depend on the removed example"


# A dataset on which noisy AdaGrad's preconditioner attains nearly sqrt(2) L sqrt(t) / n:
# per-example losses w . x_i (gradient x_i at every w), seven examples along e_1 and
# one, j = 0, along e_2, all of norm 3 > C = 1, in every batch (q = 1). Then
# z_t = (7 e_1 + e_2) C / 8 on D and 7 e_1 C / 8 on D - {j}: two vectors of almost equal
# norm at a small angle theta, for which ||G_t(D) - G_t(D')||_F = sqrt(2) cos(theta / 2)
# sqrt(t) C / n = 0.9975 sqrt(2) sqrt(t) C / n (Araki-Yamagami: sqrt(2) is the sharp
# constant of || |A| - |B| ||_F <= sqrt(2) ||A - B||_F). The diagonal preconditioner
# moves by exactly sqrt(t) C / n here (its bound, by the triangle inequality).
_ALIGNED_N, _ALIGNED_D, _ALIGNED_STEPS = 8, 4, 4


def _aligned_task() -> Task:
    x = torch.zeros(_ALIGNED_N + 1, _ALIGNED_D)
    x[0, 1] = 3.0
    x[1:_ALIGNED_N, 0] = 3.0
    x[_ALIGNED_N, 2] = 1.0  # the one evaluation example
    model = nn.Linear(_ALIGNED_D, 1, bias=False)
    nn.init.zeros_(model.weight)
    return Task(name="aligned", model=model, train=TensorData({"x": x[:_ALIGNED_N]}),
                eval=TensorData({"x": x[_ALIGNED_N:]}),
                forward=lambda call, b: call(b["x"]).squeeze(-1),
                loss=lambda out, b: out, metrics=lambda out, b: {}, params=("weight",))


@pytest.mark.parametrize("variant", ["matrix", "diagonal"])
def test_noisy_adagrad_preconditioner_sensitivity_on_a_worst_case_dataset(variant, backend,
                                                                          tmp_path):
    options = dict(projector="spectrum", basis=torch.eye(_ALIGNED_D)[:, :3], rank=3,
                   precond_noise_multiplier=1.0, diagonal=variant == "diagonal")
    kw = dict(steps=_ALIGNED_STEPS, batch_size=_ALIGNED_N, max_grad_norm=1.0, noise_multiplier=1.0)
    base = train(make_algorithm("noisy-adagrad", **options), backend, tmp_path / "D",
                 task=_aligned_task(), **kw)
    assert all(len(s.batch) == _ALIGNED_N for s in base.steps)  # q = 1
    neighbour = train(make_algorithm("noisy-adagrad", **options), backend, tmp_path / "D-j",
                      task=_aligned_task(), thetas=[s.theta for s in base.steps],
                      batches=[s.batch[s.batch != 0] for s in base.steps], **kw)
    for s, t in zip(base.steps, neighbour.steps, strict=True):
        gap = float((s.statistic - t.statistic).norm())
        lemma = 1.0 * math.sqrt(s.index + 1) / _ALIGNED_N  # L sqrt(t) / n, L = C = 1
        # the dataset does attain (nearly) the worst case it was built for
        assert gap >= (1.4 if variant == "matrix" else 0.999) * lemma
        assert gap <= s.sensitivity * (1 + 1e-6), (
            f"step {s.index}: ||G_t(D) - G_t(D - j)||_F = {gap:.5g} > stated {s.sensitivity:.5g}")


# ---------------------------------------------------------------------- (d)
def test_noise_std_matches_the_accounted_mechanism(runs):
    case, base = runs.case, runs.base
    ctx = base.ctx
    denominator = ctx.sample_rate * ctx.n  # the expected batch size, what the step divides by
    assert ctx.denominator == denominator
    gradient, preconditioner = [], []
    for s in base.steps:
        # the trainer accounts the gradient release first, then the hooks their own
        kind, sigma = s.mechanisms[0][:2]
        assert (kind, sigma) == case.mechanisms[0], f"step {s.index}: gradient accounted as {kind}"
        std = sigma * CLIP / denominator  # noise multiplier x sensitivity / denominator
        noise = s.noisy.double() - s.release.double() / denominator
        if case.noise_space == "subspace":
            v = base.hooks.projector.basis.double()
            coords = noise @ v
            assert float((noise - v @ coords).abs().max()) <= 1e-4 * std, "noise off the subspace"
            noise = coords
        gradient.append(noise / std)
        if case.preconditioner is None:
            continue
        ((_, z, _, _),) = s.mechanisms[1:]
        std = z * s.sensitivity  # in the Frobenius-isometric coordinates of symmetric matrices
        m = s.statistic_release - s.statistic  # the noise the release carries
        if case.preconditioner == "matrix":
            torch.testing.assert_close(m, m.T)
            upper = torch.triu_indices(m.shape[0], m.shape[0], 1)
            m = torch.cat([m.diagonal(), math.sqrt(2) * m[upper[0], upper[1]]])
        preconditioner.append(m / std)
    _assert_standard_normal(torch.cat(gradient), "gradient noise")
    if case.preconditioner is not None:
        _assert_standard_normal(torch.cat(preconditioner), "preconditioner noise")


# ---------------------------------------------------------------------- (e)
def test_every_noisy_release_is_one_accounted_mechanism(runs):
    case, base = runs.case, runs.base
    q = BATCH / N_TRAIN
    assert base.ctx.sampler.q == pytest.approx(q, rel=1e-12)
    expected = sorted(case.mechanisms)
    for s in base.steps:
        assert len(s.draws) == len(case.mechanisms), f"step {s.index}: noise draws"
        assert sum(m[3] for m in s.mechanisms) == len(s.draws), f"step {s.index}: accounted"
        got = sorted((kind, sigma) for kind, sigma, _, _ in s.mechanisms)
        assert got == expected, f"step {s.index}: accounted {got}, released {expected}"
        for kind, _, rate, _ in s.mechanisms:
            assert rate == pytest.approx(q if kind == "poisson" else 1.0, rel=1e-12)
    parts = []
    for kind, sigma in case.mechanisms:
        event = dpa.GaussianDpEvent(sigma)
        if kind == "poisson":
            event = dpa.PoissonSampledDpEvent(q, event)
        parts.append(dpa.SelfComposedDpEvent(event, STEPS))
    accountant = dpa.rdp.RdpAccountant(list(RDP_ORDERS), dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    epsilon = accountant.compose(dpa.ComposedDpEvent(parts)).get_epsilon(DELTA)
    assert math.isfinite(epsilon) and epsilon > 0
    assert base.result.epsilon == pytest.approx(epsilon, rel=1e-9)


def test_noisy_adagrad_epsilon_is_that_of_2t_plain_gaussians(tmp_path):
    """Pinned: a noisy-AdaGrad run's epsilon is dp-accounting's for T Gaussians (sigma) and
    T Gaussians (z_B), with no amplification by subsampling (its preconditioner reads the
    sampled batches; see ``gradspec.optim._adagrad``), and above the amplified figure."""
    (case,) = [c for c in CASES[Algorithm.NOISY_ADAGRAD] if c.variant == "diagonal"]
    probe = train(case, "vmap", tmp_path / "run")
    for s in probe.steps:
        assert [m[:2] for m in s.mechanisms] == [("gaussian", SIGMA), ("gaussian", Z_B)]
    relation = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    composed = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(SIGMA), STEPS),
                                    dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(Z_B), STEPS)])
    epsilon = dpa.rdp.RdpAccountant(list(RDP_ORDERS), relation).compose(composed).get_epsilon(DELTA)
    # the same composition in closed form: one Gaussian of multiplier (T / s^2 + T / z_B^2)^-1/2
    single = dpa.GaussianDpEvent((STEPS / SIGMA**2 + STEPS / Z_B**2) ** -0.5)
    assert epsilon == pytest.approx(
        dpa.rdp.RdpAccountant(list(RDP_ORDERS), relation).compose(single).get_epsilon(DELTA), rel=1e-9)
    assert probe.result.epsilon == pytest.approx(epsilon, rel=1e-9)
    assert "without subsampling amplification" in probe.result.accounting
    amplified = dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(BATCH / N_TRAIN, dpa.GaussianDpEvent(SIGMA)), STEPS),
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(Z_B), STEPS)])
    assert epsilon > dpa.rdp.RdpAccountant(list(RDP_ORDERS), relation).compose(amplified).get_epsilon(DELTA)
