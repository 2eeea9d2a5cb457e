"""The task registry: build a bundled task by name.

Each factory is a keyword-only function returning a :class:`~gradspec.tasks._base.Task`;
``register_task`` checks its signature, and wraps it so that every task records the
options that built it (defaults included) in ``task.config``, in a JSON-able form.

Example:
    >>> from gradspec.tasks import make_task
    >>> task = make_task("lowrank", n=64, d=20, r=3, seed=0)
    >>> task.config["r"]
    3
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from gradspec._json import strict_jsonable as _jsonable
from gradspec.tasks._base import Task, split_summary

__all__ = ["available_tasks", "make_task", "register_task", "task_options"]

Factory = TypeVar("Factory", bound=Callable[..., Task])

_FACTORIES: dict[str, Callable[..., Task]] = {}


def register_task(name: str) -> Callable[[Factory], Factory]:
    """Register a task factory under ``name``.

    The factory must take keyword-only arguments, one of them ``seed``. The
    registered (and returned) function fills ``task.config`` with ``{"task": name}``
    and every option, defaults included, under whatever the factory recorded itself,
    and ``"splits"``: the split sizes and the public examples' ids
    (:func:`~gradspec.tasks._base.split_summary`).

    Args:
        name: the registry name, as passed to :func:`make_task`.

    Raises:
        ValueError: if ``name`` is taken or the factory's signature is not keyword-only
            with a ``seed`` argument.
    """

    def decorate(factory: Factory) -> Factory:
        if name in _FACTORIES:
            raise ValueError(f"a task named {name!r} is already registered")
        sig = inspect.signature(factory)
        not_kw = [p.name for p in sig.parameters.values() if p.kind is not p.KEYWORD_ONLY]
        if not_kw:
            raise ValueError(
                f"task factory {name!r} must take keyword-only arguments (def f(*, seed, ...)); "
                f"got positional or variadic {not_kw}"
            )
        if "seed" not in sig.parameters:
            raise ValueError(f"task factory {name!r} must take a `seed` argument")

        @functools.wraps(factory)
        def build(**options: Any) -> Task:
            bound = sig.bind(**options)
            bound.apply_defaults()
            task = factory(**bound.arguments)
            recorded = {"task": name, **{k: _jsonable(v, k) for k, v in bound.arguments.items()}}
            task.config = {**recorded, **task.config, "splits": split_summary(task)}
            return task

        _FACTORIES[name] = build
        return build  # type: ignore[return-value]

    return decorate


def available_tasks() -> tuple[str, ...]:
    """Names of the registered tasks, sorted."""
    return tuple(sorted(_FACTORIES))


def task_options(name: str) -> dict[str, Any]:
    """The options of task ``name`` and their defaults (``inspect.Parameter.empty`` if required).

    Raises:
        ValueError: if no task is registered under ``name``.
    """
    factory = _factory(name)
    return {p.name: p.default for p in inspect.signature(factory).parameters.values()}


def make_task(name: str, /, **options: Any) -> Task:
    """Build the registered task ``name`` with the given options.

    Args:
        name: a name from :func:`available_tasks`.
        **options: the task's keyword options (see :func:`task_options`).

    Returns:
        The task; ``task.config`` holds every option used, defaults included.

    Raises:
        ValueError: for an unknown task name or option, naming the valid choices.
    """
    valid = task_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for task {name!r}; valid options are {sorted(valid)}"
        )
    options = {k: _checked_option(name, k, v, valid[k]) for k, v in options.items()}
    return _factory(name)(**options)


def _checked_option(task: str, key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of the option's default (int, float or bool), or a one-line error.

    A string that is not a number (``-t n=abc`` on the CLI) used to reach the factory and
    fail deep inside it, or worse, run with a nonsensical value.
    """
    if default is None or default is inspect.Parameter.empty:
        return value
    want = type(default)
    if want is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"option {key} of task {task!r} must be true or false, got {value!r}")
    if want in (int, float):
        kind = "an integer" if want is int else "a number"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if want is float:
                return float(value)
            if float(value).is_integer():
                return int(value)
        elif isinstance(value, str):
            try:
                return want(value)
            except ValueError:
                pass
        raise ValueError(f"option {key} of task {task!r} must be {kind}, got {value!r}")
    return value


def _factory(name: str) -> Callable[..., Task]:
    try:
        return _FACTORIES[name]
    except KeyError:
        raise ValueError(
            f"unknown task {name!r}; choose one of {list(available_tasks())}"
        ) from None
