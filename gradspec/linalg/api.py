"""``pca``: the one entry point of the spectral engine (what `gradspec pca` calls)."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gradspec._enums import PcaMethod, parse_choice
from gradspec.linalg._auto import check_memory, choose_method, parse_memory
from gradspec.linalg._kernels import KERNEL_CHOICES
from gradspec.linalg._operator_base import verify_mode
from gradspec.linalg._output import (
    _check_not_source,
    _give_up,
    _lock_output,
    _open_output,
    _VSink,
)
from gradspec.linalg._result import PcaResult
from gradspec.linalg._sources import ColRanges, RowSelection

logger = logging.getLogger(__name__)

DEFAULT_ITERS = {PcaMethod.ORTHOGONAL: 10, PcaMethod.KRYLOV: 4}


def default_memory() -> int:
    """Half the available host memory, at most 8 GiB."""
    import psutil

    return int(min(8 * 2**30, psutil.virtual_memory().available // 2))


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_settings(
    *, iters: int | None, tol: float | None, oversample: int, seed: int, v_dtype: str
) -> None:
    """Refuse settings a method would run with and answer wrongly (or fail on deep inside)."""
    if iters is not None and (not _is_int(iters) or iters < 1):
        raise ValueError(f"--iters must be >= 1 (an integer), got {iters!r}")
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating))
                            or not np.isfinite(tol) or tol < 0):
        raise ValueError(f"--tol must be a finite number >= 0, got {tol!r}")
    if not _is_int(oversample) or oversample < 0:
        raise ValueError(f"--oversample must be an integer >= 0, got {oversample!r}")
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {seed!r}")
    if str(np.dtype(v_dtype)) not in ("float32", "float64"):
        raise ValueError(f"v_dtype must be float32 or float64, got {v_dtype!r}")


def _check_k(k: int, shape: tuple[int, int]) -> None:
    r, p = shape
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if k > min(r, p):
        raise ValueError(
            f"k={k} exceeds min(r, p) = {min(r, p)} for the selected H ({r} rows × {p} columns); "
            "lower --k or select more rows"
        )


def pca(
    *,
    source: Any,
    k: int,
    method: str | PcaMethod = PcaMethod.AUTO,
    rows: RowSelection = None,
    params: str | Sequence[str] | None = None,
    col_ranges: ColRanges = None,
    center: bool = False,
    out: str | Path | None = None,
    overwrite: bool = False,
    resume: bool = False,
    device: str = "cpu",
    precision: str = "auto",
    memory: int | str | None = None,
    iters: int | None = None,
    tol: float | None = None,
    oversample: int = 10,
    seed: int = 0,
    scheduler: Any = None,
    verify: bool | str = True,
    v_dtype: str = "float32",
    kernel: str = "auto",
    progress: bool = False,
) -> PcaResult:
    """Top-k singular values and vectors of the r×p gradient matrix H, out of core.

    H = U·Σ·Vᵀ restricted to the top k; σ descending, signs fixed so that the
    largest-|·| entry of each u_i is positive. With ``out``, V (p×k) is
    streamed into a spectrum store (``SpectrumStore``) and ``result.V`` is None.

    Args:
        source: gradient store path or ``GradientStore``; numpy array, torch tensor or dask array (r×p).
        k: number of singular triplets (1 ≤ k ≤ min(r, p)).
        method: ``auto`` | ``gram`` (exact) | ``orthogonal`` (Li et al. 2022) | ``krylov`` | ``lanczos``.
        rows: row selection: None (all committed rows), a slice (e.g. ``slice(300, 1300)``) or indices.
        params: parameter patterns (globs or ``re:…``) selecting columns through the store's layout.
        col_ranges: explicit column ranges instead of ``params``.
        center: subtract column means (off by default: the paper's H is uncentered).
        out: spectrum store to write (None: keep V in memory).
        overwrite: replace an existing ``out``.
        resume: continue an interrupted orthogonal or krylov run from its last completed pass in ``out``.
        device: ``cpu`` | ``cuda`` | ``auto``.
        precision: ``auto``/``float64`` | ``float32`` | ``tf32`` for block products (float64 accumulation).
        memory: memory budget (bytes or ``"4G"``); default half the available memory, ≤ 8 GiB.
        iters: iterations (orthogonal: 10; krylov: Krylov depth 4).
        tol: orthogonal: stop when top-k Ritz residuals fall below it; lanczos: svds tolerance.
        oversample: extra columns of the iterate / Krylov block.
        seed: seed of the random start of iterative methods.
        scheduler: dask.distributed scheduler address or Client: run every pass as a dask graph.
        verify: the accuracy check of the final pass: ``"cheap"`` (or True, the default:
            Gaussian probes of H·V with a stated confidence, the Gram's eigen-residual, rounding
            terms; far less than a product), ``"full"`` (the products H·V and VᵀV: a second
            GEMM the size of V's) or ``"none"`` (or False). See ``gradspec.linalg._verify``.
        v_dtype: dtype V is stored in (float32 | float64).
        kernel: the Gram kernel: ``auto`` (measured once per machine and cached) or one of
            ``numpy-syrk``, ``scipy-syrk``, ``torch-blocked``, ``torch-gemm``.
        progress: progress bars on stderr.

    Returns:
        PcaResult (σ, U, V or None, residuals, explained variance, reconstruction error, timings;
        ``params["rates"]``: each pass's seconds, GFLOP/s (symmetric-counted) and GB/s read).

    Raises:
        ValueError: k out of range, empty selection, NaN/inf in H, too little memory, bad choices.
    """
    t_start = time.perf_counter()
    meth = parse_choice(PcaMethod, method, "PCA method")
    _check_settings(iters=iters, tol=tol, oversample=oversample, seed=seed, v_dtype=v_dtype)
    mode = verify_mode(verify, default="cheap")
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"unknown Gram kernel {kernel!r}; choose one of: {', '.join(KERNEL_CHOICES)}")
    budget = default_memory() if memory is None else parse_memory(memory)
    if budget is None or budget <= 0:
        raise ValueError(f"--memory must be a positive size such as 4G, got {memory!r}")
    if resume and out is None:
        raise ValueError("--resume needs --out (the spectrum store of the interrupted run)")
    if resume and overwrite:
        raise ValueError("choose either --resume or --overwrite, not both")
    if scheduler is not None:
        from gradspec.linalg._dask import DaskGradientOperator

        if device not in ("cpu", "auto"):
            raise ValueError(
                "the Dask backend computes on its workers; drop --device or --scheduler"
            )
        op: Any = DaskGradientOperator(
            source,
            scheduler=scheduler,
            rows=rows,
            params=params,
            col_ranges=col_ranges,
            center=center,
            precision=precision,
            kernel=kernel,
            progress=progress,
        )
    else:
        from gradspec.linalg._operator import GradientOperator

        op = GradientOperator(
            source,
            rows=rows,
            params=params,
            col_ranges=col_ranges,
            center=center,
            device=device,
            precision=precision,
            memory=budget // 2,
            kernel=kernel,
            progress=progress,
        )
    desc = op.describe()
    if desc.get("status") in ("writing", "failed"):
        logger.info(
            "the store is still being written: using its %d committed rows", desc["committed_rows"]
        )
    _check_k(k, op.shape)
    r, p = op.shape
    reason = f"{meth.value} as requested"
    explicit = meth is not PcaMethod.AUTO
    sketch = _sketch_plan(op, meth, scheduler, budget)
    if sketch is not None and meth is PcaMethod.AUTO:
        meth, reason = PcaMethod.GRAM, "a sketched store: the exact Gram method states the sketch error"
    if meth is PcaMethod.AUTO:
        meth, reason = choose_method(
            r=r,
            p=p,
            k=k,
            memory=budget,
            iters=iters or DEFAULT_ITERS[PcaMethod.KRYLOV],
            oversample=oversample,
        )
    iters, tol = _applicable(meth, explicit=explicit, iters=iters, tol=tol)
    it = iters if iters is not None else DEFAULT_ITERS.get(meth)
    check_memory(meth, r=r, p=p, k=k, memory=budget, iters=it, oversample=oversample)
    logger.info("pca: H is %d×%d, k=%d, method %s (%s)", r, p, k, meth.value, reason)
    run_params = {
        "k": int(k),
        "k_requested": int(k),
        "method": meth.value,
        "reason": reason,
        "iters": it,
        "tol": tol,
        "oversample": oversample,
        "seed": seed,
        "rows": desc.get("rows"),
        "params": desc.get("params"),
        "col_ranges": desc.get("col_ranges"),
        "source_path": desc.get("abspath", desc.get("path")),
        "center": center,
        "precision": getattr(op, "precision", "float64"),
        "device": str(getattr(op, "device", None) or "dask"),
        "memory": budget,
        "v_dtype": str(np.dtype(v_dtype)),
        "verify": mode,
    }
    if sketch is not None:
        run_params["sketch"] = sketch.describe()
        run_params["right_vectors"] = "sketch space"
    if out is not None:
        _check_not_source(out, desc)  # before the lock: a refused --out leaves no lock file behind
    lock = _lock_output(out) if out is not None else None
    try:
        return _pca_into(out, op, meth, run_params, resume, overwrite, v_dtype, mode, it, tol,
                         oversample, seed, k, t_start, sketch)
    finally:
        if lock is not None:
            lock.release()


def _sketch_plan(op: Any, meth: PcaMethod, scheduler: Any, budget: int) -> Any:
    """The sketch plan of a sketched gradient store (None: not sketched); refuses, in one line,
    what cannot state its error (part of the blocks, another method, the Dask backend, too
    little memory)."""
    from gradspec.linalg._sketch import plan_for
    from gradspec.sketch import check_sketch_memory

    plan = plan_for(getattr(op, "source", None))
    if plan is None:
        return None
    if not plan.whole:  # its σ would be of some sketch columns, not of H: plausible and wrong
        raise ValueError(
            f"the selection takes {plan.blocks_selected} of the {plan.J} sketch blocks whole: the spectrum "
            "of part of a sketch is not H's (another scale, no stated error); select every sketch block "
            "(no --params), or only sketch.exact"
        )
    if meth not in (PcaMethod.AUTO, PcaMethod.GRAM):
        raise ValueError(
            f"{meth.value} does not state the error of a sketched store (it holds {plan.M} sketched "
            "columns); use --method gram"
        )
    if scheduler is not None:
        raise ValueError("the Dask backend does not state the error of a sketched store; drop --scheduler")
    check_sketch_memory(plan, op.shape[0], budget)
    return plan


def _pca_into(out, op, meth, run_params, resume, overwrite, v_dtype, mode, it, tol, oversample, seed, k,
              t_start, sketch=None):
    """The rest of :func:`pca`, holding the output's lock: open (or resume) it, run, finish."""
    store = None
    final = None
    sink = None
    if out is not None:
        store, final = _open_output(
            out,
            op=op,
            k=k,
            method=meth,
            params=run_params,
            resume=resume,
            overwrite=overwrite,
            v_dtype=v_dtype,
        )
        sink = _VSink(store)
    common = {"k": k, "sink": sink, "verify": mode, "out_dtype": np.dtype(v_dtype)}
    try:
        # the passes of earlier calls that a resume keeps (their state is what it resumes from)
        before = store.passes_done if (store is not None and resume) else 0
        result = _run_method(
            meth, op, store=store, resume=resume, iters=it, tol=tol,
            oversample=oversample, seed=seed, before=before, sketch=sketch, **common,
        )
        if sink is not None:
            sink.close()
        result.passes += before  # every pass the result rests on, earlier calls' included
        result.params = {**run_params, **result.params, **_rates(op)}
        result.timings["total"] = time.perf_counter() - t_start
        if store is not None:
            store.finish(result)
            if final is not None:
                store.move_to(final)
    except BaseException as exc:
        if sink is not None:
            sink.abort()
        if store is not None:
            if final is not None:  # the complete store at --out stays as it was
                shutil.rmtree(store.path, ignore_errors=True)
            else:
                _give_up(store, exc)
        raise
    acc = result.accuracy()
    logger.info(
        "pca: done in %.1fs, %d passes; max residual %.1e, reconstruction error %.4f",
        result.timings["total"],
        result.passes,
        acc["max_residual"],
        acc["reconstruction_error"],
    )
    for line in (acc.get("flags") or {}).values():
        logger.warning("pca check: %s", line)
    return result


def _rates(op: Any) -> dict[str, Any]:
    """What each pass achieved (``GradientOperator.pass_log``) and the Gram kernel that ran."""
    out: dict[str, Any] = {}
    log = getattr(op, "pass_log", None)
    if log:
        out["rates"] = [dict(entry) for entry in log]
    choice = getattr(op, "kernel_choice", None)
    if choice is not None:
        out["kernel"], out["kernel_reason"] = choice
    return out


#: The options each method uses (the others would be silently ignored).
_USES = {
    PcaMethod.GRAM: (),
    PcaMethod.LANCZOS: ("tol",),
    PcaMethod.ORTHOGONAL: ("iters", "tol"),
    PcaMethod.KRYLOV: ("iters",),
}


def _applicable(
    meth: PcaMethod, *, explicit: bool, iters: int | None, tol: float | None
) -> tuple[int | None, float | None]:
    """Refuse --iters/--tol that the method would ignore, requested or chosen by auto."""
    given = {"iters": iters, "tol": tol}
    unused = [f"--{name}" for name, v in given.items() if v is not None and name not in _USES[meth]]
    if unused:
        users = {
            name: [m.value for m, uses in _USES.items() if name in uses] for name in ("iters", "tol")
        }
        detail = "; ".join(f"{u} is used by {', '.join(users[u[2:]])}" for u in unused)
        how = "as requested" if explicit else "chosen by --method auto"
        raise ValueError(
            f"method {meth.value} ({how}) does not use {' and '.join(unused)} ({detail}); "
            "drop it or choose a method that uses it"
        )
    return iters, tol


def _run_method(
    meth: PcaMethod,
    op: Any,
    *,
    store: Any,
    resume: bool,
    iters: int | None,
    tol: float | None,
    oversample: int,
    seed: int,
    before: int = 0,
    sketch: Any = None,
    **common: Any,
) -> PcaResult:
    """Run one method; iterative ones checkpoint to ``store`` and, with ``resume``, start from its state."""
    r, p = op.shape
    k = common["k"]
    if meth is PcaMethod.GRAM:
        from gradspec.linalg.gram import gram_pca

        return gram_pca(op, sketch=sketch, **common)
    if meth is PcaMethod.LANCZOS:
        from gradspec.linalg.lanczos import lanczos_pca

        return lanczos_pca(op, tol=tol, seed=seed, **common)
    saved = store.load_state() if store is not None and resume else None

    def checkpoint(st: Any) -> None:  # the state, and how many passes it rests on (one write)
        store.save_state({**st.state_dict(), "passes_done": before + op.passes})

    checkpoint = checkpoint if store is not None else None
    iterative = dict(iters=iters, oversample=oversample, seed=seed, on_iteration=checkpoint)
    if meth is PcaMethod.ORTHOGONAL:
        from gradspec.linalg.orthogonal import OrthogonalState, block_size, orthogonal_pca

        state = None
        if saved is not None:
            state = OrthogonalState.load_state_dict(saved, r=r, b=block_size(k, oversample, r, p))
            logger.info("orthogonal: resuming after iteration %d", state.iteration)
        return orthogonal_pca(op, tol=tol, state=state, **iterative, **common)
    from gradspec.linalg.krylov import KrylovState, krylov_pca

    kstate = None
    if saved is not None:
        kstate = KrylovState.load_state_dict(saved, r=r)
        logger.info("krylov: resuming after pass %d", kstate.iteration)
    return krylov_pca(op, state=kstate, **iterative, **common)
