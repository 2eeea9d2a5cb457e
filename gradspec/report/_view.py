"""The page's content as plain data for the template: labelled rows, tables and numbers.

Every number the page shows is a :class:`Num`: its full value (``data-value`` in the page,
``repr`` of the float, so it reads back exactly), its text as shown, and a key
(``data-key``) unique on the page, by which a reader (or a test) finds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradspec.privacy import accounted_sample_rate
from gradspec.report._read import COMPLETE, RunContents

__all__ = ["Num", "num", "sections"]

#: How many singular values the table lists (the figure shows them all).
SIGMA_ROWS = 10


@dataclass(frozen=True)
class Num:
    """A number on the page: ``key`` (``data-key``), ``value`` (``data-value``), ``text`` (shown)."""

    key: str
    value: float | int | None
    text: str

    @property
    def raw(self) -> str:
        """The value as ``data-value`` holds it: ``repr`` of the float (exact), the int, or ''."""
        if self.value is None:
            return ""
        return str(self.value) if isinstance(self.value, int) else repr(float(self.value))


def num(key: str, value: Any, spec: str = ".4g") -> Num:
    """A :class:`Num` shown with the format ``spec`` (``",d"`` for counts, ``".3f"``, ...).

    None, and values that are not numbers, show as "—" with no value; ±inf and NaN as "∞",
    "−∞", "n/a".
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return Num(key, None, "—")
    if isinstance(value, float) and not math.isfinite(value):
        return Num(key, value, "n/a" if math.isnan(value) else ("∞" if value > 0 else "−∞"))
    if spec == ",d":
        return Num(key, int(value), f"{int(value):,}")
    text = format(value, spec)
    if "e" in text:  # 1.2e-05 → 1.2×10⁻⁵ reads better; keep it plain: 1.2e-5
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    return Num(key, float(value), text.replace("-", "−"))


def _row(label: str, value: Any, note: str = "") -> dict[str, Any]:
    return {"label": label, "value": value, "note": note}


def _model(cfg: dict[str, Any]) -> str:
    task_cfg = cfg.get("task_config") or {}
    for key in ("model", "model_path", "arch", "kind"):
        value = task_cfg.get(key)
        if isinstance(value, str) and value:
            return Path(value).name if key == "model_path" else value
    task = cfg.get("task") or (cfg.get("collect") or {}).get("task")
    return f"the {task} task's model" if task else "not recorded"


def _options(options: Any) -> str:
    if not isinstance(options, dict) or not options:
        return ""
    return ", ".join(f"{k}={v}" for k, v in options.items())


def _trained(c: RunContents) -> list[dict[str, Any]]:
    cfg = c.config or {}
    col = cfg.get("collect") or {}
    g = c.gradients or {}
    rows = [_row("task", str(cfg.get("task") or col.get("task") or cfg.get("source") or "—"),
                 _options(col.get("task_options")))]
    rows.append(_row("model", _model(cfg)))
    names = cfg.get("parameters")
    p_trained = cfg.get("p", None if g.get("sketch") else (g.get("layout") or {}).get("p"))
    if isinstance(names, list) and names:
        shown = ", ".join(names[:3]) + (f", … {names[-1]}" if len(names) > 3 else "")
        selection = col.get("params")
        rows.append(_row("trained parameters p", num("trained.p", p_trained, ",d"),
                         f"{len(names)} tensors: {shown}" + (f" (selected by {', '.join(selection)})" if selection else "")))
    elif p_trained is not None:
        rows.append(_row("trained parameters p", num("trained.p", p_trained, ",d")))
    if g:
        r, p = g["shape"]
        sk = g.get("sketch")
        rows.append(_row("gradient rows", num("trained.rows", r, ",d"),
                         f"{g.get('row_kind_text', '')}; {'per-example' if g.get('per_example') else 'one per step'}, "
                         f"{g.get('dtype')}"))
        rows.append(_row("stored columns", num("trained.columns", p, ",d"),
                         f"a {sk['kind']} sketch of the p = {sk['p']:,} parameters ({sk['blocks']} blocks, "
                         f"{sk['exact_columns']:,} exact columns)" if sk else "one per trained parameter"))
    rows.append(_row("steps", num("trained.steps", cfg.get("steps", col.get("steps")), ",d"),
                     f"batch size {col.get('batch_size', '—')}, {col.get('sampling', '—')} sampling"
                     + (f", {col.get('epochs')} epochs" if col.get("epochs") else "")))
    if col:
        rows.append(_row("optimizer", f"{col.get('optimizer')}, lr {col.get('lr')}",
                         f"seed {col.get('seed')}" + (f", task seed {col['task_seed']}" if col.get("task_seed") is not None else "")))
    finals = cfg.get("final_metrics") or {}
    for name, value in finals.items():
        rows.append(_row(name.replace("_", " ") + " (final)", num(f"final.{name}", value)))
    return rows


