import inspect
import json

import pytest

from gradspec.tasks import _registry, available_tasks, make_task, register_task, task_options
from gradspec.tasks._base import Task


def test_bundled_tasks_are_registered():
    assert set(available_tasks()) >= {"text", "cnn", "geomedian", "lowrank"}
    assert list(available_tasks()) == sorted(available_tasks())


def test_unknown_task_names_the_choices():
    with pytest.raises(ValueError, match="unknown task 'nope'") as err:
        make_task("nope")
    for name in ("text", "cnn", "geomedian", "lowrank"):
        assert name in str(err.value)


def test_unknown_option_names_the_valid_options():
    with pytest.raises(ValueError, match="unknown option") as err:
        make_task("lowrank", rank=3)
    for option in ("seed", "kind", "n", "d", "r", "noise"):
        assert repr(option) in str(err.value)


@pytest.mark.parametrize("name", ["text", "cnn", "geomedian", "lowrank"])
def test_factories_are_keyword_only_with_seed(name):
    options = task_options(name)
    assert "seed" in options
    assert all(v is not inspect.Parameter.empty for v in options.values()), "all options default"


def test_config_records_every_option_and_is_json():
    task = make_task("geomedian", d=12, n_train=5, n_eval=3, spectrum="linear", seed=4)
    config = json.loads(json.dumps(task.config))
    assert config["task"] == "geomedian"
    for option, default in task_options("geomedian").items():
        assert option in config
        if option not in ("d", "n_train", "n_eval", "spectrum", "seed"):
            assert config[option] == default
    assert (config["d"], config["spectrum"], config["seed"]) == (12, "linear", 4)


def test_register_validates_the_factory(monkeypatch):
    monkeypatch.setattr(_registry, "_FACTORIES", dict(_registry._FACTORIES))
    with pytest.raises(ValueError, match="keyword-only"):

        @register_task("positional")
        def positional(seed: int = 0) -> Task: ...

    with pytest.raises(ValueError, match="seed"):

        @register_task("seedless")
        def seedless(*, n: int = 1) -> Task: ...

    with pytest.raises(ValueError, match="already registered"):

        @register_task("lowrank")
        def again(*, seed: int = 0) -> Task: ...


def test_registered_factory_records_its_options(monkeypatch):
    monkeypatch.setattr(_registry, "_FACTORIES", dict(_registry._FACTORIES))
    base = make_task("lowrank", n=4, n_eval=2, d=5, r=2)

    @register_task("mine")
    def mine(*, seed: int = 0, shape: tuple[int, int] = (2, 3)) -> Task:
        base.config = {"extra": 1}
        return base

    task = make_task("mine", seed=3)
    splits = {"n_train": 4, "n_eval": 2, "n_public": 100, "public_ids": list(range(6, 106))}
    assert task.config == {"task": "mine", "seed": 3, "shape": [2, 3], "extra": 1, "splits": splits}
    with pytest.raises(TypeError, match="JSON"):
        make_task("mine", shape=object())


def test_every_public_name_imports():
    import gradspec.tasks as tasks

    missing = [name for name in tasks.__all__ if not hasattr(tasks, name)]
    assert not missing
    assert len(set(tasks.__all__)) == len(tasks.__all__)
