"""What a recorder needs before its first row: the recorded parameters and their layout, the
store's name in a run directory, the run lock, the user's module inside Opacus wrappers, and
the torch dtype of each store dtype."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from gradspec.store import GradientStore, ParamLayout

logger = logging.getLogger(__name__)

STORE_NAME = "gradients.zarr"

def _acquire_run_lock(out: Path) -> Any:
    """Take the run directory's one-writer lock (:class:`gradspec.store.RunLock`), before anything is touched.

    Raises:
        DirectoryBusyError: another process (or thread) writes in ``out``.
    """
    from gradspec.store import RunLock

    return RunLock(out, what="run directory").acquire()


def _release_run_lock(lock: Any) -> None:
    if lock is not None:
        lock.release()


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside Opacus wrappers (``GradSampleModule``) and data-parallel ones
    (``DistributedDataParallel``, Opacus ``DPDDP``, ``DataParallel``), for parameter names
    without their ``_module.`` / ``module.`` prefixes."""
    while True:
        if type(model).__module__.startswith("opacus.") and isinstance(getattr(model, "_module", None), nn.Module):
            model = model._module
        elif _data_parallel(model):
            model = model.module
        else:
            return model


def _data_parallel(model: nn.Module) -> bool:
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(model, DistributedDataParallel | DataParallel):
        return True
    return (type(model).__module__.startswith("opacus.") and type(model).__name__.endswith("DistributedDataParallel")
            and isinstance(getattr(model, "module", None), nn.Module))


def resolve_layout(model, params, layout) -> tuple[list[str], list[Tensor] | None, ParamLayout]:
    """The recorded parameters' names, tensors (None from a layout alone) and row layout, from
    exactly one of: ``model`` (with ``params`` patterns), a ``params`` mapping, a ``layout``."""
    if layout is not None:
        if model is not None or params is not None:
            raise ValueError("give the rows' layout by model (and params), by params alone, or by layout; not several")
        return layout.names, None, layout
    if isinstance(params, Mapping):
        if model is not None:
            raise ValueError("params as a name -> parameter mapping replaces model; pass one of them")
        named = list(params.items())
    elif model is not None:
        from gradspec.train import select_parameters

        inner = unwrap_model(model)
        if params is None:
            named = [(n, p) for n, p in inner.named_parameters() if p.requires_grad]
            if not named:
                raise ValueError(f"{type(inner).__name__} has no parameter with requires_grad; pass params=")
        else:
            chosen = set(select_parameters(inner, params))
            named = [(n, p) for n, p in inner.named_parameters() if n in chosen]
    else:
        raise ValueError("a GradientRecorder needs the recorded parameters: pass model=, params= or layout=")
    for name, p in named:
        if not isinstance(p, Tensor):
            raise ValueError(f"params[{name!r}] is a {type(p).__name__}, not a tensor")
    layout = ParamLayout.from_shapes((n, tuple(p.shape)) for n, p in named)
    return [n for n, _ in named], [p for _, p in named], layout


def _sketch_text(attribute: Mapping[str, Any] | None) -> str:
    if attribute is None:
        return "unsketched rows"
    return (f"rows of sketch={attribute.get('requested_M')}, sketch_seed={attribute.get('seed')}, "
            f"sketch_blocks={len(attribute.get('blocks') or [])}")


def refuse_existing(out: Path, overwrite: bool) -> None:
    """Refuse to replace the store in ``out`` unless ``overwrite``.

    Raises:
        FileExistsError: ``out`` holds a store and ``overwrite`` is False.
    """
    if (out / STORE_NAME).exists() and not overwrite:
        raise FileExistsError(
            f"{str(out)!r} already holds a gradient store: pass resume=True to continue it or overwrite=True to replace it"
        )


def same_settings(attribute: Mapping[str, Any] | None, plan: Any) -> bool:
    """Whether a store's ``gradspec.sketch`` attribute was made with ``plan``'s settings (asked-for
    M, seed, blocks), whatever its column split."""
    if attribute is None or plan is None:
        return attribute is None and plan is None
    from gradspec.sketch import plan_settings

    made = plan_settings(attribute)
    params = [(str(d.get("name")), [int(v) for v in d.get("shape", [])]) for d in attribute.get("params") or []]
    return made == (plan.requested_M, plan.seed, plan.n_blocks) and params == [(s.name, list(s.shape))
                                                                                for s in plan.params]


def open_store(out: Path, *, layout: ParamLayout, per_example: bool, run_config: dict[str, Any],
               user_config: Mapping[str, Any] | None, dtype: str | None, compressor: str | None, resume: bool,
               overwrite: bool, rows_per_chunk: int | None = None, plan: Any = None,
               keep_plan: bool = False) -> GradientStore:
    """A recorder's store in the run directory ``out``: continued (``resume``; its sketch plan,
    layout, row kind and dtype checked, ``user_config`` merged), or created with ``run_config``
    (replacing one with ``overwrite``; ``rows_per_chunk``: the store's default when None);
    ``plan``: the `gradspec.sketch.SketchPlan` of sketched rows (``layout`` its columns).
    ``keep_plan``: a resumed store may hold any plan made with ``plan``'s settings (M, seed,
    blocks; its columns split by the energies of its first row): the caller then uses the
    store's plan (``layout`` is not compared)."""
    from gradspec.sketch import plan_attribute, same_plan

    path = out / STORE_NAME
    exists = path.exists()
    if resume:
        if not exists:
            raise FileNotFoundError(f"no store to resume in {str(out)!r} (no {STORE_NAME}); drop resume=True")
        store = GradientStore.open(path, mode="r+")
        if not (same_settings(store.sketch, plan) if keep_plan else same_plan(store.sketch, plan)):
            want = None if plan is None else plan.to_dict()
            raise ValueError(f"the store in {str(out)!r} holds {_sketch_text(store.sketch)}; this recorder would "
                             f"write {_sketch_text(want)}: resume with the store's sketch settings")
        if not keep_plan and store.layout.to_list() != layout.to_list():
            have = [(s.name, s.shape) for s in store.layout.params]
            want = [(s.name, s.shape) for s in layout.params]
            diff = next(((a, b) for a, b in zip(have, want, strict=False) if a != b), (len(have), len(want)))
            raise ValueError(
                f"the store in {str(out)!r} has another parameter layout (first difference: "
                f"{diff[0]} in the store, {diff[1]} here); resume with the same parameters"
            )
        if store.per_example != per_example:
            kind = "per-example" if store.per_example else "per-step"
            raise ValueError(f"the store in {str(out)!r} holds {kind} rows; resume with per_example={store.per_example}")
        if dtype is not None and dtype != store.dtype:
            raise ValueError(f"the store in {str(out)!r} is {store.dtype}; resume with dtype={store.dtype!r} or None")
        store.check_resumable(store.n_rows, "the store", "record anew with overwrite=True")
        if user_config:
            store.update_config(user={**store.config.get("user", {}), **user_config})
        store.set_status("writing")
        logger.info("resuming %s after %d committed rows", path, store.n_rows)
        return store
    refuse_existing(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    return GradientStore.create(
        path, layout=layout, config=run_config, dtype=dtype or "float32",
        per_example=per_example, compressor=compressor, overwrite=overwrite,
        sketch=None if plan is None else plan_attribute(plan),
        **({} if rows_per_chunk is None else {"rows_per_chunk": rows_per_chunk}),
    )
