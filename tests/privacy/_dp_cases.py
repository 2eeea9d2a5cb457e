"""Cases and a probe for the DP-invariant tests (``test_dp_invariants.py``).

* A tiny classification task whose model uses one layer twice (a shared parameter) and
  has disjoint private (train), held-out (eval) and public splits.
* One or more configurations per registered private optimizer (:data:`CASES`, keyed by
  :class:`gradspec.optim.Algorithm`; the tests fail for an algorithm that has none).
* :class:`Probe`, which records from inside a real ``gradspec.optim.retrain`` run what
  each DP-SGD step computed: the Poisson batch, the per-example rows, the clip factors,
  the clipped sum, the pre-noise release, the noisy gradient, every DP noise draw and
  every mechanism handed to the accountant. It wraps methods of the hooks instance, of
  the run's sampler and accountant, and the library's single noise function
  (``gradspec.privacy.gaussian_noise``) and ``clip_factors``; the training step itself
  is the library's.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from gradspec.optim import Algorithm, RetrainResult, make_algorithm, retrain
from gradspec.tasks._base import Task, TensorData
from gradspec.train import CollectConfig, StepContext, StepHooks

N_TRAIN, N_EVAL, N_PUBLIC = 48, 24, 32
D_IN, HIDDEN, CLASSES = 6, 8, 3
P = (D_IN * HIDDEN + HIDDEN) + 2 * HIDDEN + (HIDDEN * HIDDEN + HIDDEN) + (HIDDEN * CLASSES + CLASSES)
CLIP = 1.8  # C: about half the per-example gradients of the task are longer
BATCH = 12  # expected Poisson batch size: q = 12 / 48
STEPS = 10
SIGMA = 0.8
Z_B = 1.5  # noisy AdaGrad's preconditioner noise multiplier
MICROBATCH = 5  # several microbatches per step
DELTA = 1e-5
BACKENDS = ("vmap", "hooks")


# ---------------------------------------------------------------------- the task
class SharedMLP(nn.Module):
    """x -> LayerNorm(tanh(W_in x)) -> tanh(W_s .) -> tanh(W_s .) -> W_out: W_s used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.fc_in = nn.Linear(D_IN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.shared = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(torch.tanh(self.fc_in(x)))
        h = torch.tanh(self.shared(h))
        h = torch.tanh(self.shared(h))  # the same weights a second time
        return self.head(h)


def _forward(call: Callable[..., Tensor], batch: dict[str, Tensor]) -> Tensor:
    return call(batch["x"])


def _ce(outputs: Tensor, batch: dict[str, Tensor]) -> Tensor:
    return nn.functional.cross_entropy(outputs, batch["labels"], reduction="none")


def shared_task(*, drop: int | None = None, seed: int = 0) -> Task:
    """The task; ``drop=j`` removes training example j (the neighbouring dataset D - {j})."""
    g = torch.Generator().manual_seed(seed)
    n = N_TRAIN + N_EVAL + N_PUBLIC
    x = torch.randn(n, D_IN, generator=g)
    labels = (x @ torch.randn(D_IN, CLASSES, generator=g)).argmax(1)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = SharedMLP()
    keep = torch.tensor([i for i in range(N_TRAIN) if i != drop])
    split = {"train": keep, "eval": torch.arange(N_TRAIN, N_TRAIN + N_EVAL),
             "public": torch.arange(N_TRAIN + N_EVAL, n)}
    data = {k: TensorData({"x": x[i], "labels": labels[i]}) for k, i in split.items()}
    return Task(name="dp-invariants", model=model, train=data["train"], eval=data["eval"],
                public=data["public"], forward=_forward, loss=_ce, params=("*",),
                config={"seed": seed, "drop": drop})


def config(backend: str, **kw: Any) -> CollectConfig:
    base = dict(task="dp-invariants", steps=STEPS, batch_size=BATCH, sampling="poisson",
                max_grad_norm=CLIP, noise_multiplier=SIGMA, accounting="rdp", delta=DELTA,
                optimizer="sgd", lr=0.2, eval_every=0, log_every=STEPS, checkpoint_every=STEPS,
                microbatch=MICROBATCH, backend=backend, seed=0)
    base.update(kw)
    return CollectConfig(**base)


def orthonormal(p: int, k: int, seed: int = 0) -> Tensor:
    q, _ = torch.linalg.qr(torch.randn(p, k, generator=torch.Generator().manual_seed(seed),
                                       dtype=torch.float64))
    return q


# ---------------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    """One configuration of a registered algorithm.

    Attributes:
        algorithm: the registry name.
        variant: a short label ('' for the default configuration).
        options: ``make_algorithm`` options.
        mechanisms: the noisy releases of one step, as (kind, noise multiplier), the
            gradient's first: ``poisson`` (the Poisson-subsampled gradient) or ``gaussian``
            (not subsampled); each must be one noise draw and one accounted mechanism.
        pre_noise: how the clipped sum becomes the pre-noise release: ``sum`` (as is),
            ``project`` (``V V^T`` of the hooks' projector, fixed-subspace retraining) or
            ``complement`` (``I - V V^T``, retraining in the complement).
        noise_space: where the gradient noise lives: ``full`` (all p coordinates) or
            ``subspace`` (the projector's k coordinates).
        preconditioner: noisy AdaGrad's second release: ``matrix`` (G_t = S_t^{1/2}) or
            ``diagonal`` (sqrt(diag S_t)); None when there is none.
        public: the algorithm uses public data (its public state must not depend on the
            private training set).
    """

    algorithm: Algorithm
    variant: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    mechanisms: tuple[tuple[str, float], ...] = (("poisson", SIGMA),)
    pre_noise: str = "sum"
    noise_space: str = "full"
    preconditioner: str | None = None
    public: bool = False

    @property
    def id(self) -> str:
        return f"{self.algorithm}-{self.variant}" if self.variant else str(self.algorithm)

    def hooks(self) -> StepHooks:
        return make_algorithm(self.algorithm, **self.options)


_BASIS = dict(projector="spectrum", rank=24, basis=orthonormal(P, 24))
_PUBLIC = dict(public_size=N_PUBLIC)
# Noisy AdaGrad's preconditioner reads the sampled batches, so the gradient is accounted
# without amplification by subsampling: two plain Gaussians a step, no q recorded.
_PRECONDITIONED = (("gaussian", SIGMA), ("gaussian", Z_B))

CASES: dict[Algorithm, list[Case]] = {
    Algorithm.DP_SGD: [Case(Algorithm.DP_SGD)],
    Algorithm.SUBSPACE: [
        Case(Algorithm.SUBSPACE, "full-noise", _BASIS, pre_noise="project"),
        Case(Algorithm.SUBSPACE, "subspace-noise", {**_BASIS, "noise": "subspace"},
             pre_noise="project", noise_space="subspace"),
    ],
    Algorithm.COMPLEMENT: [Case(Algorithm.COMPLEMENT, "", _BASIS, pre_noise="complement")],
    Algorithm.PDP_SGD: [Case(Algorithm.PDP_SGD, "", {"rank": 6, **_PUBLIC}, public=True)],
    Algorithm.RPDP_SGD: [Case(Algorithm.RPDP_SGD, "", {"rank": 6, "seed": 1})],
    Algorithm.NOISY_ADAGRAD: [
        Case(Algorithm.NOISY_ADAGRAD, "matrix",
             {"rank": 8, "precond_noise_multiplier": Z_B, **_PUBLIC},
             mechanisms=_PRECONDITIONED, preconditioner="matrix", public=True),
        Case(Algorithm.NOISY_ADAGRAD, "diagonal",
             {"rank": 24, "diagonal": True, "precond_noise_multiplier": Z_B, **_PUBLIC},
             mechanisms=_PRECONDITIONED, preconditioner="diagonal", public=True),
    ],
    Algorithm.ADADPS: [
        Case(Algorithm.ADADPS, "rmsprop", {"rule": "rmsprop", **_PUBLIC, "public_batch": 8},
             public=True),
        Case(Algorithm.ADADPS, "fixed",
             {"rule": "fixed", "side_information": torch.linspace(0.5, 2.0, P)}),
    ],
    Algorithm.DP_ADAM: [Case(Algorithm.DP_ADAM)],
}


# ---------------------------------------------------------------------- the probe
@dataclass
class Step:
    """What one training step computed (tensors detached and copied)."""

    index: int
    theta: Tensor | None = None  # the trained parameters at the start of the step (flat)
    batch: Tensor | None = None  # the Poisson batch (training-set indices)
    rows: list[Tensor] = field(default_factory=list)  # per-example rows, one entry per microbatch
    pre: list[Tensor] = field(default_factory=list)  # the rows after ``precondition``
    norms: list[Tensor] = field(default_factory=list)  # norms handed to ``clip_factors``
    factors: list[Tensor] = field(default_factory=list)  # the clip factors it returned
    clipped_rows: list[Tensor] = field(default_factory=list)  # ``clip_rows``'s output rows
    total: Tensor | None = None  # the clipped sum (``before_noise`` input)
    release: Tensor | None = None  # the pre-noise release (``before_noise`` output)
    noisy: Tensor | None = None  # (release + noise) / denominator (``after_noise`` input)
    draws: list[tuple[str, tuple[int, ...], float, Tensor]] = field(default_factory=list)
    mechanisms: list[tuple[str, float, float, int]] = field(default_factory=list)
    sensitivity: float | None = None  # noisy AdaGrad's stated Delta_t
    second_moment: Tensor | None = None  # noisy AdaGrad's S_t after this step's update
    statistic: Tensor | None = None  # noisy AdaGrad's G_t (or h_t) before noise ...
    statistic_release: Tensor | None = None  # ... and as released (with its noise)
    public: Tensor | None = None  # public side information: the projector basis or AdaDPS's A

    @property
    def clipped(self) -> Tensor:
        """The clipped per-example rows, as the step scaled them (preconditioned row x factor,
        bounded to norm <= C exactly by ``clip_rows``: its output when the step used it)."""
        if self.clipped_rows:
            return torch.cat(self.clipped_rows)
        return torch.cat([g * f[:, None].to(g.dtype) for g, f in zip(self.pre, self.factors,
                                                                        strict=True)])


def _call(original: Callable, wrapper: Callable) -> Callable:
    """``wrapper(original, bound_arguments)`` with the original's signature bound."""
    signature = inspect.signature(original)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return wrapper(original, bound)

    return call


def _clone(x: Tensor) -> Tensor:
    return x.detach().clone()


class Probe:
    """Records the steps of one run of ``hooks``.

    Args:
        hooks: the algorithm's hooks (wrapped in place, by instance attributes).
        thetas: force the parameters at the start of step s to ``thetas[s]`` (a run
            conditioned on another run's trajectory, i.e. on its released outputs).
        batches: force the batch of step s to ``batches[s]`` (coupled Poisson sampling).
    """

    def __init__(self, hooks: StepHooks, *, thetas: list[Tensor] | None = None,
                 batches: list[Tensor] | None = None) -> None:
        self.hooks, self.thetas, self.batches = hooks, thetas, batches
        self.steps: list[Step] = []
        self.ctx: StepContext | None = None  # what the hooks were set up with
        self.accountant: Any = None  # the run's accountant (spied on from its creation)
        self.phase = "setup"
        self.result: RetrainResult | None = None
        for name in ("setup", "on_step_start", "precondition", "before_noise", "after_noise",
                     "direction", "record_privacy", "release"):
            if hasattr(hooks, name):
                setattr(hooks, name, _call(getattr(hooks, name), getattr(self, f"_{name}")))

    @property
    def step(self) -> Step:
        return self.steps[-1]

    # ------------------------------------------------------------------ the hooks
    def _setup(self, original, a) -> None:
        original(*a.args, **a.kwargs)
        self.ctx = ctx = a.arguments["ctx"]
        ctx.sampler.next = _call(ctx.sampler.next, self._next)
        assert self.accountant is not None, "the run's accountant was not created through gradspec.privacy"

    def _flat_params(self) -> Tensor:
        return torch.cat([p.detach().flatten() for p in self.ctx.params]).clone()

    def _on_step_start(self, original, a) -> None:
        step = a.arguments["step"]
        self.steps.append(Step(step))
        self.phase = "public"
        if self.thetas is not None:
            with torch.no_grad():
                flat, start = self.thetas[step], 0
                for param in self.ctx.params:
                    param.copy_(flat[start : start + param.numel()].view_as(param))
                    start += param.numel()
        self.step.theta = self._flat_params()
        original(*a.args, **a.kwargs)
        hooks = self.hooks
        if getattr(hooks, "projector", None) is not None and hooks.projector._basis is not None:
            self.step.public = _clone(hooks.projector.basis)
        elif getattr(hooks, "A", None) is not None:
            self.step.public = _clone(hooks.A)

    def _next(self, original, a) -> Tensor:
        idx = original(*a.args, **a.kwargs)
        if self.batches is not None:
            idx = self.batches[self.step.index]
        self.step.batch = idx.clone()
        self.phase = "train"
        return idx

    def _precondition(self, original, a) -> Tensor:
        out = original(*a.args, **a.kwargs)
        self.step.rows.append(_clone(a.arguments["grads"]))
        self.step.pre.append(_clone(out))
        return out

    def _before_noise(self, original, a) -> Tensor:
        out = original(*a.args, **a.kwargs)
        self.step.total = _clone(a.arguments["total"])
        self.step.release = _clone(out)
        if getattr(self.hooks, "S", None) is not None:
            self.step.second_moment = _clone(self.hooks.S)
        self.phase = "noise"
        return out

    def _after_noise(self, original, a) -> Tensor:
        self.step.noisy = _clone(a.arguments["grad"])
        return original(*a.args, **a.kwargs)

    def _direction(self, original, a) -> Tensor:
        self.phase = "direction"
        return original(*a.args, **a.kwargs)

    def _release(self, original, a) -> Tensor:
        """Noisy AdaGrad's second release: its statistic plus noise."""
        self.step.statistic = _clone(self.hooks.statistic())
        out = original(*a.args, **a.kwargs)
        self.step.statistic_release = _clone(out)
        return out

    def _record_privacy(self, original, a) -> None:
        if hasattr(self.hooks, "sensitivity"):
            self.step.sensitivity = float(self.hooks.sensitivity())
        self.phase = "account"
        original(*a.args, **a.kwargs)

    def _mechanism(self, kind: str) -> Callable:
        def record(original, a) -> None:
            args = a.arguments
            if kind == "poisson":
                entry = (kind, args["noise_multiplier"], args["sample_rate"], args["steps"])
            elif kind == "shuffle":
                entry = (kind, args["noise_multiplier"], 1.0, args["steps"])
            else:
                entry = (kind, args["noise_multiplier"], 1.0, args["count"])
            self.step.mechanisms.append(entry)
            return original(*a.args, **a.kwargs)

        return record

    # ------------------------------------------------------------------ library functions
    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        """Wrap the library's noise draw and clip factors, and the run's accountant (the first
        one created, before its hooks are set up), while the run lasts."""
        import gradspec.privacy as privacy

        def draw(original, a) -> Tensor:
            out = original(*a.args, **a.kwargs)
            shape = tuple(out.shape)
            self.step.draws.append((self.phase, shape, float(a.arguments["std"]), _clone(out)))
            return out

        def rows_clipped(original, a) -> Any:
            out = original(*a.args, **a.kwargs)
            if self.phase == "train":
                self.step.norms.append(_clone(out.norms))
                self.step.factors.append(_clone(out.factors))
                self.step.clipped_rows.append(_clone(out.grads))
            return out

        def factors(original, a) -> Tensor:
            out = original(*a.args, **a.kwargs)
            if self.phase == "train":
                self.step.norms.append(_clone(a.arguments["norms"]))
                self.step.factors.append(_clone(out))
            return out

        def accountant(original, a) -> Any:
            acc = original(*a.args, **a.kwargs)
            if self.accountant is None and self.phase == "setup":
                self.accountant = acc
                acc.record_poisson = _call(acc.record_poisson, self._mechanism("poisson"))
                acc.record_shuffled = _call(acc.record_shuffled, self._mechanism("shuffle"))
                acc.record_gaussian = _call(acc.record_gaussian, self._mechanism("gaussian"))
            return acc

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(privacy, "PrivacyAccountant", _call(privacy.PrivacyAccountant, accountant))
            mp.setattr(privacy, "gaussian_noise", _call(privacy.gaussian_noise, draw))
            mp.setattr(privacy, "clip_factors", _call(privacy.clip_factors, factors))
            mp.setattr(privacy, "clip_rows", _call(privacy.clip_rows, rows_clipped))
            yield


def train(algorithm: Case | StepHooks, backend: str, out: Path, *, task: Task | None = None,
          thetas: list[Tensor] | None = None, batches: list[Tensor] | None = None,
          **config_kw: Any) -> Probe:
    """One probed ``retrain`` run of a case (or of ready hooks) on ``task`` (default: the
    shared-layer task), with ``config(backend, **config_kw)``."""
    hooks = algorithm.hooks() if isinstance(algorithm, Case) else algorithm
    probe = Probe(hooks, thetas=thetas, batches=batches)
    with probe.patched():
        probe.result = retrain(config=config(backend, **config_kw), algorithm=probe.hooks,
                               out=out, task=task or shared_task())
    return probe
