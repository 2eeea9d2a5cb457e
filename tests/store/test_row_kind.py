"""Every gradient store says what its rows are, and combining stores of different kinds is
warned about by name (issue 25: a Hugging Face per-step store — the Trainer's unclipped .grad —
looked like any clipped store to pca, decay and overlays)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import gradspec
from cli.main import app
from gradspec.collect import GradientRecorder
from gradspec.store import (
    MEAN_OF_EXAMPLES,
    GradientStore,
    ParamLayout,
    RowKind,
    kind_mismatch,
    row_kind,
)
from gradspec.store._rowkind import PER_EXAMPLE, TRAINER_GRAD

LOWRANK = ["--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3", "--batch-size", "20",
           "--no-progress"]


@pytest.mark.parametrize("config, per_example, want", [
    ({"collect": {"max_grad_norm": 1.0, "clip": True}}, False, RowKind(True, 1.0, MEAN_OF_EXAMPLES, "gradspec")),
    ({"collect": {"max_grad_norm": 1.0, "clip": False}}, True, RowKind(False, None, PER_EXAMPLE, "gradspec")),
    ({"source": "recorder", "max_grad_norm": None}, False, RowKind(False, None, MEAN_OF_EXAMPLES, "plain loop")),
    ({"source": "opacus", "max_grad_norm": 0.5}, True, RowKind(True, 0.5, PER_EXAMPLE, "opacus")),
    ({"source": "hf-trainer", "max_grad_norm": 1.0}, False, RowKind(False, None, TRAINER_GRAD, "hf-trainer")),
], ids=["trainer", "trainer-no-clip", "plain", "opacus-per-example", "hf-step"])
def test_row_kind_from_the_run_config(config, per_example, want):
    assert row_kind(config, per_example=per_example) == want


def test_kind_mismatch_names_the_difference():
    a = RowKind(True, 1.0, MEAN_OF_EXAMPLES, "gradspec")
    assert kind_mismatch(a, RowKind(True, 1.0, MEAN_OF_EXAMPLES, "opacus")) is None  # same meaning
    assert "C = 1 vs 0.5" in kind_mismatch(a, RowKind(True, 0.5, MEAN_OF_EXAMPLES, "opacus"))
    hf = kind_mismatch(a, RowKind(False, None, TRAINER_GRAD, "hf-trainer"), names=("A", "B"))
    assert "B the trainer's .grad" in hf and "only A is clipped" in hf


def test_info_shows_the_kind_and_decay_warns_when_the_kinds_differ(tmp_path, caplog):
    runner = CliRunner()
    assert runner.invoke(app, ["collect", "--out", str(tmp_path / "run"), "--steps", "12", *LOWRANK]).exit_code == 0
    store = tmp_path / "run" / "gradients.zarr"
    shown = runner.invoke(app, ["info", str(store)]).output
    assert "kind     mean of per-example gradients over the step's examples, clipped to C = 1" in shown
    # an unclipped store of the same parameters (a plain loop's .grad)
    layout = GradientStore.open(store).layout
    rows = np.random.default_rng(0).standard_normal((8, layout.p)).astype(np.float32)
    with GradientRecorder(out=tmp_path / "plain", layout=ParamLayout.from_list(layout.to_list())) as rec:
        for row in rows:
            rec.record_step(grad=torch.from_numpy(row), batch_size=20)
    gradspec.pca(source=store, k=3, out=tmp_path / "s.zarr")
    with caplog.at_level(logging.WARNING):
        analysis = gradspec.decay_analysis(spectrum=tmp_path / "s.zarr", gradients=tmp_path / "plain" / "gradients.zarr")
    assert any("not the same kind" in n and "only the spectrum's is clipped" in n for n in analysis.notes)

    same = gradspec.decay_analysis(spectrum=tmp_path / "s.zarr")
    assert not any("not the same kind" in n for n in same.notes)
