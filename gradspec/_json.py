"""Values as plain JSON types, for the files and attributes gradspec writes.

One walker (`walk`: mappings to dicts with string keys, lists and tuples to lists) and
the leaf policies its callers need, which differ on purpose:

* `store_jsonable` (store attributes, digests): numpy values as Python ones,
  non-finite floats as strings (``"inf"``), so a store round-trips them.
* `report_jsonable` (report.json): numpy values as Python ones, non-finite floats
  as ``null``.
* `describe_jsonable` (a retrain's recorded options): tensors as ``"<tensor (shape)>"``,
  paths as strings, any other object by its ``kind`` or type name.
* `strict_jsonable` (a task's recorded options): paths as strings; a non-finite float
  or a value JSON cannot hold is a ``TypeError`` naming the option.
* `as_saved` (settings compared with a saved run's): the value ``json.dumps(default=str)``
  writes, read back.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def walk(obj: Any, leaf: Callable[[Any], Any], *, mappings: type | tuple[type, ...] = dict) -> Any:
    """``obj`` with every instance of ``mappings`` made a dict with string keys, every list
    or tuple a list, and every other value replaced by ``leaf(value)``."""
    if isinstance(obj, mappings):
        return {str(k): walk(v, leaf, mappings=mappings) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [walk(v, leaf, mappings=mappings) for v in obj]
    return leaf(obj)


def _store_leaf(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    return obj


def store_jsonable(obj: Any) -> Any:
    """``obj`` as store attributes hold it: numpy values as Python ones, tuples as lists,
    non-finite floats as strings (``"inf"``), dict keys as strings."""
    return walk(obj, _store_leaf)


def _report_leaf(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return report_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def report_jsonable(obj: Any) -> Any:
    """Plain JSON: numpy scalars to Python, NaN/inf to None."""
    return walk(obj, _report_leaf)


def _describe_leaf(value: Any) -> Any:
    torch = sys.modules.get("torch")  # a tensor exists only where torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        return f"<tensor {tuple(value.shape)}>"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return getattr(value, "kind", None) or type(value).__name__


def describe_jsonable(value: Any) -> Any:
    """``value`` as a description a run records: tensors by shape, paths as strings, any
    other object by its ``kind`` or type name."""
    return walk(value, _describe_leaf)


def strict_jsonable(value: Any, key: str) -> Any:
    """``value`` as plain JSON types (tuples become lists, paths strings).

    Raises:
        TypeError: naming option ``key``, for a non-finite float or a value that is not
            JSON-able (str, number, bool, None, list, dict).
    """

    def leaf(v: Any) -> Any:
        if isinstance(v, os.PathLike):
            return os.fspath(v)
        if isinstance(v, float) and not math.isfinite(v):
            raise TypeError(f"task option {key!r} must be finite, got {v}")
        try:
            json.dumps(v)
        except TypeError:
            raise TypeError(
                f"task option {key!r} must be JSON-able (str, number, bool, None, list, dict), "
                f"got {type(v).__name__}"
            ) from None
        return v

    return walk(value, leaf, mappings=Mapping)


def as_saved(value: Any) -> Any:
    """``value`` as it reads back from the JSON that ``json.dumps(value, default=str)`` writes
    (tuples as lists, other objects as their ``str``), so it compares equal to a saved copy."""
    return json.loads(json.dumps(value, default=str))
