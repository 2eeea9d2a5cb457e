"""gradspec._units.size_text: sizes in the unit a reader takes in at a glance (issue 34 §6: a
100 KiB budget was printed as "0.00 GiB", a 112 KiB Gram as "0 MiB")."""

from __future__ import annotations

import pytest

from gradspec._units import size_text


@pytest.mark.parametrize("nbytes, text", [
    (0, "0 B"), (1, "1 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
    (100 * 1024, "100 KiB"), (120 * 120 * 8, "112 KiB"), (50.6 * 2**20, "50.6 MiB"),
    (8 * 2**30, "8.00 GiB"), (2.5 * 2**40, "2.50 TiB"),
])
def test_size_text(nbytes, text):
    assert size_text(nbytes) == text


def test_no_size_is_printed_as_zero_of_a_large_unit():
    for n in (1, 100, 5_000, 60_000, 3_000_000, 7 * 2**30):
        number = float(size_text(n).split()[0])
        assert 1 <= number < 1024, size_text(n)
