"""A folder whose run was replaced (`collect --overwrite` keeps spectrum.zarr and decay/): the
page must say the spectrum is another run's (found by review: seed 1's page showed seed 0's σ
and G_k with no warning, while `gradspec decay` refused the same spectrum)."""

from __future__ import annotations

from gradspec.report._checks import ERROR, findings
from gradspec.report._read import read_run

from .conftest import TRAIN, ok


def test_a_spectrum_of_a_replaced_run_is_an_error_on_the_page(tmp_path):
    run = tmp_path / "run"
    ok("collect", "--out", run, "--steps", 6, "--noise-multiplier", 1.0, "--eval-every", 0, *TRAIN)
    ok("pca", run / "gradients.zarr", "--k", 4, "--out", run / "spectrum.zarr", "--no-progress")
    assert not [f for f in findings(read_run(run)) if "earlier run" in f.text]
    ok("collect", "--out", run, "--steps", 6, "--noise-multiplier", 1.0, "--eval-every", 0, "--seed", 1,
       "--overwrite", *TRAIN)
    stale = [f for f in findings(read_run(run)) if "earlier run" in f.text]
    assert len(stale) == 1 and stale[0].level == ERROR and "gradspec pca" in stale[0].next_step


def test_a_resumed_run_keeps_its_spectrum(tmp_path):
    """A run stopped, analysed, then resumed: the spectrum is of its first rows, a note, not an
    error (found by review: the resume's next_step changed the config digest)."""
    run = tmp_path / "run"
    ok("collect", "--out", run, "--steps", 12, "--stop-after", 6, "--noise-multiplier", 1.0, "--eval-every", 0, *TRAIN)
    ok("pca", run / "gradients.zarr", "--k", 4, "--out", run / "spectrum.zarr", "--no-progress")
    ok("collect", "--out", run, "--resume", "--no-progress")
    found = findings(read_run(run))
    assert not [f for f in found if "earlier run" in f.text]
    assert [f for f in found if "computed when 6 rows were committed" in f.text]
