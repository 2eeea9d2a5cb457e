"""What a reader of a run must be told before its numbers: damage, unfinished or stale parts,
parts that do not belong together (unlike row kinds, another run's spectrum), and the claims
that rest on estimates rather than checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradspec.report._read import (
    ABSENT,
    DAMAGED,
    RUNNING,
    STALE,
    STOPPED,
    UNREADABLE,
    RunContents,
)
from gradspec.store import RowKind, config_digest, kind_mismatch, precision_material, resolved_path

__all__ = ["Finding", "findings"]

#: Levels, most serious first.
ERROR, WARNING, CAVEAT, NOTE = "error", "warning", "caveat", "note"


@dataclass(frozen=True)
class Finding:
    """One line a reader must see: ``level`` (error, warning, caveat, note) and ``text``."""

    level: str
    text: str
    next_step: str | None = None


def _stages(c: RunContents) -> list[Finding]:
    out = []
    for stage in c.stages.values():
        if stage.state in (DAMAGED, UNREADABLE):
            out.append(Finding(ERROR, f"{stage.name}: {stage.note}", stage.next_step))
        elif stage.state in (RUNNING, STOPPED):
            what = ("the numbers below are of the rows committed so far" if stage.name == "collect"
                    else "its results are not shown until it finishes")
            out.append(Finding(WARNING, f"{stage.name}: {stage.note}; {what}", stage.next_step))
        elif stage.state == STALE:
            out.append(Finding(WARNING, f"{stage.name}: {stage.note}", stage.next_step))
    return out


def _gradients(c: RunContents) -> list[Finding]:
    g = c.gradients or {}
    out = []
    missing = g.get("missing_chunks") or []
    if missing:
        shown = ", ".join(f"{m['array']}/{m['chunk']}" for m in missing[:3])
        out.append(Finding(ERROR if g.get("all_chunks_written", True) else WARNING,
                           f"gradient store: {len(missing)} chunk(s) of committed rows are missing ({shown})",
                           f"gradspec info {g.get('path')} --verify"))
    for key in ("meta_error", "example_norms_error"):
        if g.get(key):
            out.append(Finding(ERROR, f"gradient store: {g[key]}"))
    rep = g.get("dtype_report")
    if rep and rep.get("rows") and precision_material(rep):
        out.append(Finding(WARNING, f"gradient store: {rep['dtype']} lost precision that matters "
                                    f"({rep['underflowed_share']:.2%} of nonzero entries flushed to 0, "
                                    f"relative error {rep['rel_error']:.2e})"))
    return out


def _source(c: RunContents) -> list[Finding]:
    """Whether the spectrum was computed from this folder's gradient store, and rows of its kind."""
    g, s = c.gradients, c.spectrum
    if not g or not s:
        return []
    src = s.get("source") or {}
    out = []
    same_path = src.get("abspath") == resolved_path(g["path"])
    same_run = src.get("config_digest") is not None and src["config_digest"] == config_digest(g.get("config") or {})
    if s.get("rewritten"):
        # the store at the spectrum's path no longer holds its rows (collect --overwrite keeps
        # the folder's spectrum.zarr and decay/): what the page shows of them is another run's
        # (found by review: seed 1's page showed seed 0's sigma and G_k with no warning); the
        # rows' own digest decides, as for decay, so a resumed or extended run is not flagged
        out.append(Finding(ERROR, f"the spectrum (and any decay of it) is of an earlier run: {s['rewritten']}; "
                                  "its numbers below are not this run's", "gradspec pca (then gradspec decay) again"))
    elif not (same_path or same_run):
        out.append(Finding(WARNING, f"the spectrum was computed from {src.get('path')!r}, not from this "
                                    f"folder's {Path(g['path']).name} (another run, or one rewritten since pca)"))
    elif src.get("committed_rows") is not None and src["committed_rows"] != g["shape"][0]:
        out.append(Finding(NOTE, f"the spectrum was computed when {src['committed_rows']} rows were committed; "
                                 f"the gradient store holds {g['shape'][0]} now"))
    if src.get("row_kind") and g.get("row_kind"):
        differ = kind_mismatch(RowKind(**src["row_kind"]), RowKind(**g["row_kind"]),
                               names=("the spectrum's rows", "this run's rows"))
        if differ:
            out.append(Finding(WARNING, f"unlike row kinds: {differ}"))
    return out


