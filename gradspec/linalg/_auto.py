"""Choosing a method from r, p, k and the memory budget, and saying why."""

from __future__ import annotations

import re

from gradspec._enums import PcaMethod
from gradspec._units import size_text

#: Above this many rows, an r×r eigendecomposition (r³ flops) outweighs a few Krylov passes.
MAX_GRAM_ROWS = 20_000

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_memory(text: str | int | float | None) -> int | None:
    """``"4G"``, ``"512MiB"``, ``"2.5GB"`` or a number of bytes -> bytes (None stays None)."""
    if text is None or isinstance(text, (int, float)):
        return None if text is None else int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"--memory {text!r} is not a size such as 4G, 512M or 2.5GB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def gram_bytes(r: int) -> int:
    """Host memory of the exact method's r×r stage: the Gram, eigh's workspace, the vectors."""
    return 3 * 8 * r * r


def krylov_bytes(r: int, k: int, iters: int, oversample: int) -> int:
    return 3 * 8 * r * (iters + 1) * (k + oversample)


def choose_method(
    *, r: int, p: int, k: int, memory: int, iters: int = 4, oversample: int = 10
) -> tuple[PcaMethod, str]:
    """-> (method, reason). Exact Gram when its r×r stage fits; randomized block Krylov otherwise."""
    need = gram_bytes(r)
    if need <= memory // 2 and r <= MAX_GRAM_ROWS:
        return PcaMethod.GRAM, (
            f"exact Gram: the {r}×{r} Gram stage needs {size_text(need)} (budget {size_text(memory)}); "
            "two passes over H, float64 accumulation"
        )
    kb = krylov_bytes(r, k, iters, oversample)
    if kb > memory // 2:
        raise ValueError(
            f"too little memory: the Krylov basis for r={r}, k={k} needs {size_text(kb)} and the Gram "
            f"{size_text(need)}, over half the budget of {size_text(memory)}; raise --memory, "
            "lower --k or select fewer --rows"
        )
    why = (
        f"r exceeds {MAX_GRAM_ROWS}"
        if r > MAX_GRAM_ROWS
        else f"the Gram needs {size_text(need)}"
    )
    return PcaMethod.KRYLOV, f"randomized block Krylov ({iters + 1} passes): {why}, over the budget"


def check_memory(
    method: PcaMethod, *, r: int, p: int, k: int, memory: int, iters: int | None, oversample: int
) -> None:
    """Refuse a requested method whose r-side matrices do not fit half the budget (one line)."""
    from gradspec.linalg.orthogonal import block_size

    b = block_size(k, oversample, r, p)
    need = {
        PcaMethod.GRAM: gram_bytes(r),
        PcaMethod.KRYLOV: krylov_bytes(r, k, iters if iters is not None else 4, oversample),
        PcaMethod.ORTHOGONAL: 6 * 8 * r * b,
        PcaMethod.LANCZOS: 8 * r * (2 * k + 1) * 2,
    }.get(method)
    if need is None or need <= memory // 2:
        return
    hint = (
        "use --method krylov, or --method auto to choose"
        if method is PcaMethod.GRAM
        else "lower --k or --iters"
    )
    raise ValueError(
        f"too little memory for --method {method.value}: it needs {size_text(need)} for r={r}, "
        f"k={k}, over half the budget of {size_text(memory)}; raise --memory or {hint}"
    )
