"""Writing a spectrum store: V in row blocks, the resumable state, the result, the status.

A mixin of :class:`gradspec.store.SpectrumStore` (its core, ``_spectrum``, opens and
reads the store; see that module for the layout and the lifecycle).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Self

import numpy as np

import gradspec.store._checksum as _checksum
from gradspec.store._integrity import ALL_CHUNKS_KEY, StoreDamagedError
from gradspec.store._lock import RunLock
from gradspec.store._manifest import MANIFEST_KEY, Manifest, record
from gradspec.store._rowsink import RowBlockWriter
from gradspec.store._source import jsonable as _jsonable
from gradspec.store._spectrum_owner import OWNER_KEY, this_process, writer_lock
from gradspec.store._spectrum_schema import (
    ALL_CHUNKS,
    COMPLETE,
    KIND,
    OPTIONAL_ARRAYS,
    RESULT_ARRAYS,
    RUNNING,
    STATUS_KEY,
    UNFINISHED,
    VECTOR_ARRAYS,
    _create_arrays,
)
from gradspec.store._zarr import create_group, is_url, open_checked, update_attrs

logger = logging.getLogger(__name__)


class SpectrumWrites:
    """The writing half of a :class:`~gradspec.store.SpectrumStore`."""

    def _check_writable(self) -> None:
        if self.mode == "r":
            raise ValueError(f"{self.path!r} is open read-only; open it with mode='r+' to write")

    def resize_k(self, k: int) -> None:
        """Hold ``k`` directions instead (before V is written): arrays recreated, all zero."""
        self._check_writable()
        r, p = self.shape
        if not 1 <= k <= self.k_requested:
            raise ValueError(f"k must lie in [1, {self.k_requested}] (the k requested), got {k}")
        if k == self.k and self._group["V"].shape == (p, k):
            return
        v_dtype = str(self._group["V"].dtype)
        _create_arrays(self._group, r=r, p=p, k=k, v_dtype=v_dtype)
        update_attrs(self._group, {"gradspec.k": int(k)})

    def v_sink(self) -> RowBlockWriter:
        """A ``sink(offset, rows)`` writing streamed rows of V in whole chunks, behind the caller.

        Close it (or use it as a context manager) to land every row.
        """
        self._check_writable()
        return RowBlockWriter(self._arr("V"))

    def save_state(self, state: dict[str, Any]) -> None:
        """Save an iterative run's state (arrays under ``state/``, the rest in attrs)."""
        self._check_writable()
        small = {}
        for key, val in state.items():
            if isinstance(val, np.ndarray):
                name = f"state/{key}"
                if name in self._group and self._group[name].shape != val.shape:
                    del self._group[name]
                if name not in self._group:
                    self._group.create_array(
                        name,
                        shape=val.shape,
                        chunks=val.shape or (1,),
                        dtype="float64",
                        fill_value=0,
                        compressors=_checksum.checksum_codecs(),
                        config=ALL_CHUNKS,
                    )
                self._arr(name)[...] = val
            else:
                small[key] = val
        small["arrays"] = [k for k, v in state.items() if isinstance(v, np.ndarray)]
        update_attrs(self._group, {"gradspec.state": _jsonable(small)})  # written last: state is valid

    @property
    def passes_done(self) -> int:
        """The passes over H the saved state rests on, over every call that made it (its
        ``passes_done``; 0 when none was recorded): a resume adds its own, so the finished
        store's ``gradspec.passes`` counts them all."""
        n = (self.attrs.get("gradspec.state") or {}).get("passes_done", 0)
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0

    def load_state(self) -> dict[str, Any] | None:
        """The saved state of an interrupted iterative run, to resume it (None when none was saved)."""
        meta = self.attrs.get("gradspec.state")
        if meta is None:
            return None
        state = {k: v for k, v in meta.items() if k != "arrays"}
        for key in meta.get("arrays", []):
            state[key] = self._read(f"state/{key}")
        for key in ("u", "theta", "resid"):
            state.setdefault(key, None)
        return state

    def mark_unfinished(self, status: str, error: str) -> None:
        """Record that the run stopped (``failed`` or ``interrupted``) with its resumable state."""
        self._check_writable()
        if status not in UNFINISHED:
            raise ValueError(f"status must be one of {tuple(map(str, UNFINISHED))}, got {status!r}")
        update_attrs(self._group, {STATUS_KEY: status, "gradspec.error": str(error)[:500]})

    def discard(self) -> None:
        """Delete this unfinished store from disk (a complete store is never deleted)."""
        if self.status == COMPLETE:
            raise ValueError(f"{self.path!r} is complete; it is not discarded")
        if is_url(self.path):
            self._group.store.clear()  # type: ignore[union-attr]
        else:
            shutil.rmtree(self.path, ignore_errors=True)

    def move_to(self, path: str | os.PathLike) -> Self:
        """Move this complete store to ``path``, replacing the spectrum store there (local disk).

        The old store is renamed aside first and deleted only after this one is in place.
        """
        if self.status != COMPLETE:
            raise ValueError(f"{self.path!r} is not complete; only a finished run replaces a store")
        dest = Path(path)
        old = dest.with_name(f".{dest.name}.replaced-{os.getpid()}")
        moved = False
        if dest.exists():
            open_checked(dest, KIND)  # a spectrum store (damaged or not), or this raises and nothing moves
            os.replace(dest, old)
            moved = True
        try:
            os.replace(self.path, dest)
        except BaseException:
            if moved:
                os.replace(old, dest)  # put the old store back
            raise
        shutil.rmtree(old, ignore_errors=True)
        return type(self).open(dest)

    def finish(self, result: Any) -> None:
        """Write σ, U, the accuracy report and provenance of a finished run; status ``complete``.

        ``result.k`` may be below the store's k (directions dropped after V was
        streamed, see ``gradspec.linalg``): the arrays are cut to it.
        """
        self._check_writable()
        g = self._group
        k = int(np.asarray(result.sigma).size)
        if k < self.k:
            r, p = self.shape
            g["V"].resize((p, k))
            g["U"].resize((r, k))
            for name in ("sigma", *VECTOR_ARRAYS):
                g[name].resize((k,))
        elif k > self.k:
            raise ValueError(f"the result holds {k} directions, the store {self.k}")
        self._arr("sigma")[:] = result.sigma
        self._arr("U")[:] = result.U
        for name in VECTOR_ARRAYS:
            self._arr(name)[:] = getattr(result, name)
        norms = getattr(result, "row_sq_norms", None)
        if "row_sq_norms" in g:
            del g["row_sq_norms"]
        if norms is not None:
            # ‖h_i‖² of the rows U describes: with U and σ, an exact spectrum's in-sample G_k
            # without another pass over H (`gradspec decay`, gradspec.spectrum)
            g.create_array(
                "row_sq_norms", shape=(self.shape[0],), chunks=(self.shape[0],), dtype="float64",
                fill_value=0, compressors=_checksum.checksum_codecs(), config=ALL_CHUNKS,
            )[:] = np.asarray(norms, dtype=np.float64)
        hv = getattr(result, "hv", None)
        if "hv" in g:
            del g["hv"]
        if hv is not None:  # H·V measured (a checked replay): the rows' G_k onto V's span
            g.create_array(
                "hv", shape=(self.shape[0], k), chunks=(self.shape[0], max(k, 1)), dtype="float64",
                fill_value=0, compressors=_checksum.checksum_codecs(), config=ALL_CHUNKS,
            )[:] = np.asarray(hv, dtype=np.float64)
        written = (*RESULT_ARRAYS, *(n for n in OPTIONAL_ARRAYS if n in g))
        for name in written:
            self._checks.require(name, self._arr(name))  # V streamed whole, nothing lost: or not complete
        if "state" in g:
            del g["state"]
        # every chunk's CRC, where the attributes' digest covers it: a chunk file that is not this
        # store's, though its own CRC holds, is found when read (``_manifest``)
        manifest = record({name: self._arr(name) for name in written})
        update_attrs(
            g,
            {
                STATUS_KEY: COMPLETE,
                "gradspec.k": k,
                "gradspec.rank_rtol": result.params.get("rank_rtol"),
                "gradspec.method": result.method,
                "gradspec.params": _jsonable(result.params),
                "gradspec.source": _jsonable(result.source),
                "gradspec.accuracy": _jsonable(result.accuracy()),
                "gradspec.frob2": float(result.frob2),
                "gradspec.rank": result.rank,
                "gradspec.history": _jsonable(result.history),
                "gradspec.timings": _jsonable(result.timings),
                "gradspec.passes": int(result.passes),
                "gradspec.finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                MANIFEST_KEY: manifest,
            },
            remove=("gradspec.state", "gradspec.error"),
        )
        self._checks.manifest = Manifest(manifest)

    @staticmethod
    def lock_for_writing(path: str | os.PathLike) -> RunLock | None:
        """Take the one-writer lock of the spectrum store at ``path`` (None for a URL).

        A writer takes it before it creates, resumes or replaces the store and releases it
        (``.release()``, or ``with``) once the store is finished or given up; the lock file
        sits beside the store (``.NAME.lock``), so it outlives an overwrite. `gradspec pca`
        holds it for its whole run, so that two runs writing one ``--out`` cannot both print
        results when only one of them is stored.

        Raises:
            DirectoryBusyError: another process (or thread) writes the store; the message
                names its pid, host and start time.
        """
        lock = writer_lock(path)
        return lock.acquire() if lock is not None else None

    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        *,
        r: int,
        p: int,
        k: int,
        method: str,
        params: dict[str, Any] | None = None,
        source: dict[str, Any] | None = None,
        source_rows: np.ndarray | None = None,
        v_dtype: str = "float32",
        v_chunk_rows: int | None = None,
        overwrite: bool = False,
    ) -> Self:
        """Create an empty spectrum store for k triplets of an r×p matrix (status ``running``).

        ``overwrite`` replaces an existing *spectrum store* (or an empty directory)
        only; anything else at ``path`` is refused, never deleted. Without it, an
        unfinished store that no live process owns (see :meth:`replaceable`) is
        replaced and anything else at ``path`` is refused.
        """
        if not 1 <= k <= min(r, p):
            raise ValueError(f"k must lie in [1, min(r, p)] = [1, {min(r, p)}], got {k}")
        if v_dtype not in ("float32", "float64"):
            raise ValueError(f"V dtype must be float32 or float64, got {v_dtype!r}")
        if source_rows is not None and np.asarray(source_rows).shape != (r,):
            raise ValueError(f"source_rows must hold the {r} row indices, got shape "
                             f"{np.asarray(source_rows).shape}")
        replace = cls.check_target(path, overwrite=overwrite)
        attrs = {
            STATUS_KEY: RUNNING,
            "gradspec.shape": [int(r), int(p)],
            "gradspec.k": int(k),
            "gradspec.k_requested": int(k),
            "gradspec.method": str(method),
            "gradspec.params": _jsonable(params or {}),
            "gradspec.source": _jsonable(source or {}),
            "gradspec.created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            OWNER_KEY: this_process(),
            ALL_CHUNKS_KEY: True,
        }
        g = create_group(path, KIND, attrs, overwrite or replace)
        _create_arrays(g, r=r, p=p, k=k, v_dtype=v_dtype, v_chunk_rows=v_chunk_rows)
        if source_rows is not None:
            g.create_array(
                "source_rows", shape=(r,), chunks=(r,), dtype="int64", fill_value=0,
                compressors=_checksum.checksum_codecs(), config=ALL_CHUNKS,
            )[:] = np.asarray(source_rows, dtype=np.int64)
        return cls(g, str(path), "r+")

    @classmethod
    def check_target(cls, path: str | os.PathLike, *, overwrite: bool) -> bool:
        """Whether creating a store at ``path`` replaces one; raise if it must not be touched.

        Returns True when ``path`` holds a spectrum store that may be replaced: any
        spectrum store with ``overwrite``, else an unfinished one no live process owns.

        Raises:
            FileExistsError: ``path`` holds something that is not a spectrum store, a
                complete store (without ``overwrite``), or a run that may still be going.
        """
        if is_url(path) or not Path(path).exists():
            return False
        p = Path(path)
        if p.is_dir() and not any(p.iterdir()):
            return False
        try:
            existing = cls.open(path)
        except StoreDamagedError as exc:
            if overwrite:
                return True  # a damaged spectrum store is still a spectrum store
            raise FileExistsError(f"{exc}; or pass --overwrite to replace it") from None
        except (ValueError, FileNotFoundError, OSError):
            raise FileExistsError(
                f"{str(path)!r} exists and is not a spectrum store; refusing to replace it "
                "(--overwrite replaces spectrum stores only): choose another --out"
            ) from None
        if overwrite:
            return True
        why = existing.replaceable()
        if why is not None:
            logger.warning("replacing the unfinished spectrum store %r (%s)", str(path), why)
            return True
        if existing.status == COMPLETE:
            raise FileExistsError(
                f"{str(path)!r} already exists and holds a complete spectrum; choose another --out, "
                "or pass --overwrite to replace it"
            )
        owner = existing.attrs.get(OWNER_KEY) or {}
        raise FileExistsError(
            f"{str(path)!r} already exists: a pca run (pid {owner.get('pid', '?')} on "
            f"{owner.get('host', '?')}) is writing it or was killed; --resume continues it, "
            "--overwrite replaces it"
        )
