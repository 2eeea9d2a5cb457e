"""A sweep's figures draw one line per configuration: seeds averaged, never privacy levels,
learning rates or option variants (found by review: a sweep over --noise-multipliers was one
line per algorithm, the mean of its levels; summary.csv could not tell the runs apart)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gradspec.plot._retrain import plot_metric_vs_epsilon, plot_retrain_curves


def _run(tmp_path, name, acc):
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "eval_accuracy": a}) + "\n"
                                             for s, a in zip((10, 20), acc, strict=True)))
    return str(d)


def _row(tmp_path, name, acc, **kw):
    row = {"algorithm": "dp-sgd", "rank": None, "seed": 0, "options": "", "lr": 0.1, "noise_multiplier": 1.0,
           "epsilon": 2.0, "out": _run(tmp_path, name, acc), "eval_accuracy": acc[-1]}
    row.update(kw)
    return row


def test_privacy_levels_are_lines_of_their_own(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    rows = [_row(tmp_path, "a0", (0.6, 0.7), seed=0), _row(tmp_path, "a1", (0.8, 0.9), seed=1),
            _row(tmp_path, "b0", (0.5, 0.5), noise_multiplier=2.0, epsilon=1.0)]
    fig = plot_retrain_curves(rows)
    lines = {ln.get_label(): ln.get_ydata() for ln in fig.axes[0].get_lines()}
    assert set(lines) == {"dp-sgd z=1", "dp-sgd z=2"}
    np.testing.assert_allclose(lines["dp-sgd z=1"], [0.7, 0.8])  # the two seeds averaged
    np.testing.assert_allclose(lines["dp-sgd z=2"], [0.5, 0.5])
    fig = plot_metric_vs_epsilon(rows)  # across epsilon: one line, both levels on it
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_allclose(line.get_xdata(), [1.0, 2.0])
    np.testing.assert_allclose(line.get_ydata(), [0.5, 0.8])


@pytest.mark.parametrize("field", ["lr", "options"])
def test_other_settings_are_lines_of_their_own(tmp_path, field):
    import matplotlib

    matplotlib.use("Agg")
    other = {"lr": 1.0, "options": json.dumps({"public_size": 20})}[field]
    rows = [_row(tmp_path, "a", (0.6, 0.7)), _row(tmp_path, "b", (0.2, 0.3), **{field: other})]
    for fig in (plot_retrain_curves(rows), plot_metric_vs_epsilon(rows)):
        assert len(fig.axes[0].get_lines()) == 2
