"""Derived seeds: one 64-bit word of a seed and a tag, so that streams seeded alike stay apart."""

from __future__ import annotations

MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser (Steele, Lea & Flood 2014): a bijection of 64-bit words that
    spreads every input bit over the output."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)
