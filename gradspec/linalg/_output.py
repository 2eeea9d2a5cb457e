"""Where `pca` writes: opening (or resuming) the spectrum store, refusing to write over its
own source, streaming V into it, and marking it failed when a run gives up."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from gradspec._enums import PcaMethod

logger = logging.getLogger(__name__)

#: Run settings that change the numbers: a resumed run must use the saved ones.
RESUME_SETTINGS = (
    "k",
    "method",
    "iters",
    "tol",
    "oversample",
    "seed",
    "precision",
    "center",
    "rows",
    "params",
    "col_ranges",
    "v_dtype",
    "source_path",
)


def _source_rows(op: Any) -> np.ndarray | None:
    src = getattr(op, "source", None)
    return src.row_indices() if hasattr(src, "row_indices") else None


def _check_not_source(out: Any, desc: dict) -> None:
    """Refuse an --out that is, holds or lies inside the gradient store being read."""
    from gradspec.store import is_url, resolved_path

    src = desc.get("abspath")
    if src is None or is_url(out) or is_url(src):
        return
    o = Path(resolved_path(out))
    s = Path(src)
    if o == s or s in o.parents or o in s.parents:
        raise ValueError(
            f"--out {str(out)!r} is or contains the gradient store being read ({src}); "
            "choose another --out"
        )


def _lock_output(out: Any) -> Any:
    """One writer per spectrum store, as for runs: the store's own lock (taken by the store
    layer, ``SpectrumStore.lock_for_writing``), held for the whole run; None for a URL."""
    from gradspec.store import SpectrumStore

    return SpectrumStore.lock_for_writing(out)


def _open_output(
    out: Any,
    *,
    op: Any,
    k: int,
    method: PcaMethod,
    params: dict,
    resume: bool,
    overwrite: bool,
    v_dtype: str,
):
    """-> (store to write, final path when the store is staged beside a complete one, or None)."""
    from gradspec.store import SpectrumStatus, SpectrumStore, is_url

    r, p = op.shape
    desc = op.describe()
    _check_not_source(out, desc)
    if resume and Path(out).exists():
        store = SpectrumStore.open(out, mode="r+")
        if store.status == SpectrumStatus.COMPLETE:
            raise ValueError(
                f"{str(out)!r} is already complete; nothing to resume (use --overwrite to redo it)"
            )
        saved = store.params
        mismatch = [
            f"{name}: saved {_jsonish(saved.get(name))!r}, now {_jsonish(params.get(name))!r}"
            for name in RESUME_SETTINGS
            if _jsonish(saved.get(name)) != _jsonish(params.get(name))
        ]
        was = store.source
        for key, label in (("rows_resolved", "rows"), ("rows_digest", "source rows' metadata")):
            if was.get(key) is not None and was.get(key) != desc.get(key):
                mismatch.append(
                    f"{label}: saved {_rows_label(was.get(key))}, now {_rows_label(desc.get(key))}"
                )
        if store.shape != (r, p):
            mismatch.insert(0, f"shape: saved {store.shape}, now {(r, p)}")
        if mismatch:
            raise ValueError(
                f"cannot resume {str(out)!r}: it was started with other settings "
                f"({'; '.join(mismatch)}); resume with the saved ones, or --overwrite to start afresh"
            )
        if store.load_state() is None:
            logger.info("%r holds no completed pass: starting afresh in it", str(out))
        return store, None
    if not overwrite and not is_url(out) and Path(out).exists():
        _refuse_to_drop_a_saved_state(out, desc)
    target = out
    final = None
    if overwrite and not is_url(out) and Path(out).exists():
        try:
            complete = SpectrumStore.open(out).status == SpectrumStatus.COMPLETE
        except (ValueError, OSError):
            complete = False  # check_target refuses what is not a spectrum store
        if complete:
            # Write beside it; the complete store is replaced only when this run completes.
            final = Path(out)
            target = final.with_name(f".{final.name}.partial-{os.getpid()}")
            SpectrumStore.check_target(out, overwrite=True)
    store = SpectrumStore.create(
        target,
        r=r,
        p=p,
        k=k,
        method=method.value,
        params=params,
        source=desc,
        source_rows=_source_rows(op),
        v_dtype=v_dtype,
        v_chunk_rows=None,
        overwrite=overwrite or final is not None,
    )
    return store, final


def _refuse_to_drop_a_saved_state(out: Any, desc: dict) -> None:
    """A plain run into an unfinished store that holds an iterative run's saved state would delete
    it (was: a warning, and the state of a killed krylov run gone, even for a run of another
    gradients store, right after `info` said `--resume` continues it): only --overwrite may."""
    from gradspec.store import SpectrumStatus, SpectrumStore

    try:
        existing = SpectrumStore.open(out)
        if existing.status == SpectrumStatus.COMPLETE:
            return  # the store layer refuses a complete store without --overwrite
        done = existing.summary().get("iterations_done")
    except (ValueError, OSError):
        return  # not a spectrum store, or damaged: the store layer says so
    if done is None:
        return  # nothing to resume: replacing it loses nothing
    src = (existing.source or {}).get("abspath")
    other = "" if src is None or src == desc.get("abspath") else f" of another gradients store ({src})"
    raise FileExistsError(
        f"{str(out)!r} holds the saved state of an unfinished {existing.method} run{other}, "
        f"{done} iteration(s) done: `gradspec pca ... --resume` continues it, --overwrite discards "
        "it; or choose another --out"
    )


def _rows_label(value: Any) -> str:
    if isinstance(value, dict) and "start" in value:
        step = value.get("step", 1)
        return f"{value['start']}:{value['stop']}" + (f":{step}" if step != 1 else "")
    if isinstance(value, str):
        return f"digest {value[:12]}…"
    return repr(value)


def _jsonish(value: Any) -> Any:
    """Settings as they read back from a store's JSON attributes (tuples as lists)."""
    import json

    from gradspec.store import jsonable

    return json.loads(json.dumps(jsonable(value)))


class _VSink:
    """The spectrum store's V writer, created for the k of the first block.

    pca may keep fewer directions than asked for (see ``_result.finalize``): the
    store's arrays are sized to them before any row of V is written.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.writer: Any = None

    def __call__(self, offset: int, block: np.ndarray) -> None:
        if self.writer is None:
            self.store.resize_k(int(block.shape[1]))
            self.writer = self.store.v_sink()
        self.writer(offset, block)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


def _give_up(store: Any, exc: BaseException) -> None:
    """After a failed run: keep a resumable state (marked), else remove the partial store."""
    status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    try:
        if store.load_state() is not None:
            store.mark_unfinished(status, f"{type(exc).__name__}: {exc}")
            logger.warning(
                "pca %s; its state is kept in %r: --resume continues it, --overwrite replaces it",
                status,
                store.path,
            )
        else:
            store.discard()
    except Exception as cleanup:  # never hide the run's own error
        logger.warning("could not clean up %r after the failed run: %s", store.path, cleanup)


