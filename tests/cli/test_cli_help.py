"""Every ``--help`` is whole (issue 41): on a wide terminal, each command's help holds every
visible option's and argument's help text and, for a group, every command's description,
never shortened. The test venv has the Flower extra installed (which moves typer to 0.20 and
rich to 14, Flower's pins), so this is the help after ``pip install ".[flower]"``;
.ci/plain_install runs the same check (.ci/cli_smoke.py) on a plain install's newest and oldest
typer."""

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedlatent.cli import app

SMOKE = Path(__file__).resolve().parents[2] / ".ci" / "cli_smoke.py"


def _smoke():
    spec = importlib.util.spec_from_file_location("cli_smoke", SMOKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMOKE_MODULE = _smoke()
COMMANDS = SMOKE_MODULE.commands(contexts=True)


@pytest.mark.parametrize("path, cmd, ctx", COMMANDS, ids=[" ".join(c[0]) or "fedlatent"
                                                          for c in COMMANDS])
def test_every_help_is_whole_on_a_wide_terminal(path, cmd, ctx):
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, [*path, "--help"],
                                                    prog_name="fedlatent")
    assert res.exit_code == 0, res.output
    assert SMOKE_MODULE.cut_help(cmd, res.output, ctx) == []


def test_an_argument_keeps_its_help():
    """``site keygen``'s DIRECTORY: typer 0.20 on click 8.5 dropped an argument's help."""
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["site", "keygen", "--help"])
    assert "Directory to write site-key.pem and site-key.pub into (created if needed)." in \
        " ".join(res.output.split())
    assert "Arguments:" in res.output and "Positional arguments" not in res.output


def test_the_check_finds_a_cut_or_missing_help():
    cmd = COMMANDS[0][1]
    whole = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["--help"]).output
    assert SMOKE_MODULE.cut_help(cmd, whole, COMMANDS[0][2]) == []
    cut = whole.replace("Print the version of fedlatent and exit.", "Print the ver…")
    assert len(SMOKE_MODULE.cut_help(cmd, cut, COMMANDS[0][2])) == 2
