"""A decay analysis's settings from text (what `gradspec decay` parses, callable from Python).

:func:`decay_config` builds a :class:`~gradspec.spectrum.DecayConfig` from the values a
user types: the fit's rank range as ``"A:B"`` (parsed by :func:`parse_row_range`, the one
START:STOP parser), the KDE bandwidth as a rule name or a number, the tail rule and the
confidence-interval method as their choice names, and the four inputs of the bounds, which
come all together or not at all (a bound missing one of them cannot be evaluated, and
silently skipping it would hide that).
"""

from __future__ import annotations

from gradspec._enums import parse_choice
from gradspec.spectrum._bounds import TailRule
from gradspec.spectrum._driver import parse_row_range
from gradspec.spectrum._fit import CIMethod
from gradspec.spectrum._report import DecayConfig


def parse_rank_range(text: str | tuple[int, int] | None, what: str = "--fit-range") -> tuple[int, int] | None:
    """``"A:B"`` → the rank range ``(A, B)``; ``None`` for ``None`` or ``""``.

    Args:
        text: ``"A:B"`` with integers, or an ``(A, B)`` pair (returned as a tuple).
        what: the option's name in the error message.

    Raises:
        ValueError: not two integers separated by one colon (e.g. ``1:1000``). Whether the
            range fits the spectrum is checked by the analysis, which knows its length.
    """
    if text is None or isinstance(text, tuple | list):
        return None if text is None else _pair(text, what)
    bad = ValueError(f"{what} {text!r} is not A:B with integers (e.g. 1:1000)")
    try:
        rows = parse_row_range(text)
    except ValueError:
        raise bad from None
    if rows is None:
        return None
    if rows.start is None or rows.stop is None or rows.step is not None:
        raise bad
    return rows.start, rows.stop


def _pair(value, what: str) -> tuple[int, int]:
    if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{what} {value!r} is not a pair of integers (A, B)")
    return int(value[0]), int(value[1])


def parse_bandwidth(text: str | float) -> str | float:
    """A KDE bandwidth as typed: a number (``"0.3"`` → 0.3) or a rule name (``"scott"``).

    The value itself is checked where it is used (:func:`~gradspec.spectrum.spectral_density`).
    """
    if not isinstance(text, str):
        return text
    try:
        return float(text)
    except ValueError:
        return text


def decay_config(
    *,
    k_max: int | None = None,
    every_rank: bool = False,
    fit_range: str | tuple[int, int] | None = None,
    ci: str | CIMethod = CIMethod.ANALYTIC,
    bandwidth: str | float = "scott",
    n: int | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    diameter: float | None = None,
    dim: int | None = None,
    tail: str | TailRule = TailRule.HOLD,
) -> DecayConfig:
    """The :class:`~gradspec.spectrum.DecayConfig` of `gradspec decay`'s options.

    Args:
        k_max, every_rank, dim: as :class:`~gradspec.spectrum.DecayConfig`.
        fit_range: ranks of the spectrum fit, ``"A:B"`` or ``(A, B)``.
        ci: ``analytic`` or ``bootstrap``.
        bandwidth: ``scott``, ``silverman``, or a number (as text or a float).
        n, epsilon, delta, diameter: the setting of the bounds (Li et al. 2022, Theorems
            3.3/3.5): all four, or none (no bounds).
        tail: G_k beyond the measured ranks: ``hold``, ``fit`` or ``zero``.

    Raises:
        ValueError: some but not all of the bound inputs, an unknown ``tail`` or ``ci``
            (naming the choices), or a ``fit_range`` that is not ``A:B``.

    Example:
        >>> decay_config(fit_range="1:100", tail="fit").fit_range
        (1, 100)
    """
    given = [x is not None for x in (n, epsilon, delta, diameter)]
    if any(given) and not all(given):
        raise ValueError("the bounds need all of --n, --epsilon, --delta and --diameter")
    return DecayConfig(
        k_max=k_max,
        every_rank=every_rank,
        fit_range=parse_rank_range(fit_range),
        ci=parse_choice(CIMethod, ci, "--ci").value,
        bandwidth=parse_bandwidth(bandwidth),
        n=n,
        epsilon=epsilon,
        delta=delta,
        diameter=diameter,
        dim=dim,
        tail=parse_choice(TailRule, tail, "--tail").value,
    )
