"""Every task has disjoint train / public / eval splits, and overlapping ones are refused."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from gradspec.tasks import Task, TensorData, check_splits, make_task

BUNDLED = [  # (id, task options): small, offline
    pytest.param("lowrank", dict(n=40, n_eval=30, n_public=20, d=8, r=2), id="lowrank"),
    pytest.param("geomedian", dict(d=12, n_train=40, n_eval=30, n_public=20), id="geomedian"),
    pytest.param("cnn", dict(n_train=300, n_eval=100, n_public=50), id="cnn-digits"),
    pytest.param("text", dict(model="tiny-bert", n_train=40, n_eval=30, n_public=20), id="text"),
]


def _rows(data: TensorData, key: str) -> set[tuple]:
    return {tuple(r) for r in data.tensors[key].flatten(1).tolist()}


@pytest.mark.parametrize(("name", "options"), BUNDLED)
@pytest.mark.parametrize("seed", [0, 3])
def test_bundled_splits_are_disjoint_with_the_requested_sizes(name, options, seed):
    task = make_task(name, seed=seed, **options)
    n_train = options.get("n_train", options.get("n"))
    assert (len(task.train), len(task.eval), len(task.public)) == (
        n_train, options["n_eval"], options["n_public"])
    ids = [set(split.ids.tolist()) for split in (task.train, task.eval, task.public)]
    assert sum(map(len, ids)) == len(set().union(*ids))  # pairwise disjoint ids
    recorded = task.config["splits"]
    assert recorded["public_ids"] == task.public.ids.tolist()
    assert (recorded["n_train"], recorded["n_eval"], recorded["n_public"]) == (
        n_train, options["n_eval"], options["n_public"])
    if name in ("lowrank", "geomedian", "cnn"):  # continuous data: equal rows are the same example
        key = {"lowrank": "inputs", "geomedian": "points", "cnn": "images"}[name]
        public = _rows(task.public, key)
        assert not public & _rows(task.train, key) and not public & _rows(task.eval, key)


def test_no_public_split_when_asked_for_none():
    assert make_task("lowrank", n=10, n_eval=5, d=4, r=2, n_public=0).public is None
    assert make_task("geomedian", d=4, d_min=2, n_train=5, n_eval=5, n_public=0).public is None
    assert make_task("lowrank", n=10, n_eval=5, d=4, r=2, n_public=0).config["splits"]["n_public"] == 0


def test_public_examples_do_not_change_the_private_and_held_out_data():
    """Synthetic tasks draw public examples last (their own stream for text): the private
    and held-out data are those of a task without public examples."""
    for name, opts in (("lowrank", dict(n=30, n_eval=10, d=6, r=2)),
                       ("geomedian", dict(d=6, d_min=3, n_train=30, n_eval=10))):
        a, b = make_task(name, n_public=0, **opts), make_task(name, n_public=25, **opts)
        for split in ("train", "eval"):
            for key, value in getattr(a, split).tensors.items():
                assert torch.equal(value, getattr(b, split).tensors[key]), (name, split, key)


def test_cnn_public_is_carved_from_the_training_pool():
    """Zhou et al.: public examples come from the rest of the training set; the held-out
    split stays the same, the private pool shrinks by n_public."""
    without = make_task("cnn", n_eval=100, n_public=0, seed=0)
    with_public = make_task("cnn", n_eval=100, n_public=60, seed=0)
    assert torch.equal(without.eval.ids, with_public.eval.ids)
    pool = set(without.train.ids.tolist())
    assert set(with_public.public.ids.tolist()) <= pool
    assert set(with_public.train.ids.tolist()) | set(with_public.public.ids.tolist()) == pool
    assert len(with_public.train) == len(without.train) - 60


class _FakeDataset:
    """The part of ``datasets.Dataset`` the text task uses."""

    def __init__(self, columns: dict[str, list]) -> None:
        self.columns = columns
        self.column_names = list(columns)
        self.features: dict = {}

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def __getitem__(self, column: str) -> list:
        return self.columns[column]

    def select(self, rows) -> _FakeDataset:
        return _FakeDataset({k: [v[i] for i in rows] for k, v in self.columns.items()})


def test_hf_public_split_is_carved_from_the_training_split(monkeypatch):
    def split(n, offset):
        return _FakeDataset({"sentence": [f"review number {offset + i}" for i in range(n)],
                             "label": [i % 2 for i in range(n)]})

    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda path, name=None: {"train": split(50, 0), "validation": split(20, 1000)}
    monkeypatch.setitem(sys.modules, "datasets", fake)
    task = make_task("text", model="tiny-bert", dataset="sst2", n_train=30, n_public=10, seed=1)
    assert (len(task.train), len(task.public), len(task.eval)) == (30, 10, 20)
    train, public = set(task.train.ids.tolist()), set(task.public.ids.tolist())
    assert not train & public and train | public <= set(range(50))
    assert set(task.eval.ids.tolist()) == set(range(50, 70))  # held-out rows offset by len(train split)
    # n_train None: the whole training split but the public examples
    rest = make_task("text", model="tiny-bert", dataset="sst2", n_public=10, seed=1)
    assert len(rest.train) == 40
    with pytest.raises(ValueError, match="training split has 50 examples"):
        make_task("text", model="tiny-bert", dataset="sst2", n_train=45, n_public=10)


# ---------------------------------------------------------------------- refusal


def _data(x: torch.Tensor, ids=None) -> TensorData:
    return TensorData({"x": x, "labels": torch.zeros(len(x), dtype=torch.long)}, ids)


def _task(train, eval_, public=None) -> Task:
    return Task(name="mine", model=nn.Linear(3, 2), train=train, eval=eval_, public=public,
                forward=lambda call, batch: call(batch["x"]))


X = torch.randn(30, 3, generator=torch.Generator().manual_seed(0))


def test_public_taken_from_eval_is_refused_by_content():
    with pytest.raises(ValueError, match=r"public split shares 5 of 5 examples with its eval split \(by content\)"):
        _task(_data(X[:20]), _data(X[20:]), public=_data(X[20:25].clone()))


def test_public_overlapping_train_is_refused_by_id():
    ids = torch.arange(30)
    with pytest.raises(ValueError, match=r"public split shares 2 of 4 examples with its train split \(by id\)"):
        _task(_data(X[:20], ids[:20]), _data(X[20:26], ids[20:26]),
              public=_data(X[26:], torch.tensor([26, 27, 3, 4])))
    # ids decide when both splits have them: equal rows with other ids are distinct examples
    _task(_data(X[:20], ids[:20]), _data(X[20:26], ids[20:26]), public=_data(X[:4], ids[26:]))


def test_eval_equal_to_train_is_refused():
    data = _data(X)
    with pytest.raises(ValueError, match="eval split shares 30 of 30 examples with its train split"):
        _task(data, data)
    with pytest.raises(ValueError, match="by id"):
        _task(_data(X[:20], torch.arange(20)), _data(X[20:], torch.arange(15, 25)))


def test_a_public_split_set_later_is_refused_at_first_use():
    task = _task(_data(X[:20]), _data(X[20:]))
    task.public = task.eval  # bypasses the constructor's check
    with pytest.raises(ValueError, match="public split shares 10 of 10"):
        check_splits(task)


def test_disjoint_user_task_is_accepted_and_ids_are_validated():
    task = _task(_data(X[:20]), _data(X[20:25]), public=_data(X[25:]))
    assert len(task.public) == 5
    with pytest.raises(ValueError, match="distinct"):
        _data(X[:3], torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="3 example ids for 2 examples"):
        _data(X[:2], torch.arange(3))
    sub = _data(X[:6], torch.arange(10, 16)).subset([1, 4])
    assert sub.ids.tolist() == [11, 14] and torch.equal(sub.tensors["x"], X[[1, 4]])


def test_drawn_splits_number_the_examples_in_draw_order_and_refuse_wrong_counts():
    import torch

    from gradspec.tasks._base import drawn_splits

    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    train, held_out, public = drawn_splits({"inputs": x, "labels": y}, {"inputs": x[:3], "labels": y[:3]},
                                           n=6, n_eval=4)
    assert train.ids.tolist() == list(range(6)) and held_out.ids.tolist() == [6, 7, 8, 9]
    assert public.ids.tolist() == [10, 11, 12] and held_out.tensors["labels"].tolist() == [6, 7, 8, 9]
    assert drawn_splits({"inputs": x}, {"inputs": x[:0]}, n=6, n_eval=4)[2] is None
    with pytest.raises(ValueError, match="n \\+ n_eval = 9"):
        drawn_splits({"inputs": x}, {}, n=6, n_eval=3)  # one held-out example too many, not dropped
    with pytest.raises(ValueError, match="differ in length"):
        drawn_splits({"inputs": x}, {"inputs": x[:3], "labels": y[:2]}, n=6, n_eval=4)