def _own_retrain(c: RunContents) -> Any:
    """The retraining run whose folder this is, or None (a collect run's folder)."""
    own = [r for r in c.retrain if Path(r.out) == c.run_dir]
    return own[0] if own else None


def _epsilon(c: RunContents) -> tuple[float | None, str]:
    """The ε the run spent, and where it comes from: the finished run's, or the last one its
    log recorded while it runs."""
    cfg = c.config or {}
    if cfg.get("final_epsilon") is not None:
        return cfg["final_epsilon"], ""
    own = _own_retrain(c)
    if own is not None:
        return own.epsilon, "the retraining run's (retrain.json)"
    try:
        last = c.metrics.last("epsilon") if c.metrics is not None else None
    except ValueError:  # a damaged record: reported with the figure that cannot be drawn
        last = None
    stopped = (cfg.get("spent_at_step"), cfg.get("spent_epsilon"))  # what a run stopped early had spent
    if stopped[1] is not None and (last is None or int(stopped[0]) >= int(last[0])):
        return stopped[1], f"spent by step {stopped[0]}, where the run stopped: it has not finished"
    if last is None:
        return None, "not recorded yet"
    return last[1], f"spent by step {last[0]} (metrics.jsonl): the run has not finished"


def _privacy(c: RunContents) -> list[dict[str, Any]]:
    cfg = c.config or {}
    col = cfg.get("collect") or {}
    target = col.get("target_epsilon")
    eps, eps_note = _epsilon(c)
    own = _own_retrain(c) if not c.gradients else None
    if own is not None:  # a retraining run's folder: its own record (found by review: δ and the
        # noise multiplier read "—", with notes of a collect run)
        cfg = {**cfg, "delta": own.delta, "noise_multiplier": own.noise_multiplier, "steps": own.steps}
        col = {**col, "delta": own.delta, "accounting": own.accounting or col.get("accounting")}
    # the rate the accountant counted: 1 / (n // B) for shuffled batches, where the recorded q is B / n
    q = accounted_sample_rate(cfg)
    q = cfg.get("sample_rate") if q is None else q
    shuffled = (f"shuffled: 1 / (n // B), the accountant's rate (B / n = {cfg['sample_rate']:.4g})"
                if isinstance(cfg.get("sample_rate"), int | float) and q != cfg["sample_rate"] else "")
    rows = [
        _row("ε (spent)", num("privacy.epsilon", eps, ".3f"),
             "; ".join(filter(None, [eps_note, f"target ε = {target:g}" if isinstance(target, int | float) else ""]))),
        _row("δ", num("privacy.delta", cfg.get("delta"), ".3g"),
             "" if col.get("delta") is not None else "default n^−1.1"),
        _row("noise multiplier", num("privacy.noise_multiplier", cfg.get("noise_multiplier", col.get("noise_multiplier")), ".4g"),
             "calibrated for the target ε" if target is not None else ""),
        _row("sample rate q", num("privacy.q", q, ".4g"),
             "; ".join(filter(None, [f"n = {cfg['n_train']:,} training examples" if isinstance(cfg.get("n_train"), int)
                                     else "", shuffled]))),
        _row("steps", num("privacy.steps", cfg.get("steps", col.get("steps")), ",d")),
        _row("accountant", str(col.get("accounting") or cfg.get("accounting") or "—"), str(cfg.get("sampling_note") or "")),
        _row("clipping norm C", num("privacy.clip", cfg.get("max_grad_norm", col.get("max_grad_norm")), ".4g"),
             "" if col.get("clip", True) else "rows not clipped"),
    ]
    return rows


