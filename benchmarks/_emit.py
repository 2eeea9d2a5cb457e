"""What every benchmark does with its table: print it, and write it to ``--out`` when given."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def emit(lines: Sequence[str], out: Path | None) -> None:
    text = "\n".join(lines)
    print(text)
    if out:
        out.write_text(text + "\n")
