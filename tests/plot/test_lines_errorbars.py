"""plot_lines_errorbars: means with error bars against x."""

from __future__ import annotations

import numpy as np
import pytest

from gradspec.plot import plot_lines_errorbars


def test_draws_one_errorbar_line_per_series_with_the_data():
    series = {"a": {"x": [10, 100, 1000], "mean": [1.0, 2.0, 4.0], "std": [0.1, 0.2, 0.3]},
              "b": {"x": [10, 100, 1000], "mean": [1.0, 1.1, 1.2], "std": None, "linestyle": ":"}}
    fig = plot_lines_errorbars(series, xlabel="d", ylabel="loss", logx=True, logy=True, title="t")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.containers) == 2
    line = ax.containers[0].lines[0]
    np.testing.assert_allclose(line.get_xdata(), [10, 100, 1000])
    np.testing.assert_allclose(line.get_ydata(), [1.0, 2.0, 4.0])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]


def test_bad_series_raise():
    with pytest.raises(ValueError, match="equal length"):
        plot_lines_errorbars({"a": {"x": [1, 2], "mean": [1.0], "std": [0.1]}})
    with pytest.raises(ValueError, match="log axis"):
        plot_lines_errorbars({"a": {"x": [1, 2], "mean": [1.0, -1.0]}}, logy=True)
    with pytest.raises(ValueError, match="no series"):
        plot_lines_errorbars({})


def test_points_are_sorted_by_x_and_nonpositive_means_are_marked_on_request(tmp_path):
    from gradspec.plot import save_figure

    fig = plot_lines_errorbars({"a": {"x": [100, 10], "mean": [0.2, 0.1], "std": [0.01, 0.02]},
                                "b": {"x": [10, 100], "mean": [0.3, -0.1]}},
                               xlabel="d", ylabel="excess", logx=True, logy=True, mark_nonpositive=True)
    ax = fig.axes[0]
    data = {c.get_label(): (c.lines[0].get_xdata(), c.lines[0].get_ydata()) for c in ax.containers}
    np.testing.assert_allclose(data["a"][0], [10, 100])
    np.testing.assert_allclose(data["a"][1], [0.1, 0.2])
    # b's negative mean is drawn at the floor (half the smallest positive mean) with an open marker
    np.testing.assert_allclose(data["b"][1], [0.3, 0.05])
    marked = [line for line in ax.get_lines() if line.get_markerfacecolor() == "white"]
    assert len(marked) == 1 and np.allclose(marked[0].get_ydata(), [0.05])
    assert save_figure(fig, tmp_path, "s", formats=("png",))[0].stat().st_size > 0