def _spectrum(c: RunContents) -> list[Finding]:
    s = c.spectrum or {}
    out = []
    acc = s.get("accuracy") or {}
    for line in (acc.get("flags") or {}).values():
        out.append(Finding(WARNING, f"pca check: {line}"))
    if acc and acc.get("ok") is False and not acc.get("flags"):
        out.append(Finding(WARNING, "pca check: the accuracy check did not pass"))
    params = s.get("params") or {}
    if s.get("k") is not None and s.get("k_requested") not in (None, s["k"]):
        out.append(Finding(NOTE, f"pca kept k = {s['k']} of the {s['k_requested']} directions asked for"
                                 + (f": {params['k_reason']}" if params.get("k_reason") else "")))
    sketch = acc.get("sketch")
    if sketch:
        out.append(Finding(CAVEAT, "the spectrum is of a sketched store: its σ intervals are a "
                                   f"{sketch.get('statement', 'calibrated estimate').split(' from ')[0]}, "
                                   "and V lies in sketch space (no projector for retrain)"))
    return out


def _decay(c: RunContents) -> list[Finding]:
    d = c.decay or {}
    if c.decay_source != "report":
        return []
    out = [Finding(CAVEAT, note) for note in d.get("notes") or []]
    for name, rows in (d.get("rows") or {}).items():
        dec = rows.get("G_k_decay") or {}
        if dec.get("c_gt_half") and not dec.get("c_gt_half_ci"):
            lo, hi = (dec.get("fit") or {}).get("ci", [None, None])
            out.append(Finding(CAVEAT, f"G_k on the {name} rows decays like k^(−{dec['c']:.3f}), above 1/2, but its "
                                       f"confidence interval [{lo:.3f}, {hi:.3f}] reaches below 1/2: the condition "
                                       "c > 1/2 of Theorem 3.3 is not established"))
        for tag, b in (rows.get("bounds") or {}).items():
            unmet = [h for h, ok in (b.get("hypotheses") or {}).items() if not ok]
            if unmet:
                out.append(Finding(CAVEAT, f"the {tag} bound on the {name} rows (Theorem {b.get('theorem')}) "
                                           f"holds only under hypotheses not met here: {', '.join(unmet)}"))
    return out


def _retrain(c: RunContents) -> list[Finding]:
    caveats: dict[str, list[str]] = {}
    for r in c.retrain:
        if not r.dp_guarantee:
            caveats.setdefault(r.dp_caveat or "no DP guarantee", []).append(Path(r.out).name)
    return [Finding(CAVEAT, f"retraining: {len(runs)} run{'s' * (len(runs) != 1)} ({', '.join(runs[:3])}"
                            f"{', ...' if len(runs) > 3 else ''}) carry no DP guarantee: {why}")
            for why, runs in caveats.items()]


def _privacy(c: RunContents) -> list[Finding]:
    cfg = c.config or {}
    z = cfg.get("noise_multiplier")
    if isinstance(z, int | float) and z == 0:
        return [Finding(NOTE, "this run added no noise (noise multiplier 0): it is not private")]
    return []


def _metrics(c: RunContents) -> list[Finding]:
    if c.metrics is not None and c.metrics.partial_line:
        return [Finding(NOTE, "the last line of metrics.jsonl is still being written; it is left out")]
    return []


def findings(c: RunContents) -> list[Finding]:
    """Everything a reader must be told, most serious first (see the module note)."""
    out = [Finding(ERROR, p) for p in c.problems]
    for part in (_stages, _gradients, _source, _spectrum, _decay, _retrain, _privacy, _metrics):
        out += part(c)
    order = {ERROR: 0, WARNING: 1, CAVEAT: 2, NOTE: 3}
    return sorted(out, key=lambda f: order[f.level])


def missing(c: RunContents) -> list[Any]:
    """The steps not run yet that could be, with the command that runs each (in pipeline order)."""
    return [s for s in c.stages.values() if s.state == ABSENT and s.next_step]
