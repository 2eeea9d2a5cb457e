"""plot_scaling draws each series' points (non-positive means marked on a log axis)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from gradspec.plot import plot_scaling, save_figure


def test_lines_hold_the_data_sorted_by_x(tmp_path):
    fig, ax = plot_scaling({"a": ([100, 10], [0.2, 0.1], [0.01, 0.02]), "b": ([10, 100], [0.3, -0.1], None)},
                           xlabel="d", ylabel="excess")
    data = {c.get_label(): (c.lines[0].get_xdata(), c.lines[0].get_ydata()) for c in ax.containers}
    np.testing.assert_allclose(data["a"][0], [10, 100])
    np.testing.assert_allclose(data["a"][1], [0.1, 0.2])
    # b's negative mean is drawn at the floor (half the smallest positive mean) and marked
    np.testing.assert_allclose(data["b"][1], [0.3, 0.05])
    marked = [line for line in ax.get_lines() if line.get_markerfacecolor() == "white"]
    assert len(marked) == 1 and np.allclose(marked[0].get_ydata(), [0.05])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert save_figure(fig, tmp_path, "s", formats=("png",))[0].stat().st_size > 0


def test_mismatched_lengths_and_empty_input_are_refused():
    with pytest.raises(ValueError, match="same length"):
        plot_scaling({"a": ([1, 2], [1.0], None)}, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="at least one"):
        plot_scaling({}, xlabel="x", ylabel="y")
