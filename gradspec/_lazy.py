"""A package's public names resolved on first use (PEP 562), so that importing the package
stays light: ``gradspec`` (torch, zarr, transformers) and ``gradspec.privacy`` (torch, scipy,
dp-accounting) load what a name needs only when the name is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, namespace: dict[str, Any],
               where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose globals are ``namespace``
    and whose name ``n`` lives in module ``where[n]``; a resolved name is kept in ``namespace``."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
