"""Bundled tasks (model + data + loss) and the registry that builds them by name.

Registered names (:func:`available_tasks`):

- ``"text"``: fine-tune the attention query/value weights of a transformer for
  sentiment classification (Li et al. 2022, §4.2); offline MiniLM and synthetic data
  by default (:mod:`gradspec.tasks.text`).
- ``"cnn"``: the Papernot et al. CNN used by PDP-SGD (Zhou et al. 2021, Appendix D) on
  scikit-learn digits, MNIST or Fashion-MNIST (:mod:`gradspec.tasks.cnn`).
- ``"geomedian"``: the generalised geometric median (Li et al. 2022, §4.1)
  (:mod:`gradspec.tasks.geomedian`).
- ``"lowrank"``: linear/logistic regression on exactly rank-r data
  (:mod:`gradspec.tasks.lowrank`).
- ``"ballglm"``: ball-constrained logistic regression on unit-norm rank-r data, the
  constrained setting of Kairouz et al. 2021 (:mod:`gradspec.tasks.ballglm`).
- ``"sparselinear"``: sparse linear regression with frequent/uninformative and
  rare/informative features, AdaDPS's Figure 3 (:mod:`gradspec.tasks.sparse`).
- ``"bow"``: synthetic bag-of-words sentiment with Zipf word frequencies, logistic
  regression (:mod:`gradspec.tasks.bow`).

Example:
    >>> from gradspec.tasks import make_task
    >>> task = make_task("geomedian", d=20, spectrum="linear", n_train=8, n_eval=8, seed=0)
    >>> task.loss(task.forward(task.model, task.train.batch(slice(0, 4))), {}).shape
    torch.Size([4])
    >>> len(task.public)  # public examples, disjoint from train and eval
    100
"""

from gradspec.tasks import ballglm, bow, cnn, geomedian, lowrank, sparse, text
from gradspec.tasks._base import (
    Batch,
    Task,
    TensorData,
    accuracy,
    check_splits,
    cross_entropy_loss,
    split_summary,
)
from gradspec.tasks._registry import available_tasks, make_task, register_task, task_options
from gradspec.tasks.ballglm import BallOptimum, ball_basis, ball_optimum, logistic_risk
from gradspec.tasks.bow import bow_polarity
from gradspec.tasks.geomedian import (
    A_DIAGONALS,
    a_const,
    a_linear,
    a_sqrt,
    restricted_lipschitz_closed_form,
    restricted_lipschitz_coefficients,
)
from gradspec.tasks.lowrank import row_space_basis
from gradspec.tasks.sparse import sparse_side_information
from gradspec.tasks.text import HEAD_PATTERNS, QV_PATTERNS, tiny_bert

__all__ = [
    # data model
    "Batch",
    "Task",
    "TensorData",
    "accuracy",
    "check_splits",
    "cross_entropy_loss",
    "split_summary",
    # registry
    "available_tasks",
    "make_task",
    "register_task",
    "task_options",
    # text
    "HEAD_PATTERNS",
    "QV_PATTERNS",
    "tiny_bert",
    # geometric median
    "A_DIAGONALS",
    "a_const",
    "a_linear",
    "a_sqrt",
    "restricted_lipschitz_closed_form",
    "restricted_lipschitz_coefficients",
    # low rank
    "row_space_basis",
    # ball-constrained GLM
    "BallOptimum",
    "ball_basis",
    "ball_optimum",
    "logistic_risk",
    # AdaDPS tasks
    "bow_polarity",
    "sparse_side_information",
    # modules
    "ballglm",
    "bow",
    "cnn",
    "geomedian",
    "lowrank",
    "sparse",
    "text",
]
