"""The whole-model analysis (issue 37 §5) on a tiny BERT: a subset's columns of a whole-model
per-step sketch are the subset's own sketch of the same rows, against the exact rows of the
same seeded run; and the analysis end to end, with an exact spectrum beside the sketched ones."""

from __future__ import annotations

import json

import numpy as np
import torch

from analyses.li2022_restricted_lipschitz import whole_model
from gradspec.collect import collect
from gradspec.sketch import SketchPlan, sketch_rows
from gradspec.store import GradientStore
from gradspec.train import CollectConfig

OPTIONS = {"model": "tiny-bert", "n_train": 48, "n_eval": 8, "n_public": 0, "max_length": 16}


def _run(tmp_path, name, **kw):
    config = CollectConfig(task="text", task_options=OPTIONS, params=("re:^bert\\.(embeddings|encoder)\\.",),
                           steps=12, batch_size=8, noise_multiplier=1.0, lr=1e-3, eval_every=0, log_every=6,
                           checkpoint_every=6, backend="ghost", seed=2, **kw)
    collect(config, out=tmp_path / name, progress=False)
    return tmp_path / name / "gradients.zarr"


def test_a_subsets_columns_are_its_sketch_of_the_exact_rows(tmp_path):
    exact_path = _run(tmp_path, "exact")
    sketched_path = _run(tmp_path, "sketched", sketch=600, sketch_blocks=4)
    exact = GradientStore.open(exact_path)
    for patterns in whole_model.SELECTIONS.values():
        sub = GradientStore.open(whole_model.subset_store(sketched_path, patterns, tmp_path / "sub.zarr"))
        plan = SketchPlan.from_dict(sub.sketch)
        rows = np.asarray(exact.read(), dtype=np.float64)
        layout = exact.layout
        parts = [rows[:, layout[s.name].offset : layout[s.name].stop] for s in plan.params]
        assert plan.p == sum(p.shape[1] for p in parts) == sub.sketch["p"]
        want = sketch_rows(plan, torch.from_numpy(np.concatenate(parts, axis=1))).numpy()
        got = np.asarray(sub.read(), dtype=np.float64)
        assert got.shape == want.shape == (12, plan.M)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_the_analysis_puts_exact_spectra_beside_the_sketched_ones(tmp_path):
    store = _run(tmp_path, "sketched", sketch=600, sketch_blocks=4)
    sigma = tmp_path / "sigma.txt"
    sigma.write_text("# an exact spectrum\n" + "\n".join(str(4.0 * k**-0.5) for k in range(1, 11)) + "\n")
    out = tmp_path / "analysis"
    assert whole_model.main([str(store), "--out", str(out), "--k", "4", "--exact", f"made up (exact)={sigma}",
                             "--fit-k", "10"]) == 0
    table = (out / "table.md").read_text()
    assert "| all recorded parameters |" in table and "| q/v subset |" in table and "| 5-type subset |" in table
    assert "| made up (exact) | — | exact | k^-0.500" in table
    assert "σ_k fit (k = 1..10) |" in table.splitlines()[0]
    # the extra range of the exact spectrum: all 10 of its σ (the main fit takes k = 1..4)
    made_up = json.loads((out / "results.json").read_text())["exact"]["made up (exact)"]
    assert made_up["fit"]["k"] == 4 and made_up["fits"]["10"]["k"] == 10
    assert abs(made_up["fits"]["10"]["c"] - 0.5) < 1e-9
    # the sketched spectra hold at most 4 values: their "1..10" fit says how many it took
    spectra = json.loads((out / "results.json").read_text())["spectra"]
    for line, res in zip(table.splitlines()[2:5], spectra.values(), strict=True):
        assert f"), k = 1..{len(res['sigma'])} |" in line and len(res["sigma"]) <= 4
    res = json.loads((out / "results.json").read_text())
    assert abs(res["exact"]["made up (exact)"]["fit"]["c"] - 0.5) < 1e-9
    assert set(res["spectra"]) == {whole_model.ALL, *whole_model.SELECTIONS}
    assert (out / "whole_model_spectrum.png").stat().st_size > 0
    # the first 6 of the 12 steps alone
    assert whole_model.main([str(store), "--out", str(tmp_path / "half"), "--k", "3", "--rows", "0:6"]) == 0
    half = json.loads((tmp_path / "half" / "results.json").read_text())
    assert half["r"] == 6 and half["rows"] == "0:6"
    from gradspec.store import SpectrumStore

    assert SpectrumStore.open(tmp_path / "half" / "spectrum_all.zarr").U.shape[0] == 6


def test_a_spectrum_of_fewer_than_three_directions_is_not_fitted():
    """pca keeps only the directions it resolved (a 6-row store gave 2 of k = 3, and the analysis
    raised); the table says so instead of fitting."""
    two = whole_model._fit(np.array([2.0, 1.0]), 3)
    assert two["k"] == 2 and not np.isfinite(two["c"]) and whole_model.fit_text(two) == "no fit (2 σ)"
    three = whole_model._fit(np.array([1.0, 2**-0.5, 3**-0.5]), 3)
    assert abs(three["c"] - 0.5) < 1e-9 and whole_model.fit_text(three).startswith("k^-0.500 (CI")
