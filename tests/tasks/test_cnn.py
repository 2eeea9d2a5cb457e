import importlib.util

import pytest
import torch
from torch import nn

from gradspec.tasks import make_task
from gradspec.tasks.cnn import PapernotCNN


@pytest.fixture(scope="module")
def digits():
    return make_task("cnn", n_eval=100, seed=0)


def test_architecture_matches_the_paper():
    model = PapernotCNN()
    # Zhou et al. Table 1 / Papernot et al.: conv 16@8x8 s2, pool 2x2 s1, conv 32@4x4 s2,
    # pool 2x2 s1, fc 32, fc 10, on 1x28x28: 16x13x13 -> 32x4x4 = 512 features.
    by_hand = (1 * 16 * 8 * 8 + 16) + (16 * 32 * 4 * 4 + 32) + (512 * 32 + 32) + (32 * 10 + 10)
    assert by_hand == 26_010
    assert sum(p.numel() for p in model.parameters()) == by_hand
    assert model.features(torch.zeros(2, 1, 28, 28)).shape == (2, 32, 4, 4)
    assert model(torch.zeros(5, 1, 28, 28)).shape == (5, 10)
    assert sum(isinstance(m, nn.Tanh) for m in model.modules()) == 3
    assert sum(isinstance(m, nn.ReLU) for m in PapernotCNN(activation="relu").modules()) == 3
    with pytest.raises(ValueError, match="choose one of"):
        PapernotCNN(activation="gelu")


def test_digits_data(digits):
    images, labels = digits.train.tensors["images"], digits.train.tensors["labels"]
    # 100 held out, 100 public carved from the rest (Zhou et al.), the remainder private
    assert images.shape == (1797 - 100 - 100, 1, 28, 28) and len(digits.eval) == 100
    assert len(digits.public) == 100
    # standardised with the public split's statistics, not the private split's
    public = digits.public.tensors["images"]
    assert abs(public.mean().item()) < 1e-4 and abs(public.std().item() - 1) < 1e-4
    assert digits.config["normalize_from"] == "public"
    assert abs(images.mean().item()) < 0.1 and abs(images.std().item() - 1) < 0.1
    assert set(labels.tolist()) == set(range(10))
    assert digits.params == ("*",)
    assert digits.forward(digits.model, digits.train.batch(range(4))).shape == (4, 10)


def test_seed_fixes_split_and_init(digits):
    same = make_task("cnn", n_eval=100, seed=0)
    other = make_task("cnn", n_eval=100, seed=1)
    assert torch.equal(same.eval.tensors["images"], digits.eval.tensors["images"])
    assert torch.equal(same.model.features[0].weight, digits.model.features[0].weight)
    assert not torch.equal(other.eval.tensors["labels"], digits.eval.tensors["labels"])
    assert not torch.equal(other.model.features[0].weight, digits.model.features[0].weight)
    small = make_task("cnn", n_train=50, n_eval=20, n_public=10, seed=0)
    assert (len(small.train), len(small.eval), len(small.public)) == (50, 20, 10)


def test_bad_options():
    with pytest.raises(ValueError, match="unknown dataset 'cifar'"):
        make_task("cnn", dataset="cifar")
    with pytest.raises(ValueError, match="n_eval"):
        make_task("cnn", n_eval=5000)
    # a private set larger than the pool is refused, not silently cut to the pool
    with pytest.raises(ValueError, match="fewer than n_train \\+ n_public"):
        make_task("cnn", n_eval=360, n_train=1400)


@pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is not None, reason="torchvision installed"
)
def test_mnist_needs_torchvision():
    with pytest.raises(ValueError, match="pip install torchvision"):
        make_task("cnn", dataset="mnist")