def _spectrum(c: RunContents) -> dict[str, Any] | None:
    s = c.spectrum
    if not s or c.stages["pca"].state != COMPLETE:
        return None
    params, src, acc = s.get("params") or {}, s.get("source") or {}, s.get("accuracy") or {}
    r, p = s["shape"]
    sigma = s.get("sigma") or []
    out: dict[str, Any] = {
        "rows": [
            _row("method", str(s.get("method")), str(params.get("reason", ""))),
            _row("k", num("spectrum.k", s.get("k"), ",d"),
                 f"asked for {s['k_requested']}" if s.get("k_requested") not in (None, s.get("k")) else ""),
            _row("H", f"{r:,} × {p:,}", f"rows {_rows_text(src.get('rows_resolved'), r)} of {src.get('path')}; parameters "
                 f"{', '.join(src['params']) if src.get('params') else 'all'}; centred: {bool(src.get('center'))}"),
            _row("precision", str(params.get("precision", "—")), f"V stored as {params.get('v_dtype', '—')}"),
        ],
        "sigma": [{"k": i + 1, "value": num(f"spectrum.sigma.{i + 1}", v),
                   "residual": num(f"spectrum.residual.{i + 1}", (s.get("residuals") or [None] * len(sigma))[i], ".2e")}
                  for i, v in enumerate(sigma[:SIGMA_ROWS])],
        "sigma_last": num("spectrum.sigma_last", sigma[-1]) if len(sigma) > SIGMA_ROWS else None,
        "k_last": len(sigma),
        "accuracy": [
            _row("max residual", num("accuracy.max_residual", acc.get("max_residual"), ".2e"),
                 "largest ‖H·vᵢ − σᵢuᵢ‖/σᵢ (with ‖Hᵀuᵢ − σᵢvᵢ‖/σᵢ)"),
            _row("median residual", num("accuracy.median_residual", acc.get("median_residual"), ".2e")),
            _row("reconstruction error", num("accuracy.reconstruction_error", acc.get("reconstruction_error"), ".4f"),
                 "‖H − U Σ Vᵀ‖_F / ‖H‖_F"),
            _row("explained variance", num("accuracy.explained_variance", acc.get("explained_variance"), ".4f"),
                 f"of ‖H‖²_F by the top {s.get('k')}"),
            _row("U orthogonality", num("accuracy.orthogonality_u", acc.get("orthogonality_u"), ".1e")),
            _row("Gram eigen-residual", num("accuracy.gram_residual", acc.get("gram_residual"), ".1e")),
            _row("check", "passed" if acc.get("ok") else ("FAILED" if acc.get("ok") is False else "—"),
                 f"{acc.get('check', '')}: {acc.get('check_text', '')}" if acc.get("check") else ""),
        ],
        "sketch": _sketch(acc.get("sketch")),
    }
    return out


def _rows_text(d: dict[str, Any] | None, r: int) -> str:
    """The spectrum's rows as pca's --rows writes them (``0:60:2``; found by review: the step was
    dropped, so 30 strided rows read "rows 0:59")."""
    d = d or {}
    if "start" in d:
        return f"{d['start']}:{d['stop']}" + (f":{d['step']}" if d.get("step", 1) != 1 else "")
    if "n_indices" in d:
        return f"{d['n_indices']} rows in {d.get('first')}..{d.get('last')}"
    return f"0:{r}"


