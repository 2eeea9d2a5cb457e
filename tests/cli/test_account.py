"""`gradspec account` through typer's CliRunner."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cli.main import app
from gradspec.privacy import compute_epsilon, default_delta

runner = CliRunner()
Q = 256 / 60000


def _account(*args: str):
    return runner.invoke(app, ["account", *args])


def test_epsilon_matches_compute_epsilon_json():
    result = _account(
        "--noise-multiplier",
        "1.1",
        "--q",
        repr(Q),
        "--epochs",
        "60",
        "--delta",
        "1e-5",
        "--method",
        "rdp",
        "--json",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    steps = math.ceil(60 / Q)
    assert out["steps"] == steps
    expected = compute_epsilon(
        noise_multiplier=1.1, sample_rate=Q, steps=steps, delta=1e-5, method="rdp"
    )
    assert out["epsilon"] == expected
    assert out["epsilon"] == pytest.approx(2.5967, abs=1e-4)  # pinned in tests/privacy


def test_table_output_with_batch_size_and_default_delta():
    result = _account(
        "--noise-multiplier",
        "2",
        "--batch-size",
        "500",
        "--n",
        "10000",
        "--steps",
        "300",
        "--method",
        "rdp-classic",
    )
    assert result.exit_code == 0, result.output
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    expected = compute_epsilon(
        noise_multiplier=2.0,
        sample_rate=0.05,
        steps=300,
        delta=default_delta(10000),
        method="rdp-classic",
    )
    assert float(lines["epsilon"]) == pytest.approx(expected, rel=1e-5)  # printed to 6 digits
    assert float(lines["delta"]) == pytest.approx(10000**-1.1, rel=1e-3)
    assert lines["steps"].startswith("300 ")


def test_shuffle_epochs_count_whole_epochs():
    result = _account(
        "--noise-multiplier",
        "3",
        "--batch-size",
        "100",
        "--n",
        "1000",
        "--epochs",
        "4",
        "--sampling",
        "shuffle",
        "--delta",
        "1e-5",
        "--json",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["steps"] == 40 and out["epochs"] == 4
    assert out["epsilon"] == compute_epsilon(
        noise_multiplier=3.0, sample_rate=0.1, steps=40, delta=1e-5, sampling="shuffle"
    )


def test_sigma_is_a_deprecated_alias_of_noise_multiplier():
    args = ["1.1", "--q", repr(Q), "--epochs", "60", "--delta", "1e-5", "--method", "rdp"]
    new, old = _account("--noise-multiplier", *args), _account("--sigma", *args)
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert old.stdout == new.stdout and "noise multiplier  1.1\n" in new.stdout
    assert "sigma" not in new.stdout and new.stderr == ""
    assert old.stderr.strip() == ("warning: --sigma is deprecated, use --noise-multiplier "
                                  "(sigma means singular values in gradspec)")
    both = _account("--noise-multiplier", "1", "--sigma", *args)
    assert both.exit_code != 0 and "give --noise-multiplier only" in both.stderr


def test_target_epsilon_prints_a_noise_multiplier_that_meets_it():
    result = _account(
        "--epsilon",
        "3",
        "--batch-size",
        "256",
        "--n",
        "60000",
        "--steps",
        "2000",
        "--method",
        "rdp",
        "--json",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    run = {
        "sample_rate": 256 / 60000,
        "steps": 2000,
        "delta": default_delta(60000),
        "method": "rdp",
    }
    eps = compute_epsilon(noise_multiplier=out["noise_multiplier"], **run)
    assert 3 - 1e-3 <= eps <= 3
    assert out["epsilon"] == eps and out["target_epsilon"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--q", "0.01", "--steps", "10", "--delta", "1e-5"], "exactly one of --noise-multiplier"),
        (
            ["--noise-multiplier", "1", "--epsilon", "2", "--q", "0.01", "--steps", "10", "--delta", "1e-5"],
            "exactly one of --noise-multiplier",
        ),
        (
            ["--noise-multiplier", "1", "--q", "1.5", "--steps", "10", "--delta", "1e-5"],
            "--q must be in (0, 1]",
        ),
        (["--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5"], "give the sample rate"),
        (["--noise-multiplier", "1", "--q", "0.01", "--delta", "1e-5"], "exactly one of --steps or --epochs"),
        (["--noise-multiplier", "1", "--q", "0.01", "--steps", "10"], "give --delta, or --n"),
        (
            ["--noise-multiplier", "1", "--q", "0.01", "--steps", "10", "--delta", "1e-5", "--method", "gdp"],
            "unknown accounting method 'gdp'",
        ),
        (
            ["--noise-multiplier", "-1", "--q", "0.01", "--steps", "10", "--delta", "1e-5"],
            "noise_multiplier must be finite and >= 0",
        ),
        (["--noise-multiplier", "1", "--q", "0.01", "--steps", "0", "--delta", "1e-5"], "steps must be >= 1"),
        (
            ["--noise-multiplier", "1", "--q", "0.01", "--steps", "10", "--delta", "3"],
            "delta must be in (0, 1)",
        ),
        (
            ["--epsilon", "-1", "--q", "0.01", "--steps", "10", "--delta", "1e-5"],
            "target_epsilon must be finite and > 0",
        ),
        (  # PLD: refused before allocating (was: 2.21 TiB allocation, a traceback; 10^9: OOM-killed)
            ["--noise-multiplier", "1", "--q", "0.01", "--steps", "1000000000000", "--delta", "1e-5"],
            "use method 'rdp' (--method rdp), which answers any number of steps",
        ),
    ],
    ids=[
        "neither",
        "both",
        "q",
        "no-q",
        "no-steps",
        "no-delta",
        "method",
        "sigma",
        "steps",
        "delta",
        "target",
        "pld-steps-huge",
    ],
)
def test_bad_input_is_one_error_line(args, message):
    result = _account(*args)
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.output


def test_importing_the_command_does_not_import_the_accounting_engine():
    code = "import sys, cli.account; print('dp_accounting' in sys.modules, 'gradspec.privacy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("steps", [1, 3])
def test_shuffle_account_counts_epochs_as_the_trainer_runs_them(tmp_path, steps):
    """B = 70 of n = 120, shuffled: the trainer runs n // B = 1 batch per epoch (the
    remainder dropped), so every step is an epoch; ``account`` with --batch-size/--n must
    count the same epochs (q = B / n = 0.58 would say round(1/q) = 2 steps per epoch and
    report half the epochs, so a smaller epsilon than the run has)."""
    from gradspec.collect import collect
    from gradspec.train import TrainConfig

    opts = dict(n=120, n_eval=20, d=8, r=2)
    cfg = TrainConfig(task="lowrank", task_options=opts, steps=steps, batch_size=70, noise_multiplier=3.0,
                      sampling="shuffle", delta=1e-5, accounting="rdp", eval_every=0, microbatch=None)
    run = collect(cfg, out=tmp_path / "run", write_store=False)
    result = _account("--noise-multiplier", "3", "--batch-size", "70", "--n", "120", "--steps", str(steps),
                      "--sampling", "shuffle", "--delta", "1e-5", "--method", "rdp", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["epochs"] == steps and out["sample_rate"] == 1.0
    assert out["epsilon"] == pytest.approx(run.epsilon, rel=1e-9)
