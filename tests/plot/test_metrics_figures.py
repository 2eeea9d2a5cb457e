"""A run's metrics.jsonl read back (finished, or still being written), its training figure, and
the stated intervals of a sketched spectrum drawn as error bars."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.collections import LineCollection

from gradspec.plot import load_curve, plot_spectrum, plot_training, read_metrics

LOG = ('{"step": 5, "eval_loss": 0.4, "eval_mse": 0.8}\n'
       '{"step": 10, "epoch": 1, "loss": 0.37, "batch_size": 27, "epsilon": 1.15, "time": 0.1}\n'
       '\n'
       '{"step": 10, "eval_loss": 0.29, "eval_mse": 0.58}\n')


def test_records_and_curves_keep_the_file_order_and_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(LOG)
    m = read_metrics(path)
    assert m.lines == (1, 2, 4) and not m.partial_line
    assert m.names() == ["eval_loss", "eval_mse", "epoch", "loss", "batch_size", "epsilon", "time"]
    steps, values = m.curve("eval_loss")
    assert steps.tolist() == [5, 10] and values.tolist() == [0.4, 0.29]
    assert m.last("epsilon") == (10, 1.15) and m.last("eval_accuracy") is None
    assert [a.tolist() for a in load_curve(path, "eval_mse")] == [[5, 10], [0.8, 0.58]]


def test_a_line_being_written_is_left_out_only_when_the_run_may_still_write(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(LOG + '{"step": 15, "eval_lo')
    with pytest.raises(ValueError, match="line 5 is not a JSON object"):
        read_metrics(path)
    m = read_metrics(path, in_progress=True)
    assert m.partial_line and m.lines == (1, 2, 4)
    # a damaged line that ends in its newline is damage, running or not
    path.write_text(LOG + '{"step": 15\n')
    with pytest.raises(ValueError, match="line 5 is not a JSON object"):
        read_metrics(path, in_progress=True)


def test_a_bad_value_names_its_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('\n{"step": 1, "loss": "x"}\n')
    with pytest.raises(ValueError, match="line 2 has step 1 and loss 'x'"):
        read_metrics(path).curve("loss")


def test_the_training_figure_draws_each_logged_curve(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(LOG)
    fig = plot_training(read_metrics(path))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["loss", "evaluation", "privacy spent ε"]
    loss_ax = fig.axes[0]
    drawn = {line.get_label(): line.get_ydata().tolist() for line in loss_ax.get_lines()}
    assert drawn == {"loss": [0.37], "eval loss": [0.4, 0.29]}
    assert fig.axes[1].get_lines()[0].get_ydata().tolist() == [0.8, 0.58]
    path.write_text('{"step": 1, "time": 0.1}\n')
    assert plot_training(read_metrics(path)) is None


def test_stated_intervals_are_error_bars_and_unbounded_ones_arrows():
    sigma = np.array([4.0, 2.0, 1.0, 0.5])
    lower, upper = [3.5, 1.8, 0.7, 0.2], [4.4, 2.3, None, None]
    fig = plot_spectrum({"σ_k": sigma}, intervals={"σ_k": (lower, upper)})
    ax = fig.axes[0]
    labels = [c.get_label() for c in ax.containers]
    assert labels == ["stated interval", "interval unbounded above"]
    bounded = ax.containers[0].lines[2][0]  # the vertical bars of k = 1, 2
    ends = sorted(tuple(sorted(seg[:, 1])) for seg in bounded.get_segments())
    assert ends == [(1.8, 2.3), (3.5, 4.4)]
    spans = {tuple(sorted(seg[:, 1])) for c in ax.collections if isinstance(c, LineCollection)
             for seg in c.get_segments()}
    assert {(0.2, 0.5), (0.7, 1.0)} <= spans, spans  # lower end to σ for the unbounded ones
    arrows = ax.containers[1].lines[2][0]  # from σ up, capped by an arrow
    assert sorted(tuple(sorted(seg[:, 1])) for seg in arrows.get_segments()) == [(0.5, 1.0), (1.0, 2.0)]
    # eigenvalues square the ends
    fig = plot_spectrum({"σ_k": sigma}, intervals={"σ_k": (lower, upper)}, scale="eigen")
    bounded = fig.axes[0].containers[0].lines[2][0]
    ends = sorted(tuple(sorted(seg[:, 1])) for seg in bounded.get_segments())
    assert ends == [pytest.approx((1.8**2, 2.3**2)), pytest.approx((3.5**2, 4.4**2))]
