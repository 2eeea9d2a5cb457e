"""Training that streams clipped (per-example) gradients into a gradient store."""

from gradspec.collect._checkpoint import is_run_dir, read_run_config
from gradspec.collect._config import RESUMABLE, CollectConfig, merge_resume, resume_conflicts
from gradspec.collect._loop import CollectResult, collect, evaluate
from gradspec.collect._per_example import PerExampleGradients, layout_for, select_parameters
from gradspec.collect._sampling import PoissonSampler, ShuffleSampler

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
