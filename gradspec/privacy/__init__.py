"""Differential privacy for DP-SGD: accounting, calibration, clipping and noise.

Accounting uses Google's dp-accounting as the engine (PLD, RDP with the
improved conversion, and RDP with the classical conversion); see
`gradspec.privacy._compose` for what each method computes and why shuffled
batches are accounted without amplification.
"""

from gradspec.privacy._accountant import PrivacyAccountant
from gradspec.privacy._calibrate import calibrate_noise_multiplier, compute_epsilon
from gradspec.privacy._clip import (
    OPACUS_CLIP_EPS,
    ClipResult,
    bound_rows_,
    clip_factors,
    clip_per_example,
    clip_rows,
    norm_stats,
    per_parameter_norms,
)
from gradspec.privacy._compose import RDP_ORDERS
from gradspec.privacy._epochs import (
    accountant_rate,
    accounted_sample_rate,
    batches_per_epoch,
    epochs_for_steps,
    rate_text,
    steps_for_epochs,
    steps_per_epoch,
)
from gradspec.privacy._noise import gaussian_noise
from gradspec.privacy._uniform import calibrate_uniform_sampling, uniform_sampling_epsilon
from gradspec.privacy._validate import default_delta

__all__ = [
    # accounting
    "PrivacyAccountant",
    "compute_epsilon",
    "calibrate_noise_multiplier",
    "uniform_sampling_epsilon",
    "calibrate_uniform_sampling",
    "default_delta",
    "steps_per_epoch",
    "batches_per_epoch",
    "steps_for_epochs",
    "epochs_for_steps",
    "accounted_sample_rate",
    "accountant_rate",
    "rate_text",
    "RDP_ORDERS",
    # clipping and noise
    "ClipResult",
    "clip_per_example",
    "clip_rows",
    "bound_rows_",
    "clip_factors",
    "OPACUS_CLIP_EPS",
    "norm_stats",
    "per_parameter_norms",
    "gaussian_noise",
]