def _sketch_confidence(sk: dict[str, Any]) -> dict[str, Any]:
    """The level of the sketch's intervals as its statement makes it: per σ for the block
    bootstrap and the jackknife (an empirical multiplier, or Student's t), jointly over the k
    intervals only for the Bonferroni bound of the oldest statement (found by review: the page
    called the bootstrap's per-σ 95% a joint confidence with a Bonferroni z)."""
    z = sk.get("z", float("nan"))
    method = sk.get("method")
    if method == "block-bootstrap":
        return _row("confidence per σ", num("sketch.confidence", sk.get("confidence"), ".3g"),
                    f"a calibrated estimate: ± {z:.3g} bootstrap s.d. (docs/sketch_calibration.md); not joint over the k")
    if method == "jackknife":
        return _row("confidence per σ", num("sketch.confidence", sk.get("confidence"), ".3g"),
                    f"jackknife, t = {z:.3g}; not joint over the k")
    return _row("joint confidence", num("sketch.confidence", sk.get("confidence"), ".3g"),
                f"Bonferroni z = {z:.3g} over the k intervals")


def _sketch(sk: dict[str, Any] | None) -> dict[str, Any] | None:
    if not sk:
        return None
    return {
        "rows": [
            _row("sketch", f"{sk.get('kind')}", f"M = {sk.get('M'):,} columns ({sk.get('exact_columns', 0):,} exact) "
                 f"of p = {sk.get('p'):,}, J = {sk.get('J')} blocks, seed {sk.get('seed')}"),
            _sketch_confidence(sk),
            _row("median relative half-width", num("sketch.median_relative_half_width",
                                                   sk.get("median_relative_half_width"), ".3g")),
        ],
        "angles": [{"k": a.get("k"), "bound": num(f"sketch.angle.{a.get('k')}", a.get("bound"), ".3g"),
                    "note": "vacuous" if a.get("vacuous") else ("exact: k is the rank" if a.get("exact_rank") else "")}
                   for a in sk.get("angles") or []],
        "intervals": [{"k": i + 1, "lower": num(f"sketch.lower.{i + 1}", lo),
                       "upper": num(f"sketch.upper.{i + 1}", hi)}
                      for i, (lo, hi) in enumerate(zip(sk.get("sigma_lower") or [], sk.get("sigma_upper") or [],
                                                       strict=False)) if i < SIGMA_ROWS],
        "statement": sk.get("statement", ""),
    }


def _fit_row(name: str, key: str, fit: dict[str, Any]) -> dict[str, Any]:
    ci = fit.get("ci") or [None, None]
    return {"name": name, "a": num(f"{key}.a", fit.get("a")), "c": num(f"{key}.c", fit.get("c")),
            "ci_low": num(f"{key}.ci_low", ci[0]), "ci_high": num(f"{key}.ci_high", ci[1]),
            "r2": num(f"{key}.r2", fit.get("r2"), ".3f"),
            "range": f"k = {fit.get('k_min')}..{fit.get('k_max')} ({fit.get('n_points')} points)",
            "ci_text": f"{100 * fit.get('ci_level', 0.95):g}% {fit.get('ci_method', '')}"}


