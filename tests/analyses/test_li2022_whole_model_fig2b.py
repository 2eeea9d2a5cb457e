"""The whole-model Fig. 2b analysis (issue 37 §5) end to end on a tiny BERT: the exact
spectra of the whole store and of its q/v columns against a float64 SVD of the same rows, the
arms' projectors and trained parameters, the report's rows and figure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyses.li2022_restricted_lipschitz import whole_model_fig2b as fig2b
from gradspec.collect import collect
from gradspec.store import GradientStore, SpectrumStore
from gradspec.train import CollectConfig

OPTIONS = {"model": "tiny-bert", "n_train": 48, "n_eval": 8, "n_public": 0, "max_length": 16}
WHOLE = ("re:^bert\\.(embeddings|encoder)\\.",)


def _collect(tmp_path, **kw):
    config = CollectConfig(task="text", task_options=OPTIONS, params=WHOLE, steps=12, batch_size=8,
                           noise_multiplier=1.0, lr=1e-3, eval_every=0, log_every=6, checkpoint_every=6,
                           backend="ghost", seed=2, **kw)
    collect(config, out=tmp_path / "run", progress=False)
    return tmp_path / "run"


def _svd_top(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    _, s, vt = np.linalg.svd(rows, full_matrices=False)
    return s[:k], vt[:k].T


def test_the_analysis_retrains_in_exact_whole_model_and_qv_subspaces(tmp_path):
    run = _collect(tmp_path)
    out = tmp_path / "fig2b"
    assert fig2b.main([str(run), "--out", str(out), "--k", "3", "--steps", "3", "--seeds", "0,1",
                       "--noise-multiplier", "1.0"]) == 0
    store = GradientStore.open(run / "gradients.zarr")
    rows = np.asarray(store.read(), dtype=np.float64)
    qv = [(store.layout[n].offset, store.layout[n].stop) for n in store.layout.names
          if n.endswith(("attention.self.query.weight", "attention.self.value.weight"))]
    assert len(qv) == 4  # tiny-bert: 2 layers × (query, value)
    parts = {"whole": rows, "qv": np.concatenate([rows[:, a:b] for a, b in qv], axis=1)}
    info = json.loads((out / "pca.json").read_text())
    for group, h in parts.items():
        s, v = _svd_top(h, 3)
        spec = SpectrumStore.open(out / fig2b.GROUPS[group][1])
        got = np.asarray(spec.V[:], dtype=np.float64)
        assert info[group]["p"] == h.shape[1] == got.shape[0]
        np.testing.assert_allclose(info[group]["sigma"], s, rtol=1e-5)
        # the same subspace (what retrain projects onto, after its repair): cos of the angles all 1
        cos = np.linalg.svd(v.T @ np.linalg.qr(got)[0], compute_uv=False)
        np.testing.assert_allclose(cos, 1.0, atol=1e-5)
    res = json.loads((out / "results.json").read_text())
    whole, qvg = res["retrain"]["whole"], res["retrain"]["qv"]
    assert set(whole["arms"]) == {"dpsgd", "topk-k3", "complement-k3", "random-k3", "untrained"}
    assert set(qvg["arms"]) == {"dpsgd", "topk-k3", "untrained"}
    for arms in (whole["arms"], qvg["arms"]):
        for name, arm in arms.items():
            assert arm["accuracy"]["n"] == (1 if name == "untrained" else 2), name
    # the q/v arms train the q/v weights only; the whole-model arms every recorded parameter
    for folder, params, spectrum in (("retrain", list(WHOLE), "spectrum_whole.zarr"),
                                     ("retrain_qv", list(fig2b.QV), "spectrum_qv.zarr")):
        found = sorted((out / folder).glob("*/*/retrain.json"))
        assert len(found) == (8 if folder == "retrain" else 4)
        for path in found:
            d = json.loads(path.read_text())
            assert d["settings"]["config"]["params"] == params, path
            if path.parent.parent.name in ("topk", "complement"):
                assert d["options"]["spectrum"] == str(out / spectrum)
                assert d["dp_guarantee"] is False
    table = (out / "table.md").read_text()
    assert "Fig. 2b, all recorded parameters: top-3 retraining ≈ full DP-SGD" in table
    assert "Fig. 2b, q/v weights: top-3 retraining ≈ full DP-SGD" in table
    assert "control, all recorded parameters: complement-3" in table
    assert (out / "figures" / "fig2b_whole_model.png").stat().st_size > 0
    # a second call reuses every finished run and spectrum
    mtime = (out / "spectrum_whole.zarr").stat().st_mtime
    assert fig2b.main([str(run), "--out", str(out), "--k", "3", "--steps", "3", "--seeds", "0,1",
                       "--noise-multiplier", "1.0", "--stages", "pca,retrain"]) == 0
    assert (out / "spectrum_whole.zarr").stat().st_mtime == mtime


def test_a_sketched_run_is_refused_in_one_line(tmp_path):
    run = _collect(tmp_path, sketch=600, sketch_blocks=4)
    with pytest.raises(SystemExit, match="not an exact per-step collection"):
        fig2b.main([str(run), "--out", str(tmp_path / "x"), "--stages", "pca"])


def test_a_re_collection_merges_the_earlier_arms_only_when_its_spectra_agree(tmp_path):
    # the same seeded recipe collected twice (scratch lost between machines): same rows, same subspaces
    first, second = _collect(tmp_path / "a"), _collect(tmp_path / "b")
    common = ["--k", "3", "--steps", "3", "--seeds", "0", "--noise-multiplier", "1.0"]
    assert fig2b.main([str(first), "--out", str(tmp_path / "o1"), *common, "--arms", "dpsgd,topk"]) == 0
    prior = tmp_path / "o1" / "results.json"
    assert fig2b.main([str(second), "--out", str(tmp_path / "o2"), *common, "--arms", "complement",
                       "--prior", str(prior)]) == 0
    res = json.loads((tmp_path / "o2" / "results.json").read_text())
    arms = res["retrain"]["whole"]["arms"]
    assert {"dpsgd", "topk-k3", "complement-k3", "untrained"} <= set(arms)
    assert res["prior"]["max_relative_sigma_difference"]["whole"] <= fig2b.PRIOR_SIGMA_RTOL
    assert sorted(res["prior"]["runs_added"]["whole"]) == ["dpsgd seed 0", "topk-k3 seed 0"]
    runs = res["retrain"]["whole"]["runs"]
    assert runs["topk-k3"][0]["source"] == str(prior) and "source" not in runs["complement-k3"][0]
    # the paired complement − top-k difference spans both runs' arms
    assert res["retrain"]["whole"]["paired"]["topk-k3"]["complement-k3"]["seeds"] == [0]
    # another subspace (a changed σ), another budget: refused in one line, nothing merged
    bad = json.loads(prior.read_text())
    bad["pca"]["whole"]["sigma"][1] *= 1.001
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match="whole spectra differ"):
        fig2b.main([str(second), "--out", str(tmp_path / "o2"), *common, "--stages", "report",
                    "--prior", str(tmp_path / "bad.json")])
    with pytest.raises(SystemExit, match="k/steps 3/3, not 3/4"):
        fig2b.main([str(second), "--out", str(tmp_path / "o2"), *common[:2], "--steps", "4", "--stages",
                    "report", "--prior", str(prior)])
