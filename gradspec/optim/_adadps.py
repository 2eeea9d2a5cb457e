"""AdaDPS: precondition per-example gradients with side information, then privatise
(Li, Zaheer, Liu, Reddi, McMahan, Smith 2022, Algorithm 1).

Each step, before clipping::

    g_i <- A(g_i, A_t, M_t)                  per-example preconditioning
    g~  <- (sum_i clip(g_i, C) + N(0, sigma^2 C^2 I)) / B,   w <- w - alpha g~

Option 1 (public data): a public mini-batch of size b' gives g^_t, the mean public
gradient at the current parameters, and

* ``rmsprop``: v_t = beta2 v_{t-1} + (1 - beta2) g^_t^2, A_t = sqrt(v_t / (1 - beta2^t)) + eps,
  A(g) = g / A_t. The bias correction makes A_t an estimate of sqrt(E[g^_t^2]), the
  quantity the paper analyses (§4.1, §5: "A^t = sqrt(E[(g^t)^2]) + eps^t"; Theorem 2's
  beta^t >= 1 - 1/t gives v_1 = g^_1^2), and what the authors' code divides by (the mean
  of g^^2 over public batches). Without it A_t starts sqrt(1 - beta2) = 0.03 times too
  small (beta2 = 0.999) and grows over thousands of steps, so the preconditioned
  gradients, and with a fixed clipping norm C the share of them clipped, drift by up to
  30x along training;
* ``adagrad``: A_t^2 = A_{t-1}^2 + g^_t^2, A(g) = g / (A_t + eps);
* ``adam``: M_t = beta1 M_{t-1} + (1 - beta1) g^_t and v_t as RMSProp, both bias-corrected,
  A(g) = (beta g + (1 - beta) M_t) / (sqrt(v_t) + eps), with beta = 1 - beta1 (the weight
  Adam gives a fresh gradient; the paper leaves beta^t open).

Option 2 (no public data): a fixed ``side_information`` vector A, A(g) = g / A. An
all-ones A is DP-SGD. A is given as a tensor, as a file of p values, or as
``"frequency"``: feature/token frequencies (the paper's §4 and §6.1.2:
A_j = E|x_j| + eps, "rare features are more informative") estimated on public
examples (:func:`frequency_side_information`). The side information and public
statistics are non-sensitive, so the privacy is DP-SGD's (the paper's Theorem 1) —
which is why frequencies are never computed on the private training data.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from gradspec._enums import parse_choice
from gradspec.optim._base import OptimHooks
from gradspec.optim._public import checked_public, public_gradients, public_ids
from gradspec.tasks import TensorData
from gradspec.train import StepContext

__all__ = ["FREQUENCY", "AdaDPS", "AdaDPSRule", "frequency_side_information", "load_side_information"]

FREQUENCY = "frequency"
_NOT_FEATURES = ("labels", "targets", "attention_mask", "token_type_ids")


class AdaDPSRule(StrEnum):
    """How AdaDPS builds its preconditioner A_t."""

    RMSPROP = "rmsprop"
    ADAM = "adam"
    ADAGRAD = "adagrad"
    FIXED = "fixed"  # fixed side information, no public data (Option 2)


def load_side_information(path: str | os.PathLike, p: int | None = None) -> Tensor:
    """Side information A from a file: ``.npy``, ``.pt``/``.pth`` (a tensor) or text
    (``.txt``/``.csv``, whitespace- or comma-separated), flattened; float32.

    Raises:
        ValueError: if the file is missing or unreadable, or A has not ``p`` entries, or
            has an entry that is not positive and finite.
    """
    path = Path(path)
    if not path.is_file():
        what = "is not a regular file" if os.path.lexists(path) else "not found"
        raise ValueError(f"side information file {str(path)!r} {what}; give a file of p positive "
                         f"values (.npy, .pt, .txt) or {FREQUENCY!r}")
    suffix = path.suffix.lower()
    try:  # no pickles: np.load refuses object arrays, torch.load(weights_only) anything but tensors
        if suffix == ".npy":  # mapped first: a header declaring more than the file holds is refused unread
            values = torch.from_numpy(np.array(np.load(path, mmap_mode="r", allow_pickle=False),
                                                 dtype=np.float64))
        elif suffix in (".pt", ".pth"):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(loaded, Tensor):
                raise TypeError(f"it holds a {type(loaded).__name__}, not a tensor")
            if loaded.numel() * loaded.element_size() > loaded.untyped_storage().nbytes():
                raise ValueError(f"its tensor declares shape {tuple(loaded.shape)} over "
                                 f"{loaded.untyped_storage().nbytes()} stored bytes (an expanded view)")
            values = loaded
        else:
            text = path.read_text().replace(",", " ")
            values = torch.from_numpy(np.array(text.split(), dtype=np.float64))
    except (pickle.UnpicklingError, ValueError, TypeError, OSError, RuntimeError, UnicodeDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, pickle.UnpicklingError):
            reason = "it holds objects other than tensors (refused: unpickling them could run code)"
        raise ValueError(f"cannot read the side information in {str(path)!r}: {reason}; give a file of "
                         "p positive values (.npy, .pt with one tensor, .txt)") from exc
    return _checked_side(values, p, f"the side information in {str(path)!r}")


def _checked_side(values: Tensor, p: int | None, what: str) -> Tensor:
    values = torch.as_tensor(values).flatten().to(torch.float32)
    if p is not None and values.numel() != p:
        raise ValueError(f"{what} has {values.numel()} entries, the run trains {p} parameters")
    if not bool(torch.isfinite(values).all()) or not bool((values > 0).all()):
        raise ValueError(f"{what} must be positive and finite (gradients are divided by it)")
    return values


def frequency_side_information(
    model: nn.Module, names: list[str], data: TensorData, *, eps: float | None = None
) -> Tensor:
    """AdaDPS Option 2 side information from feature/token frequencies of ``data``.

    Li et al. (2022, §5.1.1 and §6.1.2) set A_j = E|x_j| + eps for the weight of input
    feature j of a generalised linear model, and A proportional to token frequencies
    in language tasks. Here, per trained parameter (in ``names`` order, C-flattened):

    * the input embedding (``model.get_input_embeddings()``, else the model's only
      ``nn.Embedding``): row j gets the mean count of token j per example (padding,
      ``attention_mask == 0``, not counted);
    * the weight of an ``nn.Linear`` reading the raw input features (its
      ``in_features`` equal the width of the data's one floating-point tensor): column j
      gets E|x_j|; its bias gets 1 (the constant feature).

    Then ``A = (A + eps) / max(A + eps)``, with ``eps`` default 1/m (m = len(data)): an
    unseen token counts as one occurrence in m examples, and the most frequent feature
    is left as DP-SGD would (A = 1). Rare features are scaled up before clipping.

    ``data`` must be non-sensitive (the public split): frequencies of the private
    training data would leak outside the privacy accounting.

    Raises:
        ValueError: for a parameter that is neither, naming it.
    """
    m = len(data)
    if m < 1:
        raise ValueError("frequency side information needs at least one public example")
    eps = 1.0 / m if eps is None else float(eps)
    modules = dict(model.named_modules())
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embed is None:
        embeddings = [mod for mod in modules.values() if isinstance(mod, nn.Embedding)]
        embed = embeddings[0] if len(embeddings) == 1 else None
    parts = []
    for name in names:
        owner, _, leaf = name.rpartition(".")
        module = modules.get(owner)
        param = model.get_parameter(name)
        if module is not None and module is embed and leaf == "weight":
            tokens = _token_tensor(data)
            if tokens is None:
                raise ValueError(f"token frequencies for {name!r} need an integer token tensor "
                                 f"(input_ids) in the data; it has {sorted(data.tensors)}")
            keep = data.tensors.get("attention_mask", torch.ones_like(tokens)).bool()
            counts = torch.bincount(tokens[keep].flatten(), minlength=param.shape[0])[: param.shape[0]]
            freq = counts.double() / m
            parts.append(freq[:, None].expand(param.shape).flatten())
            continue
        if isinstance(module, nn.Linear):
            features = _feature_tensor(data)
            if features is not None and features.shape[1] == module.in_features:
                if leaf == "weight":
                    parts.append(features.abs().mean(0).double().expand(param.shape).flatten())
                    continue
                if leaf == "bias":
                    parts.append(torch.ones(param.numel(), dtype=torch.float64))
                    continue
        raise ValueError(
            f"frequency side information covers the input embedding (token frequencies) and "
            f"linear layers on the raw input features (feature frequencies); {name!r} is neither: "
            "pass the side information as a file of p values"
        )
    a = torch.cat(parts) + eps
    return (a / a.max()).float()


def _token_tensor(data: TensorData) -> Tensor | None:
    if "input_ids" in data.tensors:
        return data.tensors["input_ids"]
    ints = [v for k, v in data.tensors.items()
            if k not in _NOT_FEATURES and not v.dtype.is_floating_point and v.ndim == 2]
    return ints[0] if len(ints) == 1 else None


def _feature_tensor(data: TensorData) -> Tensor | None:
    floats = [v for k, v in data.tensors.items() if k not in _NOT_FEATURES and v.dtype.is_floating_point]
    return floats[0].reshape(len(data), -1) if len(floats) == 1 else None


class AdaDPS(OptimHooks):
    """AdaDPS: per-example preconditioning before clipping and noise.

    Args:
        rule: ``rmsprop`` (the paper's main choice), ``adam``, ``adagrad`` or ``fixed``
            (Option 2); default ``fixed`` with side information, else ``rmsprop``.
        side_information: the fixed A for ``rule="fixed"``: a tensor (p,) of positive
            entries, a file of p values (:func:`load_side_information`), or
            ``"frequency"``: feature/token frequencies of ``public_size`` public examples
            (:func:`frequency_side_information`).
        public_size: m, public examples (taken by :func:`public_split` from the task's
            public split).
        public_batch: b', public examples per step (default: min(m, the batch size)).
        beta1: decay rate of the first moment.
        beta2: decay rate of the second moment.
        eps: added to the square root of the second moment.
        seed: chooses the public examples and the public mini-batches.
        public: the public examples themselves (overrides ``public_size``).
    """

    name = "adadps"
    needs_rows = True  # preconditions each per-example row before clipping

    def __init__(
        self, *, rule: AdaDPSRule | str | None = None,
        side_information: Tensor | str | os.PathLike | None = None,
        public_size: int = 100, public_batch: int | None = None, beta1: float = 0.9,
        beta2: float = 0.999, eps: float = 1e-8, seed: int = 0, public: TensorData | None = None,
    ) -> None:
        if rule is None:
            rule = AdaDPSRule.FIXED if side_information is not None else AdaDPSRule.RMSPROP
        self.rule = parse_choice(AdaDPSRule, rule, "AdaDPS rule")
        if (self.rule == AdaDPSRule.FIXED) != (side_information is not None):
            raise ValueError("side_information is given exactly when rule='fixed' (Option 2); the "
                             "other rules estimate A on public data (Option 1)")
        if isinstance(side_information, str | os.PathLike):
            self.side_source = os.fspath(side_information)
            if self.side_source != FREQUENCY:
                side_information = load_side_information(self.side_source)
        elif side_information is not None:
            self.side_source = "tensor"
            side_information = _checked_side(side_information, None, "side information A")
        else:
            self.side_source = None
        for name, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= beta < 1:
                raise ValueError(f"{name} must be in [0, 1), got {beta}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.side_information = side_information
        self.public_size, self.public_batch = int(public_size), public_batch
        self.beta1, self.beta2, self.eps, self.seed = float(beta1), float(beta2), float(eps), int(seed)
        self.public = public
        self.t = 0

    def setup(self, ctx: StepContext) -> None:
        super().setup(ctx)
        p = ctx.layout.p
        if self.rule == AdaDPSRule.FIXED:
            if isinstance(self.side_information, str):  # "frequency", from public examples
                self.public = checked_public(ctx, self.public, self.public_size, self.seed)
                self.side_information = frequency_side_information(
                    ctx.model, list(ctx.names), self.public)
            side = _checked_side(self.side_information, p, "side information A")
            self.A = side.to(ctx.device)
            return
        self.public = checked_public(ctx, self.public, self.public_size, self.seed)
        m = len(self.public)
        if self.public_batch is not None and not 1 <= self.public_batch <= m:
            raise ValueError(f"public batch size b' must be in [1, m={m}] (the public examples), "
                             f"got {self.public_batch}")
        self.b_pub = self.public_batch or min(m, ctx.config.batch_size)
        self._pub_gen = torch.Generator().manual_seed(self.seed + 1)
        self.v = torch.zeros(p, device=ctx.device)
        self.M = torch.zeros(p, device=ctx.device)
        self.A = torch.ones(p, device=ctx.device)
        self.t = 0

    def on_step_start(self, step: int, ctx: StepContext) -> None:
        super().on_step_start(step, ctx)
        if self.rule == AdaDPSRule.FIXED:
            return
        idx = torch.randperm(len(self.public), generator=self._pub_gen)[: self.b_pub]
        ghat = public_gradients(ctx, self.public, idx).mean(0)
        self.t += 1
        if self.rule == AdaDPSRule.ADAGRAD:
            self.v = self.v + ghat.square()
            self.A = self.v.sqrt() + self.eps
            return
        self.v = self.beta2 * self.v + (1 - self.beta2) * ghat.square()
        # bias-corrected for both rules (module docstring): A_t estimates sqrt(E[g^_t^2])
        self.A = (self.v / (1 - self.beta2**self.t)).sqrt() + self.eps
        if self.rule == AdaDPSRule.ADAM:
            self.M = self.beta1 * self.M + (1 - self.beta1) * ghat

    def precondition(self, grads: Tensor) -> Tensor:
        """Divide each per-example gradient by the side information A (rule ``adam``: mixed with
        the bias-corrected public momentum first), before clipping."""
        grads = super().precondition(grads)
        if self.rule == AdaDPSRule.ADAM:
            beta = 1 - self.beta1
            m_hat = self.M / (1 - self.beta1**self.t)
            return (beta * grads + (1 - beta) * m_hat) / self.A
        return grads / self.A

    def describe(self) -> dict[str, Any]:
        """What a run records: the rule, where A came from, the public examples used."""
        return {"rule": str(self.rule), "side_information": self.side_source,
                "public_size": None if self.public is None else len(self.public),
                "public_ids": public_ids(self.public)}

    def _fingerprint(self) -> str:
        return hashlib.sha1(self.A.detach().cpu().numpy().tobytes()).hexdigest()

    def state_dict(self) -> dict[str, Any]:
        if self.rule == AdaDPSRule.FIXED:
            return {"rule": str(self.rule), "fingerprint": self._fingerprint(),
                    "public_ids": public_ids(self.public)}
        return {"rule": str(self.rule), "t": self.t, "v": self.v.cpu().clone(),
                "M": self.M.cpu().clone(), "A": self.A.cpu().clone(),
                "generator": self._pub_gen.get_state(), "public_ids": public_ids(self.public)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("rule") != str(self.rule):
            raise ValueError(f"the checkpoint used AdaDPS rule {state.get('rule')!r}, "
                             f"this run {str(self.rule)!r}")
        if "public_ids" in state and state["public_ids"] != public_ids(self.public):
            raise ValueError("the checkpoint's AdaDPS used other public examples (their ids "
                             "differ): resume with the same task and public split")
        if self.rule == AdaDPSRule.FIXED:
            if "fingerprint" in state and state["fingerprint"] != self._fingerprint():
                raise ValueError("the checkpoint's AdaDPS used other side information A")
            return
        if state["v"].shape != self.v.shape:
            raise ValueError("the checkpoint's AdaDPS statistics have the wrong size")
        self.t = int(state["t"])
        self.v, self.M, self.A = (state[k].to(self.v.device) for k in ("v", "M", "A"))
        self._pub_gen.set_state(state["generator"])