def _decay(c: RunContents) -> dict[str, Any] | None:
    d = c.decay
    if not d:
        return None
    sp = d.get("spectrum") or {}
    out: dict[str, Any] = {
        "source": c.decay_source,
        "path": c.stages["decay"].path,
        "fits": [_fit_row("singular values σ_k", "fit.singular", sp.get("fit_singular") or {}),
                 _fit_row("eigenvalues λ_k = σ_k²", "fit.eigen", sp.get("fit_eigen") or {})],
        "explained": num("decay.explained_variance", (sp.get("explained_variance") or [None])[-1], ".4f"),
        "explained_of": sp.get("explained_variance_denominator", ""),
        "rows": [],
    }
    for name, rows in (d.get("rows") or {}).items():
        G = rows.get("G_k") or {}
        quantiles = [q for q in G if q.startswith("p") and q[1:].isdigit()]
        table = [{"k": k, "max": num(f"gk.{name}.max.{k}", G["max"][i]),
                  "q": [num(f"gk.{name}.{q}.{k}", G[q][i]) for q in quantiles]}
                 for i, k in enumerate(G.get("ks") or [])]
        dec = rows.get("G_k_decay")
        out["rows"].append({
            "name": name, "n_rows": G.get("n_rows"), "quantiles": quantiles, "table": table,
            "fit": _fit_row(f"G_k ({dec['statistic']})", f"gk.{name}.fit", dec["fit"]) if dec else None,
            "checks": [] if not dec else [
                {"text": f"fitted c = {dec['c']:.3f} > 1/2", "ok": dec["c_gt_half"]},
                {"text": f"the {(dec['fit'].get('ci_level') or 0.95) * 100:g}% CI's lower end "
                         f"{dec['fit']['ci'][0]:.3f} > 1/2", "ok": dec["c_gt_half_ci"]},
                {"text": f"envelope G_k ≤ G_0·k^(−c) up to c = {dec['envelope_c']:.3f} > 1/2",
                 "ok": dec["envelope_c_gt_half"]},
            ],
            "envelope_c": num(f"gk.{name}.envelope_c", dec["envelope_c"], ".3f") if dec else None,
            "bounds": [_bound(name, tag, b) for tag, b in (rows.get("bounds") or {}).items()],
        })
    out["bounds_settings"] = {k: (d.get("config") or {}).get(k) for k in ("n", "epsilon", "delta", "diameter")}
    return out


def _bound(name: str, tag: str, b: dict[str, Any]) -> dict[str, Any]:
    key = f"bound.{name}.{tag}"
    return {"tag": tag, "theorem": b.get("theorem"), "k_star": num(f"{key}.k_star", b.get("k_star"), ",d"),
            "bound": num(f"{key}.bound", b.get("bound_at_k_star")),
            "dimension": num(f"{key}.dimension_dependent", b.get("dimension_dependent_bound")),
            "improvement": num(f"{key}.improvement", b.get("improvement_over_dimension_dependent"), ".3g"),
            "hypotheses": b.get("hypotheses") or {}}


def _retrain(c: RunContents) -> dict[str, Any] | None:
    if not c.retrain:
        return None
    metrics: list[str] = []
    for r in c.retrain:
        metrics += [m for m in r.final_metrics if m not in metrics]
    runs = []
    for i, r in enumerate(c.retrain):
        try:
            where = str(Path(r.out).relative_to(c.run_dir))
        except ValueError:
            where = str(r.out)
        runs.append({"run": where, "algorithm": r.algorithm, "rank": r.rank, "seed": r.seed,
                     "epsilon": num(f"retrain.{i}.epsilon", r.epsilon, ".3f"),
                     "noise_multiplier": num(f"retrain.{i}.noise_multiplier", r.noise_multiplier, ".4g"),
                     "steps": num(f"retrain.{i}.steps", r.steps, ",d"), "dp": r.dp_guarantee,
                     "metrics": [num(f"retrain.{i}.{m}", r.final_metrics.get(m)) for m in metrics]})
    return {"metrics": metrics, "runs": runs}


