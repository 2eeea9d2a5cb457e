"""Differential privacy for DP-SGD: accounting, calibration, clipping and noise.

Accounting uses Google's dp-accounting as the engine (PLD, RDP with the
improved conversion, and RDP with the classical conversion); see
`gradspec.privacy._compose` for what each method computes and why shuffled
batches are accounted without amplification.

Names are imported lazily (PEP 562), as in ``gradspec`` itself: clipping and noise need
torch, PLD accounting scipy and dp-accounting, and a caller that only reads a run's
sampling rate (``gradspec info``) should not wait ~2 s for them.
"""

from __future__ import annotations

from gradspec._lazy import lazy_names

_EXPORTS: dict[str, tuple[str, ...]] = {
    # accounting
    "gradspec.privacy._accountant": ("PrivacyAccountant",),
    "gradspec.privacy._calibrate": ("calibrate_noise_multiplier", "compute_epsilon"),
    "gradspec.privacy._compose": ("RDP_ORDERS", "SHUFFLED_SENSITIVITY"),
    "gradspec.privacy._epochs": (
        "accountant_rate", "accounted_sample_rate", "batches_per_epoch", "epochs_for_steps", "rate_text",
        "steps_for_epochs", "steps_per_epoch",
    ),
    "gradspec.privacy._uniform": ("calibrate_uniform_sampling", "uniform_sampling_epsilon"),
    "gradspec.privacy._validate": ("default_delta",),
    # clipping and noise
    "gradspec.privacy._clip": (
        "OPACUS_CLIP_EPS", "ClipResult", "bound_rows_", "clip_factors", "clip_per_example", "clip_rows",
        "norm_stats", "per_parameter_norms",
    ),
    "gradspec.privacy._noise": ("gaussian_noise",),
}

_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_names("gradspec.privacy", globals(), _WHERE)
