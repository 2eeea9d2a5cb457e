"""Recording clipped (per-example) gradients into a gradient store.

* :func:`collect` trains with gradspec's DP-SGD trainer (:mod:`gradspec.train`) and
  records its rows;
* :class:`GradientRecorder` records from any training loop (plain PyTorch), with
  adapters for an Opacus ``DPOptimizer`` (:func:`record_opacus`) and a Hugging Face
  ``Trainer`` (:class:`GradientRecorderCallback`).

The trainer's public names that lived here before it moved to ``gradspec.train``
(``CollectConfig``, ``CollectResult``, the per-example engine, the samplers, the resume
helpers) are still importable from here.

``gradspec.collect``, as an attribute of the flat API (``from gradspec import collect``),
is always the function; import this package's names with ``from gradspec.collect import ...``.
"""

from gradspec.collect._collect import collect
from gradspec.train import (
    RESUMABLE,
    CollectConfig,
    CollectResult,
    PerExampleGradients,
    PoissonSampler,
    ShuffleSampler,
    evaluate,
    is_run_dir,
    layout_for,
    merge_resume,
    read_run_config,
    resume_conflicts,
    select_parameters,
)

__all__ = [
    "RESUMABLE",
    "CollectConfig",
    "CollectResult",
    "PerExampleGradients",
    "PoissonSampler",
    "ShuffleSampler",
    "collect",
    "evaluate",
    "is_run_dir",
    "layout_for",
    "merge_resume",
    "read_run_config",
    "resume_conflicts",
    "select_parameters",
]

# Recording from any training loop (plain PyTorch, Opacus, Hugging Face Trainer).
from gradspec.collect._opacus import OpacusRecording, record_opacus  # noqa: E402
from gradspec.collect._recorder import GradientRecorder  # noqa: E402

__all__ += ["GradientRecorder", "GradientRecorderCallback", "OpacusRecording", "record_opacus"]


def __getattr__(name: str):
    # The Hugging Face callback subclasses transformers' TrainerCallback: imported on first use.
    if name == "GradientRecorderCallback":
        from gradspec.collect._hf import GradientRecorderCallback

        return GradientRecorderCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
