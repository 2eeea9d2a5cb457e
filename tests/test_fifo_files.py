"""A FIFO where gradspec reads a small JSON file must be refused, never waited on (found by
review: a FIFO at a run's config.json hung collect; at .gradspec-written.json, plot and report)."""

from __future__ import annotations

import os

import pytest

from gradspec.train._checkpoint import is_run_dir, read_run_config


@pytest.fixture
def fifo_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    return d


def test_a_fifo_config_is_no_run_and_is_refused_on_resume(fifo_dir):
    os.mkfifo(fifo_dir / "config.json")
    assert is_run_dir(fifo_dir) is False  # returns at once
    with pytest.raises(ValueError, match="not a regular file"):
        read_run_config(fifo_dir)


def test_a_fifo_output_record_is_no_record(fifo_dir):
    from cli._outputs import _record, check_outputs

    os.mkfifo(fifo_dir / ".gradspec-written.json")
    assert _record(fifo_dir) == {}
    check_outputs(fifo_dir, ["report.json"], overwrite=False)  # nothing to refuse, nothing waited on