def _machine(c: RunContents) -> dict[str, Any]:
    cfg, s = c.config or {}, c.spectrum or {}
    col, params = cfg.get("collect") or {}, s.get("params") or {}
    rows = []
    versions = dict(cfg.get("versions") or {})
    if versions:
        first = versions.pop("gradspec", None)
        rows.append(_row("software (collect)", f"gradspec {first}" if first else "—",
                         ", ".join(f"{k} {v}" for k, v in versions.items())))
    if col:
        world = int(cfg.get("world_size") or 1)
        rows.append(_row("collect device", str(col.get("device")),
                         f"per-example engine {cfg.get('per_example_engine', col.get('backend'))}"
                         + (f", {world} processes" if world > 1 else "")))
    if params:
        reason = params.get("kernel_reason")
        rows.append(_row("pca device", str(params.get("device")),
                         f"{params.get('precision')} products, Gram kernel {params.get('kernel', '—')}"
                         + (f" ({reason})" if reason else "")))
    timings = s.get("timings") or {}
    return {
        "rows": rows,
        "passes": num("pca.passes", s.get("passes"), ",d"),
        "timings": [{"name": k, "seconds": num(f"pca.time.{k}", v, ".3g")} for k, v in timings.items()],
        "rates": [{"pass": e.get("pass"), "seconds": num(f"pca.rate.{i}.seconds", e.get("seconds"), ".3g"),
                   "gflops": num(f"pca.rate.{i}.gflops", e.get("gflops"), ".3g"),
                   "gbps": num(f"pca.rate.{i}.gb_per_s", e.get("gb_per_s"), ".3g"),
                   "wait": num(f"pca.rate.{i}.read_wait", e.get("read_wait"), ".3g")}
                  for i, e in enumerate(params.get("rates") or [])],
    }


def _glance(c: RunContents, decay: dict[str, Any] | None) -> list[dict[str, Any]]:
    cfg = c.config or {}
    cards = []
    eps, eps_note = _epsilon(c)
    if eps is not None:
        running = bool(eps_note) and _own_retrain(c) is None  # a finished retraining run has spent it all
        cards.append({"label": "privacy spent" + (" so far" if running else ""),
                      "value": num("glance.epsilon", eps, ".3f"),
                      "unit": "ε =", "note": ", ".join(
                          f"{name} {value:{spec}}" for name, value, spec in (
                              ("at δ =", cfg.get("delta"), ".3g"), ("noise multiplier", cfg.get("noise_multiplier"), ".4g"))
                          if isinstance(value, int | float))})
    if c.gradients:
        r, p = c.gradients["shape"]
        cards.append({"label": "gradient rows", "value": num("glance.rows", r, ",d"), "unit": "",
                      "note": f"{'per-example' if c.gradients.get('per_example') else 'one per step'}, "
                              f"{p:,} columns"})
    if decay:
        fit = decay["fits"][0]
        cards.append({"label": "singular values σ_k ∝ k^(−c)", "value": num("glance.sigma_c", fit["c"].value, ".3f"),
                      "unit": "c =",
                      "note": f"95% CI [{fit['ci_low'].text}, {fit['ci_high'].text}]"})
        gk = next((r for r in reversed(decay["rows"]) if r["fit"]), None)
        if gk:
            ok = all(ch["ok"] for ch in gk["checks"][:2])
            cards.append({"label": f"G_k ∝ k^(−c), {gk['name']} rows",
                          "value": num("glance.gk_c", gk["fit"]["c"].value, ".3f"), "unit": "c =",
                          "note": "c > 1/2 of Theorem 3.3: " + ("met" if ok else "not established"),
                          "ok": ok})
        cards.append({"label": "explained variance", "value": num("glance.explained", decay["explained"].value, ".3f"),
                      "unit": "",
                      "note": f"by the top {c.spectrum.get('k') if c.spectrum else '—'} directions"})
    return cards


def sections(c: RunContents) -> dict[str, Any]:
    """The template's context (without figures and findings): every section as data."""
    decay = _decay(c)
    return {
        "trained": _trained(c) if c.config or c.gradients else [],
        "privacy": _privacy(c) if c.config else [],
        "spectrum": _spectrum(c),
        "decay": decay,
        "retrain": _retrain(c),
        "machine": _machine(c),
        "glance": _glance(c, decay),
        "files": c.files,
    }
