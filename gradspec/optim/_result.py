"""A finished retraining run's record: ``retrain.json``, its type (:class:`RetrainResult`) and
the checked reading of it that a resumed sweep and a sweep's summary rely on."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradspec._files import json_sha256, read_regular, write_text_atomic

__all__ = ["RESULT_NAME", "RetrainResult", "read_result", "write_result"]

logger = logging.getLogger(__name__)

RESULT_NAME = "retrain.json"
#: The most bytes a retrain.json may hold (it records settings and final metrics: a few kB).
RESULT_MAX_BYTES = 16 << 20
DIGEST_KEY = "digest"


@dataclass(frozen=True)
class RetrainResult:
    """What one :func:`retrain` run produced."""

    out: Path
    algorithm: str
    options: dict[str, Any]
    rank: int | None
    seed: int
    noise_multiplier: float
    epsilon: float
    delta: float
    steps: int
    final_metrics: dict[str, float]
    metrics: Path
    hooks: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    accounting: str = ""
    dp_guarantee: bool = True
    dp_caveat: str | None = None

    def to_row(self) -> dict[str, Any]:
        """A flat summary-table row."""
        config = self.settings.get("config") if isinstance(self.settings.get("config"), dict) else {}
        return {
            "algorithm": self.algorithm, "rank": self.rank, "seed": self.seed,
            # what tells the runs of one folder apart beside the seed (found by review: runs at
            # other learning rates or options were one series in summary.csv and the figures)
            "options": json.dumps(self.options, sort_keys=True, default=str) if self.options else "",
            "lr": config.get("lr"),
            "noise_multiplier": self.noise_multiplier, "epsilon": self.epsilon,
            "delta": self.delta, "steps": self.steps, "accounting": self.accounting,
            "dp_guarantee": self.dp_guarantee, "dp_caveat": self.dp_caveat,
            **self.final_metrics, "out": str(self.out),
        }

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "out": str(self.out), "metrics": str(self.metrics)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RetrainResult:
        """The result that :meth:`to_dict` wrote (a ``retrain.json``), every field of its type.

        Raises:
            ValueError: ``d`` is not such a dict: a field is missing or of another JSON type.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a retrain result is a JSON object, not {type(d).__name__}")
        d = {k: v for k, v in d.items() if k in _RESULT_TYPES}
        missing = sorted(n for n in _RESULT_TYPES if n not in d and n not in _RESULT_DEFAULTS)
        if missing:
            raise ValueError(f"a retrain result lacks {missing}")
        for name, value in d.items():
            kinds = _RESULT_TYPES[name]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise ValueError(f"the retrain result's {name!r} is {value!r:.40}, not of type "
                                 f"{' or '.join(k.__name__ for k in kinds)}")
        if not all(isinstance(v, (*_NUMBER, type(None))) for v in d["final_metrics"].values()):
            raise ValueError("the retrain result's 'final_metrics' are not all numbers")
        d["out"], d["metrics"] = Path(d["out"]), Path(d["metrics"])
        return cls(**d)


_NUMBER = (int, float)
#: The JSON types of a retrain.json's fields (what :meth:`RetrainResult.from_dict` accepts).
_RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "out": (str,), "metrics": (str,), "algorithm": (str,), "options": (dict,), "rank": (int, type(None)),
    "seed": (int,), "noise_multiplier": _NUMBER, "epsilon": _NUMBER, "delta": _NUMBER, "steps": (int,),
    "final_metrics": (dict,), "hooks": (dict,), "settings": (dict,), "accounting": (str,),
    "dp_guarantee": (bool,), "dp_caveat": (str, type(None)),
}
_RESULT_DEFAULTS = ("hooks", "settings", "accounting", "dp_guarantee", "dp_caveat")


def _digest(saved: dict[str, Any]) -> str:
    """SHA-256 of the parsed JSON (keys sorted, the digest left out): what a reader gets back."""
    return json_sha256({k: v for k, v in saved.items() if k != DIGEST_KEY})


def write_result(result: RetrainResult, path: Path) -> None:
    """Write ``result`` as ``path`` (a ``retrain.json``) whole or not at all, with the digest of
    its values, so a sweep that reuses it or a summary that lists it reads what was written."""
    saved = json.loads(json.dumps(result.to_dict(), default=str))
    write_text_atomic(path, json.dumps({**saved, DIGEST_KEY: _digest(saved)}, indent=2))


def read_result(run_dir: Path) -> RetrainResult:
    """The finished run in ``run_dir`` (its ``retrain.json``), checked before a sweep reuses it;
    ``out`` and ``metrics`` are the run's own files, whatever the file recorded (a moved or
    shared sweep must not send the figures to another folder's metrics). One-line ValueError."""
    path = run_dir / RESULT_NAME
    damaged = (f"{str(path)!r} is not a readable retrain result (%s); rerun the sweep with --overwrite "
               "(it reruns this run), or delete that run's folder")
    try:
        raw = read_regular(path, max_bytes=RESULT_MAX_BYTES)  # a FIFO there blocked the sweep forever
    except (OSError, ValueError) as exc:
        raise ValueError(damaged % (str(exc).splitlines()[0][:80] or type(exc).__name__)) from None
    try:
        saved = json.loads(raw)
    except RecursionError:
        raise ValueError(damaged % "it nests too deeply") from None
    except ValueError as exc:
        raise ValueError(damaged % f"not JSON: {str(exc).splitlines()[0][:80]}") from None
    if isinstance(saved, dict):
        digest = saved.pop(DIGEST_KEY, None)
        if digest is None:
            logger.warning("%s carries no digest (written before retrain results had one): its values "
                           "cannot be verified", path)
        elif digest != _digest(saved):
            raise ValueError(damaged % "its values do not match the digest written with them: a changed byte")
    try:
        result = RetrainResult.from_dict(saved)
        settings = result.settings
        if settings and not (isinstance(settings.get("config"), dict) and isinstance(settings.get("options"), dict)):
            raise ValueError("its settings lack the config or the options it was asked for")
    except ValueError as exc:
        raise ValueError(damaged % str(exc)) from None
    return dataclasses.replace(result, out=run_dir, metrics=run_dir / "metrics.jsonl")
