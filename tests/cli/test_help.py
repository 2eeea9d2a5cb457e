"""`--help` is readable at 80 columns: no line wider, and every option's name printed whole
(rich's panels cut them: ``--noise-multipli…``; issue 25)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
COMMANDS = ["collect", "info", "account", "pca", "decay", "plot", "report", "retrain"]


def _help(*args: str, columns: int = 80) -> str:
    res = runner.invoke(app, [*args, "--help"], env={"COLUMNS": str(columns)}, terminal_width=columns)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_and_names_every_option_whole(command):
    text = _help(command)
    assert max(len(line) for line in text.splitlines()) <= 80
    params = typer.main.get_command(app).commands[command].params
    options = [p for p in params if p.param_type_name == "option" and not p.hidden]
    names = [o for p in options for o in (*p.opts, *p.secondary_opts)]
    assert len(names) > 2
    words = set(text.replace(",", " ").split())
    missing = [n for n in names if n not in words]
    assert not missing, f"{command} --help does not show {missing} whole"


def test_top_level_help_gives_each_command_its_whole_summary():
    text = _help()
    assert max(len(line) for line in text.splitlines()) <= 80
    body = text.split("\n", 1)[1]  # after the usage line ("COMMAND [ARGS]...")
    assert "..." not in body and "…" not in body
    for command in COMMANDS:
        assert f"  {command} " in text
