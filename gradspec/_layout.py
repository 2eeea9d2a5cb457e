"""Parameter layout: which flattened parameter occupies which columns.

A gradient row is the concatenation of the selected parameters' gradients,
each flattened in C order, in the order of ``model.named_parameters()``. The
layout records (name, shape, offset, numel) for each, so any parameter subset
is a set of column ranges.

Shared by the trainer, the stores and the spectral code, so it lives at the top of the
package and imports nothing but the standard library (no zarr, no torch);
``gradspec.store`` re-exports it.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ParamSpec:
    """One parameter's place in a gradient row."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int

    @property
    def stop(self) -> int:
        """One past the parameter's last column."""
        return self.offset + self.numel

    def to_dict(self) -> dict:
        """The spec as JSON-able values (name, shape, offset, numel), as stores save it."""
        return {"name": self.name, "shape": list(self.shape), "offset": self.offset, "numel": self.numel}

    @classmethod
    def from_dict(cls, d: dict) -> ParamSpec:
        """The spec :meth:`to_dict` saved."""
        return cls(str(d["name"]), tuple(int(s) for s in d["shape"]), int(d["offset"]), int(d["numel"]))


def match_names(names: Iterable[str], patterns: str | Sequence[str]) -> list[str]:
    """Names matching any pattern, in their original order.

    A pattern is a shell glob (``*.query.weight``) matched against the full
    name, or a regular expression when written ``re:<regex>`` (searched).

    Raises:
        ValueError: a ``re:`` pattern that is not a valid regular expression (named, with
            the reason).
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    compiled = []
    for pat in patterns:
        if pat.startswith("re:"):
            try:
                compiled.append(re.compile(pat[3:]).search)
            except re.error as exc:
                raise ValueError(f"parameter pattern {pat!r} is not a valid regular expression ({exc}); "
                                 "write re:<regex>, or a shell glob such as '*.query.weight'") from None
        else:
            compiled.append(re.compile(fnmatch.translate(pat)).match)
    return [n for n in names if any(m(n) for m in compiled)]


@dataclass(frozen=True)
class ParamLayout:
    """The ordered parameters of a gradient row."""

    params: tuple[ParamSpec, ...]

    @classmethod
    def from_shapes(cls, named_shapes: Iterable[tuple[str, Sequence[int]]]) -> ParamLayout:
        """The layout of parameters flattened in C order and concatenated in the order given.

        Raises:
            ValueError: no parameters, or a name given twice.
        """
        specs, offset = [], 0
        for name, shape in named_shapes:
            numel = math.prod(int(s) for s in shape)
            specs.append(ParamSpec(name, tuple(int(s) for s in shape), offset, numel))
            offset += numel
        if not specs:
            raise ValueError("a parameter layout needs at least one parameter; check the parameter patterns")
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError("parameter names in a layout must be unique")
        return cls(tuple(specs))

    @property
    def p(self) -> int:
        """Total number of columns."""
        return self.params[-1].stop

    @property
    def names(self) -> list[str]:
        """The parameters' names, in column order."""
        return [s.name for s in self.params]

    def __len__(self) -> int:
        return len(self.params)

    def __getitem__(self, name: str) -> ParamSpec:
        for s in self.params:
            if s.name == name:
                return s
        raise KeyError(f"no parameter {name!r} in this layout")

    def select(self, patterns: str | Sequence[str] | None) -> list[ParamSpec]:
        """Specs whose names match ``patterns`` (all when None); raises if none match."""
        if patterns is None:
            return list(self.params)
        chosen = set(match_names(self.names, patterns))
        if not chosen:
            raise ValueError(
                f"no parameter matches {list(patterns) if not isinstance(patterns, str) else patterns!r}; "
                f"the layout has e.g. {', '.join(self.names[:3])}"
            )
        return [s for s in self.params if s.name in chosen]

    def column_ranges(self, patterns: str | Sequence[str] | None = None) -> list[tuple[int, int]]:
        """Merged, sorted half-open column ranges of the selected parameters."""
        ranges: list[tuple[int, int]] = []
        for s in self.select(patterns):
            if ranges and ranges[-1][1] == s.offset:
                ranges[-1] = (ranges[-1][0], s.stop)
            else:
                ranges.append((s.offset, s.stop))
        return ranges

    def require_same(
        self, other: ParamLayout, *, what: str = "the other layout", subset: bool = False
    ) -> list[tuple[int, int]]:
        """Check that ``other`` holds this layout's parameters; return their columns in ``other``.

        Parameters are compared by name, shape and order (a gradient row is the
        concatenation of its parameters in order, so equal ``p`` proves nothing).
        With ``subset=False`` the layouts must be identical; with ``subset=True``
        ``other`` may hold more parameters, and the returned column ranges are
        those of this layout's parameters, in this layout's order (merged where
        contiguous): reading them from a row of ``other`` gives a row of this layout.

        Args:
            other: the layout found (a held-out gradient store's, a model's).
            what: names ``other`` in the error message, e.g. ``"the gradient store 'b.zarr'"``.
            subset: accept extra parameters in ``other``.

        Returns:
            Half-open column ranges of ``other``; ``[(0, p)]`` when the layouts are identical.

        Raises:
            ValueError: naming the first parameter that is missing, shaped differently,
                out of order, or (``subset=False``) extra.
        """
        found = {s.name: (i, s) for i, s in enumerate(other.params)}
        ranges: list[tuple[int, int]] = []
        last = -1
        for s in self.params:
            hit = found.get(s.name)
            if hit is None:
                raise ValueError(
                    f"{what} has no parameter {s.name!r} {s.shape} (it has {len(other)} parameters, "
                    f"e.g. {', '.join(other.names[:3])}); it holds gradients of another model "
                    "or parameter selection"
                )
            index, o = hit
            if o.shape != s.shape:
                raise ValueError(
                    f"{what} has parameter {s.name!r} with shape {o.shape}, expected {s.shape}"
                )
            if index < last:
                raise ValueError(
                    f"{what} holds {s.name!r} before {other.names[last]!r}, expected the opposite "
                    "order (the rows' column layout differs)"
                )
            last = index
            if ranges and ranges[-1][1] == o.offset:
                ranges[-1] = (ranges[-1][0], o.stop)
            else:
                ranges.append((o.offset, o.stop))
        if not subset and len(other) != len(self):
            extra = [n for n in other.names if n not in {s.name for s in self.params}]
            raise ValueError(
                f"{what} has {len(extra)} parameter(s) the expected layout does not, "
                f"e.g. {', '.join(repr(n) for n in extra[:3])}"
            )
        return ranges

    def to_list(self) -> list[dict]:
        """The layout as JSON-able values, one :meth:`ParamSpec.to_dict` per parameter."""
        return [s.to_dict() for s in self.params]

    @classmethod
    def from_list(cls, items: Sequence[dict]) -> ParamLayout:
        """The layout :meth:`to_list` saved.

        Raises:
            ValueError: the offsets are not contiguous (a damaged or hand-edited layout).
        """
        layout = cls(tuple(ParamSpec.from_dict(d) for d in items))
        offset = 0
        for s in layout.params:
            if s.offset != offset or s.numel != math.prod(s.shape):
                raise ValueError(f"corrupt parameter layout at {s.name!r}: offsets must be contiguous")
            offset = s.stop
        return layout
