"""The spectrum store: what `gradspec pca` writes (Zarr v3).

Layout of a spectrum directory::

    OUT/zarr.json      attrs: gradspec.kind = "spectrum", status (running|complete), method and
                       its parameters, source store with its row/parameter selection, shape,
                       accuracy report, per-iteration history, timings
    OUT/sigma          (k,)   singular values, descending (float64)
    OUT/U              (r, k) left singular vectors (float64)
    OUT/V              (p, k) right singular vectors, chunked along p, written as they stream
    OUT/residuals      (k,)   √(residual_h² + residual_ht²) per vector
    OUT/residual_h     (k,)   ‖H·v_i − σ_i·u_i‖/σ_i
    OUT/residual_ht    (k,)   ‖Hᵀ·u_i − σ_i·v_i‖/σ_i
    OUT/explained_variance_ratio, OUT/cumulative_explained_variance   (k,)
    OUT/state/…        the resumable state of an iterative run (removed when complete)

V is read back in row (p) blocks with :meth:`SpectrumStore.iter_v_blocks` for
projections and G_k computations.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import zarr

from gradspec.store._rowsink import RowBlockWriter
from gradspec.store._zarr import create_group, open_checked, size_on_disk

KIND = "spectrum"
STATUS_KEY = "gradspec.status"
V_CHUNK_BYTES = 8 * 2**20
VECTOR_ARRAYS = (
    "residuals",
    "residual_h",
    "residual_ht",
    "explained_variance_ratio",
    "cumulative_explained_variance",
)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return str(obj)
    return obj


class SpectrumStore:
    """Top-k singular triplets of a gradient matrix with their accuracy report."""

    def __init__(self, group: zarr.Group, path: str, mode: str) -> None:
        self._group, self.path, self.mode = group, str(path), mode

    # ------------------------------------------------------------------ create / open
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
        v_dtype: str = "float32",
        v_chunk_rows: int | None = None,
        overwrite: bool = False,
    ) -> SpectrumStore:
        """Create an empty spectrum store for k triplets of an r×p matrix (status ``running``)."""
        if not 1 <= k <= min(r, p):
            raise ValueError(f"k must lie in [1, min(r, p)] = [1, {min(r, p)}], got {k}")
        if v_dtype not in ("float32", "float64"):
            raise ValueError(f"V dtype must be float32 or float64, got {v_dtype!r}")
        itemsize = np.dtype(v_dtype).itemsize
        rows = v_chunk_rows or max(256, V_CHUNK_BYTES // (itemsize * k))
        attrs = {
            STATUS_KEY: "running",
            "gradspec.shape": [int(r), int(p)],
            "gradspec.k": int(k),
            "gradspec.method": str(method),
            "gradspec.params": _jsonable(params or {}),
            "gradspec.source": _jsonable(source or {}),
            "gradspec.created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        g = create_group(path, KIND, attrs, overwrite)
        g.create_array(
            "V",
            shape=(p, k),
            chunks=(int(min(rows, p)), k),
            dtype=v_dtype,
            fill_value=0,
            compressors=None,
        )
        g.create_array(
            "U", shape=(r, k), chunks=(r, k), dtype="float64", fill_value=0, compressors=None
        )
        for name in ("sigma", *VECTOR_ARRAYS):
            g.create_array(
                name, shape=(k,), chunks=(k,), dtype="float64", fill_value=0, compressors=None
            )
        return cls(g, str(path), "r+")

    @classmethod
    def open(cls, path: str | os.PathLike, mode: str = "r") -> SpectrumStore:
        """Open an existing spectrum store (``mode="r+"`` to resume writing it)."""
        return cls(open_checked(path, KIND, mode), str(path), mode)

    # ------------------------------------------------------------------ properties
    @property
    def attrs(self) -> dict[str, Any]:
        return self._group.attrs.asdict()

    @property
    def status(self) -> str:
        return str(self.attrs.get(STATUS_KEY, "running"))

    @property
    def shape(self) -> tuple[int, int]:
        r, p = self.attrs["gradspec.shape"]
        return int(r), int(p)

    @property
    def k(self) -> int:
        return int(self.attrs["gradspec.k"])

    @property
    def method(self) -> str:
        return str(self.attrs["gradspec.method"])

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.attrs.get("gradspec.params", {}))

    @property
    def source(self) -> dict[str, Any]:
        return dict(self.attrs.get("gradspec.source", {}))

    @property
    def sigma(self) -> np.ndarray:
        return np.asarray(self._group["sigma"][:])

    @property
    def U(self) -> np.ndarray:
        return np.asarray(self._group["U"][:])

    @property
    def V(self) -> zarr.Array:
        """V as a lazy Zarr array (p×k); slice it or use :meth:`iter_v_blocks`."""
        return self._group["V"]

    def array(self, name: str) -> np.ndarray:
        return np.asarray(self._group[name][:])

    def read_v(self, rows: slice | None = None) -> np.ndarray:
        return np.asarray(self._group["V"][rows or slice(None)])

    def iter_v_blocks(self, block_rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """Yield ``(offset, V[offset:offset+b])`` row blocks of V (b = chunk rows by default)."""
        v = self._group["V"]
        b = int(block_rows or v.chunks[0])
        for i in range(0, v.shape[0], b):
            yield i, np.asarray(v[i : i + b])

    # ------------------------------------------------------------------ writing
    def _check_writable(self) -> None:
        if self.mode == "r":
            raise ValueError(f"{self.path!r} is open read-only; open it with mode='r+' to write")

    def v_sink(self) -> RowBlockWriter:
        """A ``sink(offset, rows)`` writing streamed rows of V in whole chunks, behind the caller.

        Close it (or use it as a context manager) to land every row.
        """
        self._check_writable()
        return RowBlockWriter(self._group["V"])

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
                        compressors=None,
                    )
                self._group[name][...] = val
            else:
                small[key] = val
        small["arrays"] = [k for k, v in state.items() if isinstance(v, np.ndarray)]
        self._group.attrs.update(
            {"gradspec.state": _jsonable(small)}
        )  # written last: state is valid

    def load_state(self) -> dict[str, Any] | None:
        meta = self.attrs.get("gradspec.state")
        if meta is None:
            return None
        state = {k: v for k, v in meta.items() if k != "arrays"}
        for key in meta.get("arrays", []):
            state[key] = np.asarray(self._group[f"state/{key}"][...])
        for key in ("u", "theta", "resid"):
            state.setdefault(key, None)
        return state

    def finish(self, result: Any) -> None:
        """Write σ, U, the accuracy report and provenance of a finished run; status ``complete``."""
        self._check_writable()
        g = self._group
        g["sigma"][:] = result.sigma
        g["U"][:] = result.U
        for name in VECTOR_ARRAYS:
            g[name][:] = getattr(result, name)
        if "state" in g:
            del g["state"]
        if "gradspec.state" in g.attrs:
            del g.attrs["gradspec.state"]
        g.attrs.update(
            {
                STATUS_KEY: "complete",
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
            }
        )

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict[str, Any]:
        """What `gradspec info` shows."""
        a = self.attrs
        out: dict[str, Any] = {
            "kind": KIND,
            "path": self.path,
            "status": self.status,
            "shape": list(self.shape),
            "k": self.k,
            "method": self.method,
            "params": self.params,
            "source": self.source,
            "size_on_disk": size_on_disk(self.path),
        }
        if self.status == "complete":
            sigma = self.sigma
            cev = self.array("cumulative_explained_variance")
            out.update(
                {
                    "sigma_top": [float(s) for s in sigma[:5]],
                    "sigma_last": float(sigma[-1]),
                    "explained_variance": float(cev[-1]),
                    "accuracy": a.get("gradspec.accuracy"),
                    "passes": a.get("gradspec.passes"),
                    "timings": a.get("gradspec.timings"),
                }
            )
        elif "gradspec.state" in a:
            out["iterations_done"] = a["gradspec.state"].get("iteration")
        return out

    def __repr__(self) -> str:
        r, p = self.shape
        return f"SpectrumStore({self.path!r}, r={r}, p={p}, k={self.k}, method={self.method}, {self.status})"
