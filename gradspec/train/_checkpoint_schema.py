"""What a checkpoint may hold, checked when it is saved and when it is loaded.

A checkpoint is loaded with ``torch.load(weights_only=True)``: torch's restricted
unpickler rebuilds tensors, dicts, lists, tuples, strings, numbers, booleans and None,
and refuses every other object, so a checkpoint from someone else can never run code.
:func:`unsafe_value` checks at save time that a state holds only such values (a hook
whose ``state_dict`` holds a numpy scalar or an object fails at its first checkpoint,
not at the resume that needs it). :func:`check_state` checks at load time the types and
shapes of what the trainer saved, so that a damaged or hand-made checkpoint is a
one-line error before anything is restored, never a traceback or a silently
broadcast tensor.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch

from gradspec._layout import ParamLayout

#: The plain values a checkpoint may hold besides tensors and containers of them.
_PLAIN = (str, int, float, bool, type(None))



def unsafe_value(value: Any, where: str = "state") -> str:
    """'' if ``value`` loads with ``torch.load(weights_only=True)`` as saved, else where it does not.

    Allowed: plain tensors, dicts (keys str or int), lists, tuples and the values of
    ``_PLAIN``. The answer names the first offending entry and its type.
    """
    kind = type(value)
    if kind in _PLAIN or kind is torch.Tensor or kind is torch.nn.Parameter:
        return ""
    if kind in (dict, OrderedDict):
        for key, item in value.items():
            if type(key) not in (str, int):
                return f"{where} has a key {key!r} of type {type(key).__name__}"
            found = unsafe_value(item, f"{where}[{key!r}]")
            if found:
                return found
        return ""
    if kind in (list, tuple):
        for i, item in enumerate(value):
            found = unsafe_value(item, f"{where}[{i}]")
            if found:
                return found
        return ""
    return f"{where} is a {kind.__module__}.{kind.__qualname__}"


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def _generator_state(value: Any, where: str, *, cpu: bool) -> None:
    """A generator state: 1-D uint8, of the CPU generator's size when it is a CPU generator's
    (an accelerator's generator, e.g. CUDA's Philox seed and offset, checks its own size)."""
    size = torch.Generator().get_state().numel()
    _need(type(value) is torch.Tensor and value.dtype == torch.uint8 and value.ndim == 1
          and (value.numel() == size if cpu else value.numel() > 0),
          f"{where} is not a generator state (a 1-D uint8 tensor{f' of {size} bytes' if cpu else ''})")


def _generators(value: Any, where: str) -> None:
    """Every entry named ``*generator`` anywhere in ``value`` is a generator state."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.endswith("generator"):
                _generator_state(item, f"{where}[{key!r}]", cpu=False)
            else:
                _generators(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _generators(item, f"{where}[{i}]")


def _layout(value: Any) -> ParamLayout:
    try:
        _need(isinstance(value, list) and all(isinstance(d, dict) for d in value), "")
        layout = ParamLayout.from_list(value)
        _need(all(isinstance(d.get("name"), str) and isinstance(d.get("shape"), list)
                  and all(_count(s) for s in d["shape"]) for d in value), "")
    except (KeyError, TypeError, ValueError, OverflowError):
        raise ValueError("'layout' is not a parameter layout (a list of {name, shape, offset, numel})") from None
    return layout


def _model(value: Any, layout: ParamLayout | None) -> None:
    _need(isinstance(value, dict) and all(isinstance(k, str) and type(v) is torch.Tensor
                                          and v.is_floating_point() for k, v in value.items()),
          "'model' is not a dict of parameter names to floating-point tensors")
    if layout is None:
        return
    names = [s.name for s in layout.params]
    _need(sorted(value) == sorted(names), f"'model' holds the parameters {sorted(value)[:4]}, its layout "
                                         f"{sorted(names)[:4]}")
    for spec in layout.params:
        shape = tuple(value[spec.name].shape)
        _need(shape == tuple(spec.shape), f"'model' parameter {spec.name!r} has shape {shape}, its layout "
                                          f"says {tuple(spec.shape)}")


def _optimizer(value: Any, layout: ParamLayout | None) -> None:
    _need(isinstance(value, dict) and isinstance(value.get("state", {}), dict)
          and isinstance(value.get("param_groups", []), list)
          and all(isinstance(g, dict) for g in value.get("param_groups", [])),
          "'optimizer' is not an optimizer state dict ({state, param_groups})")
    for index, entry in value.get("state", {}).items():
        _need(_count(index) and isinstance(entry, dict),
              f"'optimizer' state {index!r} is not a parameter's state")
        if layout is None:
            continue
        _need(index < len(layout.params), f"'optimizer' holds state for parameter {index}, the layout has "
                                          f"{len(layout.params)}")
        shape = tuple(layout.params[index].shape)
        for key, item in entry.items():
            if type(item) is torch.Tensor and item.ndim > 0:
                _need(tuple(item.shape) == shape, f"'optimizer' state {key!r} of parameter {index} has shape "
                                                  f"{tuple(item.shape)}, the parameter {shape}")


def _sampler(value: Any) -> None:
    _need(isinstance(value, dict) and _count(value.get("steps")) and _count(value.get("n")),
          "'sampler' is not a sampler state (kind, n, steps, generator)")
    _generator_state(value.get("generator"), "'sampler' generator", cpu=True)
    perm = value.get("perm")
    if perm is not None:  # a shuffled sampler's epoch permutation: every example exactly once
        n = value["n"]
        _need(type(perm) is torch.Tensor and perm.dtype == torch.int64 and tuple(perm.shape) == (n,)
              and torch.equal(perm.sort().values, torch.arange(n)),
              f"'sampler' perm is not a permutation of the {n} training examples")


_KINDS: dict[str, tuple[type, ...]] = {
    "hooks": (dict,), "accountant": (dict,), "task": (dict,), "last_eval": (dict, type(None)),
    "run_id": (str, type(None)), "device": (str,),
}


def check_state(state: dict[str, Any]) -> None:
    """Check the types and shapes of what the trainer saves (every key optional here).

    Raises:
        ValueError: the first entry that is not what the trainer writes, named.
    """
    for key in ("step", "rows", "metrics_offset", "total_steps", "n_train"):
        if key in state:
            _need(_count(state[key]), f"{key!r} is {state[key]!r}, not an integer >= 0")
    for key, kinds in _KINDS.items():
        if key in state:
            _need(isinstance(state[key], kinds), f"{key!r} is a {type(state[key]).__name__}, "
                                                 f"not a {' or '.join(k.__name__ for k in kinds)}")
    if "noise_multiplier" in state:
        z = state["noise_multiplier"]
        _need(z is None or (type(z) in (int, float) and math.isfinite(z) and z >= 0),
              f"'noise_multiplier' is {z!r}, not a finite number >= 0")
    layout = _layout(state["layout"]) if "layout" in state else None
    if "model" in state:
        _model(state["model"], layout)
    if "optimizer" in state:
        _optimizer(state["optimizer"], layout)
    if "sampler" in state:
        _sampler(state["sampler"])
    if "noise_generator" in state:
        _generator_state(state["noise_generator"], "'noise_generator'", cpu=state.get("device") == "cpu")
    _generators({k: v for k, v in state.items() if k not in ("sampler", "noise_generator")}, "checkpoint")
