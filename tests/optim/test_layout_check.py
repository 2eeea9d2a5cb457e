"""A fixed subspace is applied only to the parameters it was computed on, not to any of equal p.

The query and the value weights of a transformer layer have the same p: a spectrum of
the query gradients used to retrain the value weights trains in a meaningless subspace
(issue 13 §2). The check compares names, shapes and order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec.collect import CollectConfig, collect
from gradspec.optim import FixedProjector, make_algorithm, retrain
from gradspec.optim._registry import spectrum_layout
from gradspec.store import update_attrs

from ._cases import fake_run, orthonormal

TEXT = {"model": "tiny-bert", "n_train": 32, "n_eval": 8, "n_public": 8}
QUERY, VALUE = ("*attention.self.query.weight",), ("*attention.self.value.weight",)


def _config(params, **kw) -> CollectConfig:
    base = dict(task="text", task_options=TEXT, params=params, steps=2, batch_size=8,
                noise_multiplier=0.0, optimizer="sgd", lr=0.01, eval_every=0, log_every=2,
                checkpoint_every=2, microbatch=None)
    return CollectConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def query_spectrum(tmp_path_factory):
    """A spectrum of tiny-bert's query-weight gradients (2 layers, 32 x 32: p = 2048)."""
    import gradspec

    root = tmp_path_factory.mktemp("layout")
    collect(_config(QUERY + VALUE, steps=6, checkpoint_every=6), out=root / "run")
    spectrum = root / "query.zarr"
    gradspec.pca(source=root / "run" / "gradients.zarr", k=3, params=list(QUERY), out=spectrum)
    return spectrum


def test_spectrum_records_its_parameters(query_spectrum):
    assert spectrum_layout(query_spectrum) == [
        (f"bert.encoder.layer.{i}.attention.self.query.weight", (32, 32)) for i in range(2)]


def test_retrain_with_other_parameters_of_equal_p_is_refused(tmp_path, query_spectrum):
    hooks = make_algorithm("subspace", spectrum=query_spectrum, rank=2)
    with pytest.raises(ValueError, match=r"equal p=2048 is not enough.*query\.weight.*value\.weight") as err:
        retrain(config=_config(VALUE), algorithm=hooks, out=tmp_path / "value")
    assert "\n" not in str(err.value)
    # the matching parameters still work
    res = retrain(config=_config(QUERY), out=tmp_path / "query",
                  algorithm=make_algorithm("subspace", spectrum=query_spectrum, rank=2))
    assert res.rank == 2 and res.steps == 2


def test_cli_names_the_mismatching_parameters_in_one_line(tmp_path, query_spectrum):
    import typer
    from typer.testing import CliRunner

    from cli.retrain import retrain_command

    app = typer.Typer()
    app.command()(retrain_command)
    app.command("noop")(lambda: None)
    args = ["retrain-command", "--out", str(tmp_path / "cli"), "--task", "text", "-t", "model=tiny-bert",
            "-t", "n_train=32", "-t", "n_eval=8", "-t", "n_public=8", "--steps", "1", "--batch-size", "8",
            "--noise-multiplier", "0", "--rank", "2", "--projector", str(query_spectrum), "--no-progress"]
    bad = CliRunner().invoke(app, [*args, "--params", VALUE[0]])
    assert bad.exit_code != 0
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the fixed subspace is of other parameters")
    assert "layer.0.attention.self.query.weight" in lines[0]
    assert "layer.0.attention.self.value.weight" in lines[0]
    good = CliRunner().invoke(app, [*args, "--params", QUERY[0]])
    assert good.exit_code == 0, good.output


def test_a_store_without_a_recorded_layout_uses_its_source_gradient_store(tmp_path, query_spectrum):
    """Older spectrum stores record only the source path and column ranges."""
    import shutil

    from gradspec.store._spectrum import SpectrumStore

    old = tmp_path / "old.zarr"
    shutil.copytree(query_spectrum, old)
    store = SpectrumStore.open(old, mode="r+")
    source = {k: v for k, v in store.source.items() if k != "layout"}
    update_attrs(store._group, {"gradspec.source": source})
    assert spectrum_layout(old) == spectrum_layout(query_spectrum)
    # the source store gone: nothing tells which parameters the columns are
    source["path"] = source["abspath"] = str(tmp_path / "gone.zarr")
    update_attrs(store._group, {"gradspec.source": source})
    assert spectrum_layout(old) is None
    with pytest.raises(ValueError, match=r"does not record which parameters.*--no-layout-check"):
        make_algorithm("subspace", spectrum=old, rank=2)
    hooks = make_algorithm("subspace", spectrum=old, rank=2, check_layout=False)
    assert hooks.projector.layout is None


def test_an_array_spectrum_is_refused_unless_the_check_is_off(tmp_path):
    import gradspec

    h = np.random.default_rng(0).standard_normal((10, 16)).astype("float32")
    gradspec.pca(source=h, k=3, out=tmp_path / "array.zarr")
    with pytest.raises(ValueError, match="does not record which parameters"):
        make_algorithm("subspace", spectrum=tmp_path / "array.zarr", rank=2)
    hooks = make_algorithm("subspace", spectrum=tmp_path / "array.zarr", rank=2, check_layout=False)
    hooks.setup(fake_run(16))  # p alone is compared


CASES = [  # (basis layout, run layout, message)
    pytest.param([("a", (2, 2)), ("b", (4,))], [("a", (2, 2)), ("c", (4,))],
                 r"covers 'b', the run trains 'c'", id="other-name"),
    pytest.param([("a", (2, 2)), ("b", (4,))], [("a", (4,)), ("b", (2, 2))],
                 r"parameter 'a' with shape \(2, 2\), the run trains it with shape \(4,\)", id="shape"),
    pytest.param([("a", (4,)), ("b", (4,))], [("b", (4,)), ("a", (4,))],
                 r"orders its parameters differently.*position 0: 'a' in the basis, 'b' in the run",
                 id="order"),
]


@pytest.mark.parametrize(("basis_layout", "run_layout", "message"), CASES)
def test_fixed_projector_compares_names_shapes_and_order(basis_layout, run_layout, message):
    from gradspec.store import ParamLayout

    projector = FixedProjector(orthonormal(8, 2), layout=basis_layout)
    run = fake_run(8, layout=ParamLayout.from_shapes(run_layout))
    with pytest.raises(ValueError, match=message):
        projector.setup(run)
    run = fake_run(8, layout=ParamLayout.from_shapes(basis_layout))
    projector.setup(run)
    torch.testing.assert_close(projector.basis.double(), orthonormal(8, 2), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="basis has 8 rows but its layout 6"):
        FixedProjector(orthonormal(8, 2), layout=[("a", (6,))])
