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
  upsampled bilinearly to 28 x 28 and scaled to [0, 1]; a seeded permutation holds out
  ``n_eval`` of them, the rest is the training pool.
- ``"mnist"``, ``"fashion-mnist"``: via torchvision (``pip install torchvision``); the
  60,000 training images are the training pool, the test images the held-out split.

As in Zhou et al. (2021, §5 and Appendix D: 10,000 private examples, 100 public ones
"from the rest", the 10,000 test images for evaluation), ``n_public`` public examples
and ``n_train`` private ones are drawn, disjoint, from the training pool by a seeded
permutation. Images are standardised with the mean and standard deviation of the public
split (non-sensitive; the private split's statistics would be released without noise),
or of the private split when ``n_public=0``. Example ids are indices into the dataset:
digits 0..1796; MNIST training images 0..59999, test images 60000 + i.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch import Tensor, nn

from gradspec.tasks._base import Batch, Task, TensorData, carve, permutation
from gradspec.tasks._registry import register_task

logger = logging.getLogger(__name__)

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


#: scikit-learn's 8×8 digits as every release since 2011 ships them: 1,797 images of 64 pixels
#: (integers 0..16) and their labels, SHA-256 of the pixels then the labels as uint8. A copy cut
#: short or edited (found by review: 1,000 rows re-zipped trained, exit 0, with q and δ of
#: another n) is refused before training.
DIGITS_SHA256 = "87ff0c9e40dc7e2c0e34e7257799c2e3f3aec1a016363bb11cad869ec428a826"
DIGITS_SHAPE = (1797, 64)


def _digits() -> tuple[Tensor, Tensor]:
    import hashlib

    import numpy as np
    from sklearn.datasets import load_digits

    where = "scikit-learn's digits.csv.gz (sklearn/datasets/data)"
    try:
        digits = load_digits()
    except Exception as exc:  # noqa: BLE001 - a damaged gzip raises anything (EOFError: "Aborted!")
        raise ValueError(f"{where} cannot be read ({type(exc).__name__}): reinstall scikit-learn") from None
    data, target = np.asarray(digits.data), np.asarray(digits.target)
    ok = data.shape == DIGITS_SHAPE and target.shape == DIGITS_SHAPE[:1] and np.array_equal(data, np.round(data))
    digest = hashlib.sha256(data.astype(np.uint8).tobytes() + target.astype(np.uint8).tobytes()).hexdigest() if ok else ""
    if digest != DIGITS_SHA256:
        raise ValueError(f"{where} is not the data set it should be ({data.shape[0]} rows of {DIGITS_SHAPE[0]}, or "
                         "other values): it is damaged; reinstall scikit-learn")
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = nn.functional.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    return images, torch.as_tensor(digits.target, dtype=torch.long)


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


@register_task("cnn")
def cnn_task(
    *,
    seed: int = 0,
    dataset: str = "digits",
    activation: str = "tanh",
    n_train: int | None = None,
    n_eval: int | None = None,
    n_public: int = 100,
    root: str | None = None,
    download: bool = True,
) -> Task:
    """Image classification with :class:`PapernotCNN` (Zhou et al. 2021, Appendix D).

    Args:
        seed: initialises the network and draws the splits/subsets.
        dataset: ``"digits"`` (offline), ``"mnist"`` or ``"fashion-mnist"`` (torchvision).
        activation: ``"tanh"`` (Papernot et al. 2020) or ``"relu"``.
        n_train: private training examples; ``None`` keeps the whole pool but the public
            split (digits: 1,797 - n_eval - n_public; MNIST: 60,000 - n_public; Zhou et
            al. use 10,000).
        n_eval: held-out size; ``None`` means 360 for digits (about 20%) and the full
            10,000-image test set for MNIST/Fashion-MNIST.
        n_public: public examples carved from the training pool, disjoint from the
            private ones (Zhou et al.: 100); 0 for none.
        root: torchvision download folder (default ``~/.cache/gradspec/data``).
        download: let torchvision download missing files.

    Returns:
        A task with data ``{"images": (n, 1, 28, 28), "labels": (n,)}``, cross-entropy
        loss and all parameters trained (``params=("*",)``).

    Raises:
        ValueError: for an unknown dataset/activation, sizes the data cannot supply, or
            MNIST without torchvision.
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(DATASETS)}")
    if dataset == "digits":
        images, labels = _digits()
        n_eval = 360 if n_eval is None else n_eval
        if not 1 <= n_eval < len(labels):
            raise ValueError(f"n_eval must be in [1, {len(labels) - 1}] for digits, got {n_eval}")
        order = permutation(len(labels), seed)
        held, pool = order[:n_eval].sort().values, order[n_eval:].sort().values
        x_pool, y_pool, x_ev, y_ev, ev_ids = images, labels, images[held], labels[held], held
    else:
        x_pool, y_pool, x_test, y_test = _torchvision(dataset, root, download)
        pool = torch.arange(len(y_pool))
        held = torch.arange(len(y_test))
        if n_eval is not None:
            if not 1 <= n_eval <= len(held):
                raise ValueError(f"n_eval must be in [1, {len(held)}] for {dataset}, got {n_eval}")
            held = permutation(len(held), seed + 1)[:n_eval].sort().values
        x_ev, y_ev, ev_ids = x_test[held], y_test[held], len(y_pool) + held
    private, public = carve(pool, n_train=n_train, n_public=n_public, seed=seed)
    x_tr, y_tr, x_pub, y_pub = x_pool[private], y_pool[private], x_pool[public], y_pool[public]
    if n_public:
        mean, std, source = x_pub.mean(), x_pub.std(), "public"
    else:
        logger.warning("cnn task without public data: images are standardised with the private "
                       "split's mean and std, released without noise")
        mean, std, source = x_tr.mean(), x_tr.std(), "train"
    x_tr, x_ev, x_pub = (x_tr - mean) / std, (x_ev - mean) / std, (x_pub - mean) / std
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PapernotCNN(activation=activation)
    return Task(
        name="cnn",
        model=model,
        train=TensorData({"images": x_tr, "labels": y_tr}, private),
        eval=TensorData({"images": x_ev, "labels": y_ev}, ev_ids),
        public=TensorData({"images": x_pub, "labels": y_pub}, public) if n_public else None,
        forward=_images_forward,
        params=("*",),
        config={"normalize_mean": mean.item(), "normalize_std": std.item(),
                "normalize_from": source,
                "ids": "digits: index in load_digits(); mnist: training image i, test image 60000 + i"},
    )
