"""Decide how ``scripts/install.sh`` gets torch, without importing torch (stdlib only).

The promise the install keeps:

* a torch the user already has is never replaced — if it is new enough it is kept
  and pinned with a pip constraint while gradspec installs, so no dependency can
  upgrade it; if it is older than gradspec's minimum, the install stops and says so;
* with no torch, the CPU build is installed from PyTorch's CPU wheel index; where that
  index cannot be reached, the configured indexes are used only if what they would
  install is a CPU build (no ``nvidia-*``/``triton`` packages), else the install stops
  with a line saying how to install torch by hand.

The minimum torch comes from ``pyproject.toml`` (the single place it is written).

Usage (from install.sh)::

    python3 scripts/torch_plan.py plan        # prints: ACTION<TAB>DETAIL
    python3 scripts/torch_plan.py cuda-check  # reads a pip --report JSON on stdin
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import sys
import tomllib
import urllib.request
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: The torch gradspec installs when there is none (CPU build).
DEFAULT_TORCH = "2.13.0"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

KEEP, TOO_OLD, CPU_INDEX_INSTALL, FALLBACK_INSTALL = "keep", "too-old", "cpu-index", "fallback"


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a PEP 440 version: ``"2.4.0+cu121"`` -> ``(2, 4, 0)``."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not m:
        raise ValueError(f"not a version: {version!r}")
    parts = [int(x) for x in m.group(1).split(".")]
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def minimum_torch(pyproject: Path = PYPROJECT) -> str:
    """The ``torch>=X`` lower bound in pyproject's dependencies."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for dep in deps:
        m = re.fullmatch(r"\s*torch\s*>=\s*([0-9.]+)\s*", dep)
        if m:
            return m.group(1)
    raise ValueError(f"{pyproject} has no 'torch>=X' dependency")


def installed_torch() -> str | None:
    """The installed torch's version, or None (read from metadata; torch is not imported)."""
    try:
        return md.version("torch")
    except md.PackageNotFoundError:
        return None


def index_reachable(url: str = CPU_INDEX, timeout: float = 5.0) -> bool:
    """Whether ``url/torch/`` answers within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(f"{url}/torch/", timeout=timeout):
            return True
    except Exception:
        return False


def plan(installed: str | None, minimum: str, cpu_index_ok: bool) -> tuple[str, str]:
    """The action for this machine: ``(action, detail)``.

    Args:
        installed: the installed torch version, or None.
        minimum: gradspec's minimum torch version.
        cpu_index_ok: whether PyTorch's CPU wheel index is reachable.

    Returns:
        ``("keep", version)``, ``("too-old", message)``, ``("cpu-index", requirement)``
        or ``("fallback", requirement)``.
    """
    if installed is not None:
        if release(installed) >= release(minimum):
            return KEEP, installed
        return TOO_OLD, (
            f"torch {installed} is older than gradspec's minimum {minimum}; gradspec never "
            f"replaces a torch you installed: upgrade it yourself (with the index of your "
            f"CUDA build), then rerun"
        )
    if release(DEFAULT_TORCH) < release(minimum):  # pragma: no cover - a packaging slip
        raise ValueError(f"DEFAULT_TORCH {DEFAULT_TORCH} is below the minimum {minimum}")
    if cpu_index_ok:
        return CPU_INDEX_INSTALL, f"torch=={DEFAULT_TORCH}+cpu"
    return FALLBACK_INSTALL, f"torch=={DEFAULT_TORCH}"


def cuda_packages(report: dict) -> list[str]:
    """Names in a ``pip install --dry-run --report`` JSON that belong to a CUDA torch."""
    names = []
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        name = str(meta.get("name", "")).lower()
        version = str(meta.get("version", ""))
        if name.startswith("nvidia-") or name == "triton" or (
            name == "torch" and re.search(r"\+cu\d+", version)
        ):
            names.append(f"{name}=={version}" if version else name)
    return names


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else "plan"
    if cmd == "plan":
        installed = installed_torch()
        reachable = installed is None and index_reachable()
        action, detail = plan(installed, minimum_torch(), reachable)
        print(f"{action}\t{detail}")
        return 0
    if cmd == "cuda-check":
        found = cuda_packages(json.load(sys.stdin))
        if found:
            print(", ".join(found[:6]) + (", ..." if len(found) > 6 else ""))
            return 1
        return 0
    print(f"usage: {argv[0]} plan|cuda-check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
