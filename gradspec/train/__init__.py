"""The DP-SGD trainer: the loop, sampling, the per-example engine, checkpoint/resume and
the hooks through which the private optimizers of ``gradspec.optim`` change a step.

Recording gradients into a store is ``gradspec.collect``'s; this package trains.
"""

from gradspec._attention import additive_attention_mask, attention_is_causal, attention_mask_4d
from gradspec.train._checkpoint import CHECKPOINT_NAME, is_run_dir, read_run_config, read_run_info
from gradspec.train._config import (
    BOOKKEEPING,
    RESUMABLE,
    CollectConfig,
    TrainConfig,
    merge_resume,
    resume_conflicts,
)
from gradspec.train._context import StepContext
from gradspec.train._distributed import RankLostError, Ranks, current_ranks, process_group
from gradspec.train._engine import layout_for, select_parameters
from gradspec.train._ghost import GhostClipping, GhostResult
from gradspec.train._hooks import StepHooks
from gradspec.train._loop import (
    CollectResult,
    TrainResult,
    evaluate,
    package_versions,
    resolve_device,
    train,
)
from gradspec.train._norm_shares import NormShares, clipped_norm_shares, norm_shares
from gradspec.train._per_example import PerExampleGradients
from gradspec.train._replay import ReplayMismatch, ReplayResult, replay
from gradspec.train._sampling import PoissonSampler, ShuffleSampler
from gradspec.train._sink import RowSink, RowSinkFactory

__all__ = [
    # running
    "train",
    "evaluate",
    "TrainConfig",
    "TrainResult",
    "CollectConfig",
    "CollectResult",
    "BOOKKEEPING",
    "RESUMABLE",
    "merge_resume",
    "resume_conflicts",
    "is_run_dir",
    "CHECKPOINT_NAME",
    "read_run_config",
    "read_run_info",
    "resolve_device",
    "package_versions",
    # a per-step sketched run replayed: its directions in parameter space (issue 37 §4)
    "replay",
    "ReplayResult",
    "ReplayMismatch",
    # under torch.distributed (torchrun): which process this is, the process group
    "Ranks",
    "RankLostError",
    "current_ranks",
    "process_group",
    # where the rows go (gradspec.collect's GradientRecorder is one)
    "RowSink",
    "RowSinkFactory",
    # changing a step
    "StepHooks",
    "StepContext",
    # where the clipped norm goes (each parameter group's share; a new run logs it)
    "NormShares",
    "norm_shares",
    "clipped_norm_shares",
    # the parts of a step
    "PerExampleGradients",
    "GhostClipping",
    "GhostResult",
    "layout_for",
    "select_parameters",
    "PoissonSampler",
    "ShuffleSampler",
    # Hugging Face attention masks that keep the model's own masking under vmap
    "additive_attention_mask",
    "attention_is_causal",
    "attention_mask_4d",
]
