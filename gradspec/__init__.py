"""gradspec: spectral analysis of gradient subspaces in (differentially private) training.

The flat public surface. Names are imported lazily (PEP 562), so that
``import gradspec`` — and the CLI's ``--help`` — does not load torch, zarr or
transformers until a name that needs them is used.

Example:
    >>> import gradspec
    >>> gradspec.compute_epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=1000, delta=1e-5) < 2
    True
"""

from __future__ import annotations

import sys
import types
from typing import Any

from gradspec._lazy import lazy_names

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {
    # choices shared by the library and the CLI
    "gradspec._enums": (
        "Accounting", "CollectMode", "GradDtype", "PcaMethod", "PerExampleBackend", "Sampling",
        "parse_choice",
    ),
    # stores on disk
    "gradspec.store": (
        "BackgroundWriter", "GradientStore", "ParamLayout", "ParamSpec", "SpectrumStore",
        "StoreDamagedError", "open_store",
    ),
    # sketched per-example rows: the plan, its seeded factors, the dense reference
    "gradspec.sketch": ("SketchPlan", "make_plan", "sketch_rows"),
    # tasks
    "gradspec.tasks": (
        "Task", "TensorData", "available_tasks", "make_task", "register_task", "task_options",
    ),
    # training (the DP-SGD trainer and the hooks that change its step)
    "gradspec.train": (
        "CollectConfig", "CollectResult", "GhostClipping", "PerExampleGradients", "StepHooks", "TrainConfig",
        "TrainResult",
        "evaluate", "layout_for", "select_parameters",
        # a per-step sketched run replayed: its directions in parameter space (issue 37 §4)
        "ReplayMismatch", "ReplayResult", "replay",
        # Hugging Face attention masks that keep the model's own masking under vmap
        "attention_is_causal", "attention_mask_4d",
    ),
    # collecting gradients: gradspec's trainer with a store, or any training loop
    # (plain PyTorch, Opacus, Hugging Face Trainer)
    "gradspec.collect": (
        "GradientRecorder", "GradientRecorderCallback", "OpacusRecording", "collect", "record_opacus",
    ),
    # privacy
    "gradspec.privacy": (
        "PrivacyAccountant", "calibrate_noise_multiplier", "clip_per_example", "compute_epsilon",
        "default_delta", "gaussian_noise",
    ),
    # the spectral engine
    "gradspec.linalg": (
        "GradientOperator", "PcaResult", "gram_pca", "krylov_pca", "lanczos_pca",
        "orthogonal_pca", "pca",
    ),
    # spectrum analysis
    "gradspec.spectrum": (
        "decay_analysis", "explained_variance", "fit_power_law", "fit_spectrum",
        "restricted_lipschitz", "restricted_lipschitz_bound", "spectral_density",
    ),
    "gradspec.plot": ("overlay_figures", "report_figures"),
    # private optimizers and retraining
    "gradspec.optim": (
        "AdaDPS", "ComplementRetrain", "DPAdam", "FixedProjector", "NoisyAdaGrad", "PDPSGD",
        "PublicProjector", "RandomProjector", "SubspaceRetrain", "make_algorithm", "make_projector",
        "retrain", "sweep",
    ),
    # the HTML page of a run folder (`gradspec report`)
    "gradspec.report": ("read_run", "render_report", "write_report"),
}

_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE) + ["__version__"]


__getattr__, __dir__ = lazy_names("gradspec", globals(), _WHERE)


#: Flat names that are also the names of subpackages: the flat name is the function.
_SHADOWED = frozenset({"collect"})


class _FlatApi(types.ModuleType):
    """``gradspec`` itself, so that ``gradspec.collect`` is always the function.

    Importing a subpackage binds it as an attribute of its parent package. For
    ``gradspec.collect`` that binding would replace the flat API's function ``collect``
    with the subpackage, or not, depending on what was imported first. Here the binding
    is the subpackage's function of the same name instead; the subpackage stays in
    ``sys.modules``, so ``from gradspec.collect import GradientRecorder`` works as ever
    (``import gradspec.collect as m``, which reads the attribute, gives the function).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _FlatApi
