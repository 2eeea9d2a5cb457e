"""An Opacus loop recorded over empty batches and several sessions (found by review, 2026-12-04):
per-example recording crashed on an empty Poisson batch; a resumed store took the ε of a fresh
accountant that had counted only the last session (10 rows, ε of 5 steps: 4.569 for 5.984); and
step numbers restarted after steps with no row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradspec.collect import GradientRecorder
from gradspec.store import GradientStore, ParamLayout

from .test_opacus_adapter import accounted_steps, clipped_rows, private, snapshot

pytest.importorskip("opacus")


def _step(model, optimizer, recorder, x, y):
    losses = nn.functional.cross_entropy(model(x), y, reduction="none")
    recorder.observe_loss(losses)
    (losses.sum() / max(len(x), 1)).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_per_example_rows_across_an_empty_poisson_batch(tmp_path):
    engine, (model, optimizer, loader) = private()
    x, y = next(iter(loader))
    want = []
    with GradientRecorder(out=tmp_path, model=model, per_example=True) as rec:
        rec.attach_opacus(optimizer)
        for batch in ((x[:3], y[:3]), (x[:0], y[:0]), (x[3:5], y[3:5])):
            want.append(clipped_rows(snapshot(model), *batch))
            _step(model, optimizer, rec, *batch)
    store = GradientStore.open(tmp_path / "gradients.zarr")
    assert accounted_steps(engine) == 3 and store.n_rows == 5
    np.testing.assert_allclose(store.read(), torch.cat(want).numpy(), rtol=1e-5, atol=1e-7)
    assert store.row_meta()["step"].tolist() == [0, 0, 0, 2, 2]  # the empty step keeps its number


@pytest.mark.parametrize("restore", [False, True])
def test_a_resumed_store_records_epsilon_only_from_an_accountant_of_every_step(tmp_path, restore):
    engine, (model, optimizer, loader) = private()
    batches = list(loader)[:4]
    with GradientRecorder(out=tmp_path, model=model) as rec:
        rec.attach_opacus(optimizer, delta=1e-5)
        for b in batches[:2]:
            _step(model, optimizer, rec, *b)
    history = list(engine.accountant.history)
    engine2, (model2, optimizer2, _) = private()  # the next session: a fresh engine
    model2.load_state_dict(model.state_dict())
    if restore:
        engine2.accountant.history = history
    with GradientRecorder(out=tmp_path, model=model2, resume=True) as rec:
        rec.attach_opacus(optimizer2, delta=1e-5)
        for b in batches[2:]:
            _step(model2, optimizer2, rec, *b)
    cfg = GradientStore.open(tmp_path / "gradients.zarr").config
    rows = GradientStore.open(tmp_path / "gradients.zarr").row_meta()["step"].tolist()
    assert rows == [0, 1, 2, 3]
    if restore:
        assert cfg["steps"] == 4 and cfg["final_epsilon"] == pytest.approx(engine2.get_epsilon(1e-5))
    else:
        assert cfg["final_epsilon"] is None and "counted 2 of 4 steps" in cfg["epsilon_note"]


def test_a_plain_loops_empty_last_step_keeps_its_number_after_a_resume(tmp_path):
    with GradientRecorder(out=tmp_path, layout=ParamLayout.from_shapes([("w", (3,))])) as rec:
        rec.record_step(grad=torch.ones(3), batch_size=2)
        rec.record_step(grad=torch.ones(3), batch_size=0)  # step 1: no row
    with GradientRecorder(out=tmp_path, layout=ParamLayout.from_shapes([("w", (3,))]), resume=True) as rec:
        assert rec.next_step == 2
        rec.record_step(grad=torch.ones(3), batch_size=2)
    assert GradientStore.open(tmp_path / "gradients.zarr").row_meta()["step"].tolist() == [0, 2]
