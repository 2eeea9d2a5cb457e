"""Sizes in words: bytes in the unit a reader takes in at a glance (shared by every package)."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def size_text(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit that keeps the number at least 1, three significant
    digits: ``0 B``, ``900 B``, ``112 KiB``, ``50.6 MiB``, ``8.00 GiB`` (was printed as
    ``0.00 GiB`` for a budget of 100 KiB, and ``0 MiB`` for a 112 KiB Gram).

    Example:
        >>> size_text(115200), size_text(8 * 2**30), size_text(0)
        ('112 KiB', '8.00 GiB', '0 B')
    """
    value = float(nbytes)
    unit = 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{value:.0f} B"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f} {_UNITS[unit]}"
