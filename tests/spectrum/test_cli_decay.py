"""`gradspec decay` / `gradspec plot` end to end on real stores (collect-like rows → pca → decay)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from cli.decay import decay_command, plot_command

linalg = pytest.importorskip("gradspec.linalg")
store_mod = pytest.importorskip("gradspec.store")


def _app() -> typer.Typer:
    """The two commands as cli/main.py registers them."""
    app = typer.Typer()
    app.command("decay")(decay_command)
    app.command("plot")(plot_command)
    return app


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stores")
    rng = np.random.default_rng(0)
    r, shapes = 60, [("w", (8, 10)), ("b", (10,))]
    layout = store_mod.ParamLayout.from_shapes(shapes)
    H = (rng.standard_normal((r, layout.p)) * np.arange(1, layout.p + 1) ** -0.8).astype(np.float32)
    meta = {name: np.zeros(r, dtype=dt) for name, dt in store_mod.META_FIELDS.items()}
    meta["step"] = np.arange(r)
    grads = store_mod.GradientStore.create(tmp / "grads.zarr", layout=layout, cols_per_chunk=32)
    grads.append(H, meta)
    spec_path = tmp / "spec.zarr"
    linalg.pca(
        source=str(tmp / "grads.zarr"), k=20, rows=slice(0, 40), method="gram", out=str(spec_path)
    )
    return {"grads": tmp / "grads.zarr", "spec": spec_path, "H": H}


def test_decay_writes_report_and_figures(stores, tmp_path):
    out = tmp_path / "decay"
    args = [
        "decay",
        str(stores["spec"]),
        "--out",
        str(out),
        "--heldout-rows",
        "40:60",
        "--format",
        "png",
        "--n",
        "1000",
        "--epsilon",
        "2",
        "--delta",
        "1e-5",
        "--diameter",
        "1",
    ]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["sources"]["spectrum"]["path"] == str(stores["spec"])
    assert report["sources"]["collected"]["rows"] == {"start": 0, "stop": 40, "step": 1}
    assert report["sources"]["heldout"]["n_rows"] == 20
    H = stores["H"].astype(np.float64)
    assert report["rows"]["collected"]["G_k"]["max"][0] == pytest.approx(
        np.linalg.norm(H[:40], axis=1).max(), rel=1e-5
    )
    # G_k on the held-out rows against the dense projector onto the stored V.
    s, V = np.linalg.svd(H[:40], full_matrices=False)[1:]
    ks = report["rows"]["heldout"]["G_k"]["ks"]
    ref = [np.linalg.norm(H[40:] - H[40:] @ V[:k].T @ V[:k], axis=1).max() for k in ks]
    np.testing.assert_allclose(report["rows"]["heldout"]["G_k"]["max"], ref, rtol=1e-4)
    np.testing.assert_allclose(report["spectrum"]["sigma"], s[:20], rtol=1e-6)
    assert report["rows"]["heldout"]["bounds"]["empirical"]["settings"]["dim"] == 90
    assert report["spectrum"]["total_energy"] == pytest.approx((H[:40] ** 2).sum(), rel=1e-6)
    for name in ("spectrum", "density", "lipschitz", "explained_variance", "step_error"):
        assert (out / f"{name}.png").exists() and not (out / f"{name}.pdf").exists()
    assert "G_k" in res.output


def test_decay_errors_are_one_line(stores, tmp_path):
    res = CliRunner().invoke(
        _app(), ["decay", str(stores["spec"]), "--out", str(tmp_path), "--n", "10"]
    )
    assert res.exit_code != 0
    assert "error: the bounds need all of" in res.output
    res = CliRunner().invoke(
        _app(), ["decay", str(stores["spec"]), "--out", str(tmp_path), "--tail", "up"]
    )
    assert res.exit_code != 0 and "hold, fit, zero" in res.output
    assert "Traceback" not in res.output


def test_plot_overlays_reports_and_spectra(stores, tmp_path):
    out = tmp_path / "d"
    res = CliRunner().invoke(
        _app(), ["decay", str(stores["spec"]), "--out", str(out), "--no-plots", "--spectrum-only"]
    )
    assert res.exit_code == 0, res.output
    assert not (out / "spectrum.png").exists()
    figs = tmp_path / "figs"
    res = CliRunner().invoke(
        _app(),
        [
            "plot",
            str(out),
            str(stores["spec"]),
            "--out",
            str(figs),
            "-l",
            "report",
            "-l",
            "store",
            "--format",
            "png",
        ],
    )
    assert res.exit_code == 0, res.output
    assert (figs / "overlay_spectrum.png").exists() and not (figs / "overlay_spectrum.pdf").exists()
    res = CliRunner().invoke(_app(), ["plot", str(out), "--out", str(figs), "-l", "a", "-l", "b"])
    assert res.exit_code != 0 and "one per input" in res.output


# ------------------------------------------------------------- never over a user's files (issue 25)
def _one_error_line(res) -> str:
    assert res.exit_code != 0 and "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_decay_refuses_to_write_over_a_users_report_and_figures(stores, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.json").write_text('{"my": "own report"}')
    (out / "spectrum.pdf").write_bytes(b"%PDF-1.4 my own figure")
    (out / "notes.txt").write_text("untouched")
    decay = ["decay", str(stores["spec"]), "--out", str(out), "--spectrum-only"]
    line = _one_error_line(CliRunner().invoke(_app(), decay))
    assert "already holds report.json, spectrum.pdf, which gradspec did not write" in line
    assert "--overwrite" in line
    assert (out / "report.json").read_text() == '{"my": "own report"}'
    assert (out / "spectrum.pdf").read_bytes() == b"%PDF-1.4 my own figure"
    # --overwrite replaces them (and only the names decay writes)
    res = CliRunner().invoke(_app(), [*decay, "--overwrite", "--format", "pdf"])
    assert res.exit_code == 0, res.output
    assert len(json.loads((out / "report.json").read_text())["spectrum"]["sigma"]) == 20
    assert (out / "spectrum.pdf").read_bytes() != b"%PDF-1.4 my own figure"
    assert (out / "notes.txt").read_text() == "untouched"


def test_decay_and_plot_rerun_over_their_own_files_but_not_edited_ones(stores, tmp_path):
    out = tmp_path / "decay"
    decay = ["decay", str(stores["spec"]), "--out", str(out), "--spectrum-only", "--format", "png"]
    for _ in range(2):  # the second run replaces only what the first one wrote
        res = CliRunner().invoke(_app(), decay)
        assert res.exit_code == 0, res.output
    plot = ["plot", str(out), "--out", str(out), "--format", "png"]  # decay's own figures, redrawn
    assert CliRunner().invoke(_app(), plot).exit_code == 0
    (out / "density.png").write_bytes(b"edited by hand")  # now the user's
    line = _one_error_line(CliRunner().invoke(_app(), decay))
    assert "already holds density.png, which gradspec did not write (or which changed since)" in line
    assert (out / "density.png").read_bytes() == b"edited by hand"
    line = _one_error_line(CliRunner().invoke(_app(), plot))
    assert "density.png" in line


def test_plot_refuses_to_write_over_a_users_figures(stores, tmp_path):
    out = tmp_path / "d"
    res = CliRunner().invoke(
        _app(), ["decay", str(stores["spec"]), "--out", str(out), "--no-plots", "--spectrum-only"]
    )
    assert res.exit_code == 0, res.output
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "spectrum.png").write_bytes(b"my png")
    (figs / "overlay_spectrum.pdf").write_bytes(b"my pdf")
    line = _one_error_line(CliRunner().invoke(_app(), ["plot", str(out), "--out", str(figs)]))
    assert "already holds spectrum.png, which gradspec did not write" in line
    overlay = ["plot", str(out), str(stores["spec"]), "--out", str(figs), "-l", "a", "-l", "b"]
    line = _one_error_line(CliRunner().invoke(_app(), overlay))
    assert "already holds overlay_spectrum.pdf" in line
    assert (figs / "spectrum.png").read_bytes() == b"my png"
    assert (figs / "overlay_spectrum.pdf").read_bytes() == b"my pdf"
    res = CliRunner().invoke(_app(), [*overlay, "--overwrite"])
    assert res.exit_code == 0, res.output
    assert (figs / "overlay_spectrum.pdf").read_bytes() != b"my pdf"
    assert (figs / "spectrum.png").read_bytes() == b"my png"  # not a name the overlay writes


def test_a_link_where_a_figure_would_go_is_refused_even_with_overwrite(stores, tmp_path):
    elsewhere = tmp_path / "precious.png"
    elsewhere.write_bytes(b"precious")
    out = tmp_path / "d"
    out.mkdir()
    (out / "spectrum.png").symlink_to(elsewhere)
    decay = ["decay", str(stores["spec"]), "--out", str(out), "--spectrum-only", "--overwrite"]
    line = _one_error_line(CliRunner().invoke(_app(), decay))
    assert "spectrum.png as a link or directory" in line
    assert elsewhere.read_bytes() == b"precious"


def test_the_checked_figure_names_cover_every_figure_decay_and_plot_write(stores, tmp_path):
    """REPORT_FIGURES / OVERLAY_FIGURES are checked before the analysis: every figure the
    library draws must be among them (a new figure not listed would bypass the check)."""
    from cli.decay import OVERLAY_FIGURES, REPORT_FIGURES

    out = tmp_path / "full"
    res = CliRunner().invoke(_app(), ["decay", str(stores["spec"]), "--out", str(out), "--heldout-rows",
                                      "40:60", "--format", "svg"])
    assert res.exit_code == 0, res.output
    assert {p.stem for p in out.glob("*.svg")} == set(REPORT_FIGURES)
    figs = tmp_path / "figs"
    res = CliRunner().invoke(_app(), ["plot", str(out), str(out / "report.json"), "--out", str(figs),
                                      "-l", "a", "-l", "b", "--format", "svg"])
    assert res.exit_code == 0, res.output
    assert {p.stem for p in figs.glob("*.svg")} == set(OVERLAY_FIGURES)


def test_decay_shows_its_passes_over_the_rows_on_stderr_unless_no_progress(stores, tmp_path):
    """Issue 34 §6: decay ran 57 s on the main store with no output; the project's convention is a
    bar on stderr, switchable off (pca's, collect's)."""
    args = ["decay", str(stores["spec"]), "--no-plots", "--heldout-rows", "40:60"]
    res = CliRunner().invoke(_app(), [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "G_k: rows onto V" in res.stderr and "col/s" in res.stderr, res.stderr
    assert "G_k: rows onto V" not in res.stdout
    res = CliRunner().invoke(_app(), [*args, "--out", str(tmp_path / "b"), "--no-progress"])
    assert res.exit_code == 0 and "G_k: rows onto V" not in res.output, res.output


def test_a_narrower_rerun_leaves_no_figure_of_the_analysis_before(stores, tmp_path):
    """decay --spectrum-only into a folder of a full analysis removed none of its G_k figures
    (found by review: lipschitz, step_error and explained_variance stayed, still recorded); a
    file the user put there is kept."""
    out = tmp_path / "decay"
    runner = CliRunner()
    res = runner.invoke(_app(), ["decay", str(stores["spec"]), "--out", str(out), "--format", "png"])
    assert res.exit_code == 0, res.output
    assert (out / "lipschitz.png").is_file()
    (out / "notes.png").write_bytes(b"mine")
    res = runner.invoke(_app(), ["decay", str(stores["spec"]), "--out", str(out), "--format", "png", "--spectrum-only"])
    assert res.exit_code == 0, res.output
    assert not (out / "lipschitz.png").exists() and (out / "spectrum.png").is_file()
    assert (out / "notes.png").read_bytes() == b"mine"
    assert "lipschitz.png" not in json.loads((out / ".gradspec-written.json").read_text())["files"]


def test_the_console_shows_the_reports_notes(stores, tmp_path):
    out, spec = tmp_path / "d", tmp_path / "centred.zarr"
    linalg.pca(source=str(stores["grads"]), k=10, rows=slice(0, 40), center=True, out=str(spec))
    res = CliRunner().invoke(_app(), ["decay", str(spec), "--out", str(out), "--no-plots"])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["notes"], report["notes"]
    for line in report["notes"]:
        assert f"note: {line}" in res.output


def test_a_changed_byte_in_report_json_is_damage(stores, tmp_path):
    """report.json carries a digest of its values (found by review: one flipped bit read the
    spectrum's decay as c = 3.083 for 1.083 on the page and in plot, exit 0)."""
    from gradspec.spectrum import read_report

    out = tmp_path / "d"
    res = CliRunner().invoke(_app(), ["decay", str(stores["spec"]), "--out", str(out), "--no-plots"])
    assert res.exit_code == 0, res.output
    path = out / "report.json"
    good = read_report(path)
    assert "digest" not in good
    text = path.read_text()
    c = f'"c": {good["spectrum"]["fit_singular"]["c"]!r}'
    assert c in text
    path.write_text(text.replace(c, c.replace('"c": ', '"c": 2', 1), 1))
    with pytest.raises(ValueError, match="is damaged: its values do not match the digest"):
        read_report(path)
    res = CliRunner().invoke(_app(), ["plot", str(out), "--out", str(tmp_path / "f")])
    assert res.exit_code != 0 and "damaged" in res.output
