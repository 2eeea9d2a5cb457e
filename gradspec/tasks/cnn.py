"""The small CNN of PDP-SGD (Zhou et al. 2021, Appendix D, Table 1), after Papernot et al. (2020).

Architecture, for 1 x 28 x 28 inputs (Table 1; layer sizes as in the TensorFlow Privacy
and Opacus MNIST examples of Papernot et al.)::

    Conv2d(1, 16, 8, stride=2, padding=3) -> act -> MaxPool2d(2, stride=1)   # 16 x 13 x 13
    Conv2d(16, 32, 4, stride=2)           -> act -> MaxPool2d(2, stride=1)   # 32 x 4 x 4
    Linear(512, 32) -> act -> Linear(32, 10)

``act`` is tanh by default, the tempered sigmoid Papernot et al. (2020) recommend for
DP-SGD; ``activation="relu"`` gives the original (non-private) variant. 26,010 parameters.

Data:

- ``"digits"`` (default, offline): scikit-learn's 1,797 handwritten 8 x 8 digits,
  upsampled bilinearly to 28 x 28, scaled to [0, 1] and standardised with the training
  split's mean and standard deviation; split into train/eval by a seeded permutation.
- ``"mnist"``, ``"fashion-mnist"``: via torchvision (``pip install torchvision``),
  standardised the same way. Zhou et al. train on a random 10,000-example subset
  (``n_train=10000``) and evaluate on the 10,000 test images.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import Tensor, nn

from gradspec.tasks._base import Batch, Task, TensorData
from gradspec.tasks._registry import register_task

__all__ = ["DATASETS", "PapernotCNN", "cnn_task"]

DATASETS = ("digits", "mnist", "fashion-mnist")
_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


class PapernotCNN(nn.Module):
    """The two-convolution CNN of Papernot et al. (2020) used by Zhou et al. (2021)."""

    def __init__(self, *, activation: str = "tanh", num_classes: int = 10) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; choose one of {list(_ACTIVATIONS)}"
            )
        act = _ACTIVATIONS[activation]
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 8, stride=2, padding=3),
            act(),
            nn.MaxPool2d(2, stride=1),
            nn.Conv2d(16, 32, 4, stride=2),
            act(),
            nn.MaxPool2d(2, stride=1),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 32), act(), nn.Linear(32, num_classes)
        )

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(self.features(images))


def _images_forward(call: Callable[..., Tensor], batch: Batch) -> Tensor:
    return call(batch["images"])


def _digits(seed: int, n_eval: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = nn.functional.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    if not 1 <= n_eval < len(labels):
        raise ValueError(f"n_eval must be in [1, {len(labels) - 1}] for digits, got {n_eval}")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    held, kept = order[:n_eval], order[n_eval:]
    return images[kept], labels[kept], images[held], labels[held]


def _torchvision(name: str, root: str | None, download: bool) -> tuple[Tensor, ...]:
    try:
        import torchvision.datasets as tvd
    except ImportError:
        raise ValueError(
            f"dataset {name!r} needs torchvision; `pip install torchvision` "
            "(or use the offline dataset='digits')"
        ) from None
    cls = {"mnist": tvd.MNIST, "fashion-mnist": tvd.FashionMNIST}[name]
    root = os.path.expanduser(root or os.path.join("~", ".cache", "gradspec", "data"))
    out: list[Tensor] = []
    for train in (True, False):
        ds = cls(root=root, train=train, download=download)
        out += [ds.data.unsqueeze(1).float() / 255.0, torch.as_tensor(ds.targets, dtype=torch.long)]
    return tuple(out)


def _subsample(images: Tensor, labels: Tensor, n: int | None, seed: int) -> tuple[Tensor, Tensor]:
    if n is None or n >= len(labels):
        return images, labels
    if n < 1:
        raise ValueError(f"subset sizes must be positive, got {n}")
    keep = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))[:n]
    return images[keep], labels[keep]


@register_task("cnn")
def cnn_task(
    *,
    seed: int = 0,
    dataset: str = "digits",
    activation: str = "tanh",
    n_train: int | None = None,
    n_eval: int | None = None,
    root: str | None = None,
    download: bool = True,
) -> Task:
    """Image classification with :class:`PapernotCNN` (Zhou et al. 2021, Appendix D).

    Args:
        seed: initialises the network and draws the splits/subsets.
        dataset: ``"digits"`` (offline), ``"mnist"`` or ``"fashion-mnist"`` (torchvision).
        activation: ``"tanh"`` (Papernot et al. 2020) or ``"relu"``.
        n_train: training subset size; ``None`` keeps all (digits: 1,797 - n_eval;
            MNIST: 60,000; Zhou et al. use 10,000).
        n_eval: held-out size; ``None`` means 360 for digits (about 20%) and the full
            10,000-image test set for MNIST/Fashion-MNIST.
        root: torchvision download folder (default ``~/.cache/gradspec/data``).
        download: let torchvision download missing files.

    Returns:
        A task with data ``{"images": (n, 1, 28, 28), "labels": (n,)}``, cross-entropy
        loss and all parameters trained (``params=("*",)``).

    Raises:
        ValueError: for an unknown dataset/activation, or MNIST without torchvision.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(DATASETS)}")
    if dataset == "digits":
        x_tr, y_tr, x_ev, y_ev = _digits(seed, 360 if n_eval is None else n_eval)
    else:
        x_tr, y_tr, x_ev, y_ev = _torchvision(dataset, root, download)
        x_ev, y_ev = _subsample(x_ev, y_ev, n_eval, seed + 1)
    x_tr, y_tr = _subsample(x_tr, y_tr, n_train, seed)
    mean, std = x_tr.mean(), x_tr.std()
    x_tr, x_ev = (x_tr - mean) / std, (x_ev - mean) / std
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PapernotCNN(activation=activation)
    return Task(
        name="cnn",
        model=model,
        train=TensorData({"images": x_tr, "labels": y_tr}),
        eval=TensorData({"images": x_ev, "labels": y_ev}),
        forward=_images_forward,
        params=("*",),
        config={"normalize_mean": mean.item(), "normalize_std": std.item()},
    )
