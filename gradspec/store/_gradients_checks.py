"""A committed row never reads as fill: the gradient store's chunk checks.

A mixin of :class:`gradspec.store.GradientStore` (its core, ``_gradients``, holds the
arrays and the chunk listings this checks; ``_integrity`` has the rule for any array).
Every read and every commit asks it whether the chunks of committed rows it touches are
stored; :meth:`GradientChecks.verify` reads them all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradspec.store._checksum import FOREIGN, corrupt_chunks
from gradspec.store._checksum import PROBLEM as CORRUPT
from gradspec.store._gradients_schema import NAN_MEANS_UNKNOWN
from gradspec.store._integrity import (
    StoreDamagedError,
    chunk_problems,
    chunk_span,
    col_chunks,
    committed_chunks,
    damage_error,
    raw_chunk_bytes,
    row_chunks,
    unreadable,
    verify_arrays,
)

logger = logging.getLogger(__name__)


class GradientChecks:
    """The damage checks of a :class:`~gradspec.store.GradientStore`."""

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)

    def _missing(self, name: str, missing: list[tuple[int, ...]]) -> None:
        """Raise for missing chunks of committed rows (warn for a store that predates full chunks),
        and for chunk names holding a symbolic link or not a regular file (in any store)."""
        if not missing:
            return
        rc = int(self._arrays()[name].chunks[0])
        pres = self._presence[name]
        odd = [(c, p) for c in missing if (p := pres.problem(c)) not in (None, "missing")]
        if odd:
            (first, problem), more = odd[0], len(odd) - 1
            raise damage_error(self.path, name, pres.key(first), chunk_span(first[0], rc, self._rows), self._rows,
                               problem, more)
        first = missing[0]
        if not self._strict:
            if name == "grads":
                self._warn_once(
                    "absent",
                    f"{self.path}: chunk {name}/{self._presence[name].key(first)} of committed rows is absent and "
                    "reads as zeros; this store predates gradspec writing every chunk, so it may be an all-zero "
                    "chunk or a lost file: `gradspec info --verify` lists them",
                )
            return
        raise damage_error(self.path, name, self._presence[name].key(first),
                           chunk_span(first[0], rc, self._rows), self._rows, "missing", len(missing) - 1)

    def _chunk_damaged(self, i: int, j: int, problem: str) -> None:
        """The fast reader's report of a missing or wrong-sized chunk file."""
        if problem == "missing":
            self._missing("grads", [(i, j)])
            return
        raise damage_error(self.path, "grads", self._presence["grads"].key((i, j)),
                           chunk_span(i, self.chunks[0], self._rows), self._rows, problem)

    def _chunk_bound(self, i: int, j: int, chunk: np.ndarray, checksum: int | None) -> bool:
        """Whether grads chunk (i, j), read whole (``chunk``, as stored; ``checksum``: the CRC its
        file ends with, None when read through zarr) holds the rows this store recorded."""
        if checksum is not None:
            return self._row_sums.check_chunk(self._rows, i, j, chunk, checksum)
        rc, cc = self.chunks
        a, b = chunk_span(i, rc, self._rows)
        return self._row_sums.check_block(self._rows, np.arange(a, b), j * cc, min((j + 1) * cc, self.p),
                                          chunk[: b - a]) is None

    def _check_bound(self, idx: slice | np.ndarray, c0: int, c1: int, block: np.ndarray) -> None:
        """Raise for a chunk of a zarr read (rows ``idx`` × [c0, c1), as stored) whose rows are not
        the ones this store recorded (``_rowsums``; nothing to check in a store written before)."""
        if self._row_sums is None:
            return
        rows = np.arange(idx.start, idx.stop, idx.step or 1) if isinstance(idx, slice) else np.asarray(idx)
        bad = self._row_sums.check_block(self._rows, rows, c0, c1, block)
        if bad is not None:
            raise damage_error(self.path, "grads", self._presence["grads"].key(bad),
                               chunk_span(bad[0], self.chunks[0], self._rows), self._rows, FOREIGN)

    def _unreadable(self, name: str, idx: slice | np.ndarray, exc: BaseException,
                    cols: tuple[int, int] | None = None) -> StoreDamagedError:
        """The error of a zarr read of rows ``idx`` (× ``cols``) of array ``name`` that failed: it names
        the first chunk whose checksum fails, else says where to look."""
        arr = self._arrays()[name]
        rc = int(arr.chunks[0])
        if len(arr.shape) == 1:
            coords = [(i,) for i in row_chunks(idx, rc)]
        else:
            c0, c1 = cols or (0, int(arr.shape[1]))
            coords = [(i, j) for i in row_chunks(idx, rc) for j in col_chunks(c0, c1, int(arr.chunks[1]))]
        bad = corrupt_chunks(arr, coords)
        if not bad:
            return unreadable(self.path, name, exc)
        return damage_error(self.path, name, self._presence[name].key(bad[0]),
                            chunk_span(bad[0][0], rc, self._rows), self._rows, CORRUPT, len(bad) - 1)

    def _read_array(self, name: str, idx: slice | np.ndarray) -> np.ndarray:
        """Rows ``idx`` of array ``name`` (metadata, norms, dtype stats), read through zarr; where the
        store records its rows' checksums (``_rowsums``), they are checked too."""
        arr = self._arrays()[name]
        try:
            out = np.asarray(arr[idx] if isinstance(idx, slice) else arr.get_orthogonal_selection(idx))
        except (RuntimeError, ValueError, OSError) as exc:
            raise self._unreadable(name, idx, exc) from exc
        if self._row_sums is not None and name in self._row_sums.small and out.shape[0]:
            # the rows read (a commit reads rows it is about to commit: check_small skips them)
            rows = np.arange(*idx.indices(arr.shape[0])) if isinstance(idx, slice) else np.asarray(idx)
            bad = self._row_sums.check_small(self._rows, name, rows, out)
            if bad is not None:
                raise damage_error(self.path, name, self._presence[name].key((bad,) + (0,) * (arr.ndim - 1)),
                                   chunk_span(bad, int(arr.chunks[0]), self._rows), self._rows, FOREIGN)
        return out

    def _require(self, idx: slice | np.ndarray, ranges: Sequence[tuple[int, int]]) -> None:
        """Check that every grads chunk a read of rows ``idx`` × ``ranges`` touches is stored."""
        rc, cc = self.chunks
        cols = dict.fromkeys(j for a, b in ranges for j in col_chunks(a, b, cc))
        coords = [(i, j) for i in row_chunks(idx, rc) for j in cols]
        self._missing("grads", self._presence["grads"].missing(coords))

    def find_missing_chunks(self) -> list[dict[str, Any]]:
        """The chunks of committed rows that are not stored, or (local, uncompressed: every chunk
        file has one size) are the wrong size: a stat each; nothing is read.

        Returns:
            ``[{"array", "chunk", "rows": [first, last], "problem"}]`` (problem ``"missing"``, a
            symbolic link or not a regular file in the chunk's place, or ``"truncated: ..."`` /
            ``"too long: ..."``); in a store that predates gradspec writing every chunk, missing
            metadata chunks are left out (they may be all zero).
        """
        out = []
        for name, arr in self._arrays().items():
            if not self._strict and name != "grads":
                continue
            pres = self._presence[name]
            pres.forget()
            rc = int(arr.chunks[0])
            for c, problem in chunk_problems(pres, committed_chunks(arr, self._rows), raw_chunk_bytes(arr)):
                a, b = chunk_span(c[0], rc, self._rows)
                out.append({"array": name, "chunk": pres.key(c), "rows": [a, b - 1], "problem": problem})
        return out

    def check_resumable(self, kept: int, what: str, remedy: str) -> None:
        """Refuse to append after the first ``kept`` rows of a damaged store, before any step
        is trained: a chunk of those rows missing or the wrong size (a stat each), or a chunk
        holding the last of them (the one appended to) failing its read and checks.

        Raises:
            ValueError: one line naming the first such chunk, ``what`` the store is to the
                caller and the ``remedy``.
        """
        lost = [m for m in self.find_missing_chunks() if m["rows"][0] < kept]
        if lost:
            first = lost[0]
            raise ValueError(
                f"{what} {str(self.path)!r} is damaged: {len(lost)} chunk(s) of the rows kept are missing or "
                f"the wrong size (first: {first['array']} chunk {first['chunk']}, rows {first['rows'][0]}.."
                f"{first['rows'][1]}: {first['problem']}); it cannot be resumed: {remedy} (gradspec info "
                "--verify lists the damage)")
        if kept:  # the chunks appended to: read and checked (a flipped byte)
            bad = [d for d in self.verify(start=kept - 1)["damaged"] if d["rows"][0] < kept]
            if bad:
                first = bad[0]
                raise ValueError(
                    f"{what} {str(self.path)!r} is damaged: {first['array']} chunk {first['chunk']} (rows "
                    f"{first['rows'][0]}..{first['rows'][1]}), which the resume would append to, is "
                    f"{first['problem']}; it cannot be resumed: {remedy} (gradspec info --verify lists all "
                    "the damage)")

    def verify(self, *, progress: bool = False, start: int = 0) -> dict[str, Any]:
        """Read every chunk of every committed row (gradients and metadata) and report damage;
        ``start``: only the chunks holding rows from ``start`` on (a resume's last kept chunk).

        Returns:
            ``{"path", "ok", "chunks", "bytes", "damaged": [{array, chunk, rows, problem}],
            "non_finite": {array: {"count", "rows"}}, "absent_zero_chunks"}``, and
            ``"out_of_range": {array: {"count", "rows"}}`` where a per-example norm is negative
            or a clip factor outside (0, 1]; ``ok`` is False when a chunk is missing,
            truncated, the wrong size or undecodable, or a value is NaN, infinite or out of range.
        """
        bound: dict[str, Any] = {}
        if self._row_sums is not None:
            sums = self._row_sums
            bound["grads"] = lambda c, block, crc: self._chunk_bound(*c, block, crc)
            for name in sums.small:
                bound[name] = (lambda c, block, crc, name=name:
                               sums.small_chunk_ok(self._rows, name, c[0], block, crc))
        report = verify_arrays(self._arrays(), self._rows, strict=self._strict,
                               dtypes={"grads": self._dtype}, nan_ok={f"meta/{f}" for f in NAN_MEANS_UNKNOWN},
                               progress=progress, bound=bound, start=start)
        self._verify_norm_ranges(report, start)
        return {"path": self.path, **report}
