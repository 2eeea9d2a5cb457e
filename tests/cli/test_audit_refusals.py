"""Options that were accepted and silently did not do what they said (an audit): the q that
collect prints for a shuffled run, given to `gradspec account`, under-reported ε; --period and
--public-size with a spectrum or random projector were ignored yet recorded as used."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_account_refuses_a_shuffled_q_that_is_not_one_over_the_batches_per_epoch():
    res = runner.invoke(app, ["account", "--noise-multiplier", "1", "--q", "0.15", "--steps", "35",
                              "--sampling", "shuffle"])
    assert res.exit_code != 0 and "n // B" in res.output and "--batch-size and --n" in res.output, res.output
    # what the trainer accounts: n // B = 6 batches an epoch, 6 epochs for 35 steps
    ok = runner.invoke(app, ["account", "--noise-multiplier", "1", "--batch-size", "30", "--n", "200",
                             "--steps", "35", "--sampling", "shuffle", "--delta", "1e-5"])
    exact = runner.invoke(app, ["account", "--noise-multiplier", "1", "--q", str(1 / 6), "--steps", "35",
                                "--sampling", "shuffle", "--delta", "1e-5"])
    assert ok.exit_code == 0 and exact.exit_code == 0, ok.output + exact.output
    eps = [re.search(r"epsilon\s+([0-9.]+)", r.output).group(1) for r in (ok, exact)]
    assert eps[0] == eps[1], (ok.output, exact.output)


def test_public_projector_options_with_a_random_projector_are_refused(tmp_path):
    base = ["retrain", "--out", str(tmp_path / "r"), "--task", "lowrank", "-t", "n=200", "-t", "d=40", "-t", "r=3",
            "--batch-size", "20", "--steps", "2", "--no-progress", "--eval-every", "0", "--no-train-metrics",
            "-a", "rpdp-sgd", "--projector", "random", "-k", "3"]
    for extra in (["--period", "5"], ["--public-size", "50"]):
        res = runner.invoke(app, base + extra)
        assert res.exit_code != 0 and "it would be ignored" in res.output and extra[0] in res.output, res.output
    assert not (tmp_path / "r").exists()


def test_a_shuffled_run_prints_the_q_its_accountant_counted(tmp_path):
    """collect and info printed q = B/n (0.15), which `account --q` refuses; they print 1/(n // B)
    beside it, and that q given to `account` gives the run's epsilon."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["collect", "--out", str(out), "--task", "lowrank", "-t", "n=200", "-t", "d=20",
                              "-t", "r=2", "--batch-size", "30", "--steps", "12", "--sampling", "shuffle",
                              "--noise-multiplier", "1", "--lr", "0.05", "--optimizer", "sgd", "--eval-every", "0",
                              "--no-progress", "--delta", "1e-5"])
    assert res.exit_code == 0, res.output
    printed = re.search(r"q = ([0-9.]+) \(shuffled: 1 / 6 batches an epoch; B / n = 0.15\)", res.output)
    assert printed and float(printed.group(1)) == round(1 / 6, 4), res.output
    info = runner.invoke(app, ["info", str(out / "gradients.zarr")])
    assert info.exit_code == 0 and "q = 0.1667 (shuffled: 1 / 6 batches an epoch; B / n = 0.15)" in info.output, info.output
    eps = re.search(r"epsilon = ([0-9.]+)", res.output).group(1)
    acct = runner.invoke(app, ["account", "--noise-multiplier", "1", "--q", str(1 / 6), "--steps", "12",
                               "--sampling", "shuffle", "--delta", "1e-5"])
    assert acct.exit_code == 0, acct.output
    counted = float(re.search(r"epsilon\s+([0-9.]+)", acct.output).group(1))
    assert f"{counted:.3f}" == eps, (res.output, acct.output)
