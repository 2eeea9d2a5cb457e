"""The report page of real small runs, read back without a browser: its numbers are the stores'
(every one exactly, through its data-value), it is one file that fetches nothing, and a
partial or stale run says what it lacks."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from gradspec.optim import read_result
from gradspec.report import read_run, render_report
from gradspec.spectrum import read_report, sigma_analysis
from gradspec.store import GradientStore, SpectrumStore
from tests.report._page import parse, svg_root
from tests.report.conftest import ok


@pytest.fixture(scope="module")
def page(full_run):
    html = render_report(full_run)
    return html, parse(html)


def test_privacy_and_settings_are_the_gradient_stores(full_run, page):
    _, pg = page
    cfg = GradientStore.open(full_run / "gradients.zarr").config
    assert pg.value("privacy.epsilon") == cfg["final_epsilon"]
    assert pg.shown("privacy.epsilon") == f"{cfg['final_epsilon']:.3f}"
    assert pg.value("privacy.delta") == cfg["delta"]
    assert pg.value("privacy.noise_multiplier") == cfg["noise_multiplier"]
    assert pg.value("privacy.q") == cfg["sample_rate"] == 0.1
    assert pg.value("privacy.steps") == cfg["steps"] == 24
    assert pg.value("privacy.clip") == cfg["max_grad_norm"]
    assert pg.value("trained.p") == cfg["p"] == 40
    assert pg.value("trained.rows") == 24
    assert pg.value("glance.epsilon") == cfg["final_epsilon"]
    for name, value in cfg["final_metrics"].items():
        assert pg.value(f"final.{name}") == value
    assert "pld" in pg.text and "lowrank" in pg.text


def test_the_spectrum_and_its_accuracy_are_the_spectrum_stores(full_run, page):
    _, pg = page
    spec = SpectrumStore.open(full_run / "spectrum.zarr")
    sigma, residuals = spec.sigma, spec.array("residuals")
    shown = [k for k in pg.numbers if k.startswith("spectrum.sigma.")]
    assert len(shown) == spec.k == 3
    for i in range(spec.k):
        assert pg.value(f"spectrum.sigma.{i + 1}") == sigma[i]
        assert pg.value(f"spectrum.residual.{i + 1}") == residuals[i]
    for key in ("max_residual", "median_residual", "reconstruction_error", "explained_variance",
                "orthogonality_u", "gram_residual"):
        assert pg.value(f"accuracy.{key}") == spec.accuracy[key], key
    rates = spec.params["rates"]
    assert [pg.value(f"pca.rate.{i}.gflops") for i in range(len(rates))] == [r["gflops"] for r in rates]
    assert pg.value("pca.passes") == spec.attrs["gradspec.passes"]


def test_fits_gk_and_bounds_are_the_decay_reports(full_run, page):
    _, pg = page
    report = read_report(full_run / "decay" / "report.json")
    for which in ("singular", "eigen"):
        fit = report["spectrum"][f"fit_{which}"]
        assert pg.value(f"fit.{which}.c") == fit["c"] and pg.value(f"fit.{which}.a") == fit["a"]
        assert [pg.value(f"fit.{which}.ci_low"), pg.value(f"fit.{which}.ci_high")] == fit["ci"]
    G = report["rows"]["collected"]["G_k"]
    for i, k in enumerate(G["ks"]):
        assert pg.value(f"gk.collected.max.{k}") == G["max"][i]
        assert pg.value(f"gk.collected.p95.{k}") == G["p95"][i]
    bounds = report["rows"]["collected"]["bounds"]
    assert set(bounds) == {"empirical", "population"}
    for tag, b in bounds.items():
        assert pg.value(f"bound.collected.{tag}.bound") == b["bound_at_k_star"]
        assert pg.value(f"bound.collected.{tag}.k_star") == b["k_star"]
        assert pg.value(f"bound.collected.{tag}.dimension_dependent") == b["dimension_dependent_bound"]
    assert pg.value("decay.explained_variance") == report["spectrum"]["explained_variance"][-1]


def test_the_retraining_runs_are_their_results(full_run, page):
    _, pg = page
    runs = sorted((full_run / "sweep").glob("*/retrain.json"))
    assert len(runs) == 2
    for i, path in enumerate(runs):
        r = read_result(path.parent)
        assert pg.value(f"retrain.{i}.epsilon") == r.epsilon
        assert pg.value(f"retrain.{i}.steps") == r.steps == 6
        assert pg.value(f"retrain.{i}.eval_loss") == r.final_metrics["eval_loss"]
    # the subspace run's ε is no DP guarantee, and the page says so
    assert any(level == "caveat" and "no DP guarantee" in text for level, text in pg.findings)


def test_every_number_has_one_key_and_every_stage_is_complete(page):
    _, pg = page
    assert not pg.duplicates
    assert pg.stages == {"collect": "complete", "pca": "complete", "decay": "complete", "retrain": "complete"}
    assert not pg.missing
    assert not [f for f in pg.findings if f[0] in ("error", "warning")], pg.findings


def test_the_page_is_one_file_that_fetches_nothing(page):
    html, pg = page
    assert pg.csp == "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
    assert not {"script", "link", "iframe", "object", "embed"} & pg.tags
    assert all(u.startswith(("data:image/svg+xml;base64,", "#")) for u in pg.urls), [u[:40] for u in pg.urls]
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    names = ["training", "spectrum", "eigenvalues", "density", "lipschitz", "explained_variance", "step_error",
             "retrain"]
    for name in names:
        assert f'id="fig-{name}"' in html, name
    assert len(pg.images) == len(names)
    for uri in pg.images:
        root = svg_root(uri)
        assert root.tag == "{http://www.w3.org/2000/svg}svg" and len(root) > 0


def test_text_from_the_folder_is_escaped(tmp_path, full_run):
    odd = tmp_path / 'a<b onload="x">&c'
    odd.mkdir()
    shutil.copy(full_run / "metrics.jsonl", odd / "metrics.jsonl")  # a log alone is part of a run
    html = render_report(odd)
    assert '<b onload="x">' not in html
    assert "a&lt;b onload=&#34;x&#34;&gt;&amp;c" in html
    assert parse(html).title == 'gradspec report · a<b onload="x">&c'


def test_a_stopped_collect_shows_its_rows_and_what_to_run_next(stopped_run):
    pg = parse(render_report(stopped_run))
    store = GradientStore.open(stopped_run / "gradients.zarr")
    assert store.status != "complete" and store.n_rows == 10
    assert pg.stages == {"collect": "running", "pca": "absent", "decay": "absent", "retrain": "absent"}
    assert "no spectrum yet" in pg.missing["pca"] and f"gradspec pca {stopped_run}/gradients.zarr" in pg.missing["pca"]
    assert "gradspec decay" in pg.missing["decay"]
    warning = [t for level, t in pg.findings if level == "warning"]
    assert any("not finished: 10 rows committed of 24 steps" in t and "--resume" in t for t in warning), warning
    assert any("still being written" in t for level, t in pg.findings if level == "note")
    # ε so far is the last one the log recorded (the torn last line left out)
    steps, eps = read_run(stopped_run).metrics.curve("epsilon")
    assert steps[-1] == 10 and pg.value("privacy.epsilon") == eps[-1]
    assert pg.value("trained.rows") == 10


def test_a_folder_with_only_a_spectrum_fits_its_sigma_and_asks_for_the_rest(tmp_path, full_run):
    only = tmp_path / "only"
    only.mkdir()
    shutil.copytree(full_run / "spectrum.zarr", only / "spectrum.zarr")
    pg = parse(render_report(only))
    assert pg.stages["collect"] == "absent" and pg.stages["pca"] == "complete" and pg.stages["decay"] == "absent"
    assert "gradspec decay" in pg.missing["decay"] and "σ fits below are of the spectrum alone" in pg.missing["decay"]
    fit = sigma_analysis(SpectrumStore.open(only / "spectrum.zarr")).fit_singular
    assert pg.value("fit.singular.c") == fit.c
    assert not any(k.startswith("gk.") for k in pg.numbers)
    assert "privacy.epsilon" not in pg.numbers


def test_a_decay_report_of_an_older_spectrum_is_stale(tmp_path, full_run):
    run = tmp_path / "run"
    shutil.copytree(full_run, run, ignore=shutil.ignore_patterns("sweep", "figures"))
    ok("pca", run / "gradients.zarr", "--k", 10, "--rows", "0:12", "--out", run / "spectrum.zarr", "--overwrite",
       "--no-progress")
    contents = read_run(run)
    assert contents.stages["decay"].state == "stale"
    pg = parse(render_report(contents))
    assert pg.stages["decay"] == "stale"
    assert any(level == "warning" and "another spectrum" in t and "--overwrite" in t for level, t in pg.findings)
    # the σ shown are the new spectrum's
    assert pg.value("spectrum.sigma.1") == SpectrumStore.open(run / "spectrum.zarr").sigma[0]


def test_a_sketched_spectrum_shows_its_stated_intervals(sketched_run):
    from gradspec.report._figures import _decay_figures

    contents = read_run(sketched_run)
    pg = parse(render_report(contents))
    sketch = SpectrumStore.open(sketched_run / "spectrum.zarr").accuracy["sketch"]
    for i, (lo, hi) in enumerate(zip(sketch["sigma_lower"], sketch["sigma_upper"], strict=True)):
        assert pg.value(f"sketch.lower.{i + 1}") == lo
        if hi is None:
            assert pg.numbers[f"sketch.upper.{i + 1}"][0] == ""
        else:
            assert pg.value(f"sketch.upper.{i + 1}") == hi
    assert pg.value("sketch.median_relative_half_width") == sketch["median_relative_half_width"]
    cfg = GradientStore.open(sketched_run / "gradients.zarr").config
    assert pg.value("trained.p") == cfg["p"] == 2000 and pg.value("trained.columns") <= 512
    assert any(level == "caveat" and "sketched store" in t for level, t in pg.findings)
    ax = _decay_figures(contents)["spectrum"].axes[0]
    bars = [c for c in ax.containers if c.get_label().startswith(("stated interval", "interval unbounded"))]
    assert sum(len(c.lines[2][0].get_segments()) for c in bars) == len(sketch["sigma_lower"])


def test_a_folder_of_no_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="holds no part of a gradspec run"):
        read_run(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="holds no part of a gradspec run"):
        read_run(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        read_run(tmp_path / "nope")
    with pytest.raises(ValueError, match="is not a folder"):
        read_run(tmp_path / "notes.txt")


def test_a_damaged_part_is_an_error_on_the_page_not_a_failure(tmp_path, full_run):
    run = tmp_path / "run"
    shutil.copytree(full_run, run, ignore=shutil.ignore_patterns("sweep", "figures"))
    (run / "decay" / "report.json").write_text("{not json")
    chunk = next(p for p in sorted((run / "gradients.zarr" / "grads").rglob("*")) if p.is_file() and p.name != "zarr.json")
    chunk.unlink()
    pg = parse(render_report(run))
    errors = [t for level, t in pg.findings if level == "error"]
    assert any("report.json" in t and "not JSON" in t for t in errors), errors
    assert any("missing" in t for t in errors), errors
    assert pg.stages["collect"] == "damaged"
    assert np.isfinite(pg.value("spectrum.sigma.1"))


def test_a_retraining_runs_own_folder_shows_its_epsilon_and_asks_for_nothing(full_run):
    folder = next((full_run / "sweep").glob("dp-sgd-*"))
    pg = parse(render_report(folder))
    result = read_result(folder)
    assert pg.stages == {"collect": "absent", "pca": "absent", "decay": "absent", "retrain": "complete"}
    assert not pg.missing  # no collect, pca or decay belongs in a retraining run's folder
    assert pg.value("privacy.epsilon") == pg.value("retrain.0.epsilon") == result.epsilon
