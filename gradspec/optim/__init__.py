"""Private optimizers that act on gradient subspaces, as hooks of the DP-SGD step.

Each optimizer is a :class:`~gradspec.train.StepHooks` subclass run by
:func:`gradspec.train.train` (one trainer, one accountant):

* DP-SGD (the identity hooks) and DP-Adam (:class:`DPAdam`);
* retraining in a fixed subspace (:class:`SubspaceRetrain`, Li et al. 2022 §4.2), and in
  its orthogonal complement (:class:`ComplementRetrain`, the control of Song, Ahn & Yun 2025);
* PDP-SGD / RPDP-SGD (:class:`PDPSGD`, Zhou et al. 2021, Alg. 1);
* noisy AdaGrad with a gradient-subspace oracle (:class:`NoisyAdaGrad`, Kairouz et al. 2021);
* AdaDPS (:class:`AdaDPS`, Li et al. 2022, Alg. 1);
* any of them constrained to an l2 ball (:class:`BallConstraint`, projected steps).

Projectors (:class:`FixedProjector`, :class:`PublicProjector`, :class:`RandomProjector`)
never form a p x p matrix. :func:`retrain` and :func:`sweep` run experiments.
"""

from gradspec.optim._adadps import (
    AdaDPS,
    AdaDPSRule,
    frequency_side_information,
    load_side_information,
)
from gradspec.optim._adagrad import NoisyAdaGrad, goe
from gradspec.optim._averaged import AveragedSGDResult, dp_sgd_averaged
from gradspec.optim._base import OptimHooks
from gradspec.optim._constraint import BallConstraint, project_ball
from gradspec.optim._dpadam import DPAdam
from gradspec.optim._orthonormal import LARGE_BASIS, orthonormalize_
from gradspec.optim._pdp import PDPSGD, pdp_sgd, rpdp_sgd
from gradspec.optim._projectors import FixedProjector, Projector, RandomProjector
from gradspec.optim._public import (
    PublicProjector,
    public_ids,
    public_split,
    top_eigenvectors_from_rows,
)
from gradspec.optim._registry import (
    PROJECTED,
    Algorithm,
    ProjectorKind,
    algorithm_options,
    make_algorithm,
    make_projector,
    spectrum_basis,
    spectrum_layout,
)
from gradspec.optim._result import RetrainResult, read_result
from gradspec.optim._retrain import retrain, sweep
from gradspec.optim._subspace import ComplementRetrain, NoiseSpace, SubspaceRetrain

__all__ = [
    # optimizers
    "AdaDPS",
    "AdaDPSRule",
    "AveragedSGDResult",
    "BallConstraint",
    "ComplementRetrain",
    "dp_sgd_averaged",
    "DPAdam",
    "NoiseSpace",
    "NoisyAdaGrad",
    "OptimHooks",
    "PDPSGD",
    "SubspaceRetrain",
    "goe",
    "project_ball",
    "pdp_sgd",
    "rpdp_sgd",
    # AdaDPS side information
    "frequency_side_information",
    "load_side_information",
    # projectors
    "FixedProjector",
    "LARGE_BASIS",
    "Projector",
    "PublicProjector",
    "RandomProjector",
    "public_ids",
    "public_split",
    "top_eigenvectors_from_rows",
    # registry
    "PROJECTED",
    "Algorithm",
    "ProjectorKind",
    "algorithm_options",
    "make_algorithm",
    "make_projector",
    "orthonormalize_",
    "spectrum_basis",
    "spectrum_layout",
    # experiments
    "RetrainResult",
    "read_result",
    "retrain",
    "sweep",
]
