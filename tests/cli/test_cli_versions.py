"""The command line on every typer the project allows (issue 19): typer < 0.26 runs on the click
package, typer >= 0.26 on its own copy (typer._click) and installs no click. The CLI therefore
never imports click, builds every parameter through typer and lets typer's Exit through.

The failures of issue 19 show only with typer >= 0.26, which the test venv does not have (flwr
pins typer 0.20.1): .ci/plain_install runs every --help and the README quickstart on the newest
and the oldest typer. These tests check, on the typer installed here, the invariants that keep
the CLI independent of which click is underneath.
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.core import TyperArgument, TyperOption
from typer.testing import CliRunner

import fedlatent
from fedlatent.cli import app
from fedlatent.cli.common import user_errors

runner = CliRunner()
PACKAGE = Path(fedlatent.__file__).parent
SMOKE = Path(__file__).resolve().parents[2] / ".ci" / "cli_smoke.py"


def _smoke():
    """.ci/cli_smoke.py (what CI runs in the plain venv) as a module."""
    spec = importlib.util.spec_from_file_location("cli_smoke", SMOKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_no_module_imports_click():
    """click is no dependency of fedlatent (and absent under typer >= 0.26)."""
    found = sorted(f"{p.relative_to(PACKAGE)}: {name}" for p in PACKAGE.rglob("*.py")
                   for name in _imports(p) if name.split(".")[0] == "click")
    assert found == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_cli_names_no_private_typer_attribute():
    """Only typer's public names: no ``typer._click``, no ``typer.x._y`` (dunders are fine)."""
    found = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.name}: {name}" for name in _imports(path)
                  if name.split(".")[0] == "typer" and any(map(_private, name.split(".")))]
        for node in ast.walk(tree):
            chain, inner = [], node
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "typer" and any(map(_private, chain)):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_every_parameter_is_built_by_typer():
    """A click.Option added to a typer command failed on typer 0.29 ('Context' object has no
    attribute '_param_default_explicit'): every parameter of every command is typer's."""
    commands = _smoke().commands()
    odd = [f"{' '.join(path)} {p.name}: {type(p).__module__}.{type(p).__name__}"
           for path, cmd in commands for p in cmd.params
           if not isinstance(p, TyperOption | TyperArgument)]
    assert odd == []
    assert {("fit", "gmm"), ("fit", "lcr"), ("predict",), ("flower", "local")} <= {
        path for path, _ in commands}
    fit_gmm = dict(commands)[("fit", "gmm")]
    assert [p.opts for p in fit_gmm.params if p.name.startswith("categorical")] == [
        ["--categorical"], ["--categorical-columns"]]


def test_every_help_exits_0():
    """``fedlatent --help`` and ``--help`` of every command and subcommand (listed from the
    app) exit 0 with their usage line."""
    failed = []
    for path, _ in _smoke().commands():
        res = runner.invoke(app, [*path, "--help"], prog_name="fedlatent")
        usage = " ".join(["Usage:", "fedlatent", *path])
        if res.exit_code != 0 or usage not in " ".join(res.output.split()):
            failed.append((path, res.exit_code, res.output[-200:]))
    assert failed == []


@pytest.mark.parametrize("code", [0, 3])
def test_exit_passes_through_user_errors(code):
    """typer.Exit (a --help, an exit code) is no 'unexpected Exit' error."""
    with pytest.raises(typer.Exit) as info, user_errors():
        raise typer.Exit(code)
    assert info.value.exit_code == code


def test_usage_error_is_one_line():
    res = runner.invoke(app, ["fit", "gmm", "--bogus"], prog_name="fedlatent")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: No such option")
    assert lines[0].endswith("(see 'fedlatent fit gmm --help')")


@pytest.mark.usefixtures("saturation_rule_off")
def test_categorical_options_reach_the_fit(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"site": np.repeat(["s0", "s1", "s2"], 20),
                       "region": np.tile(["a", "b", "c"], 20), "x": rng.normal(size=60)})
    df.to_csv(tmp_path / "d.csv", index=False)
    args = ["fit", "gmm", "--data", str(tmp_path / "d.csv"), "--client", "site", "-k", "2"]
    res = runner.invoke(app, [*args, "--categorical", "onehot-all", "--categorical-columns",
                              "region", "--out", str(tmp_path / "fit")])
    assert res.exit_code == 0, res.output
    roles = json.loads((tmp_path / "fit" / "roles.json").read_text())
    assert roles["features"] == ["region=a", "region=b", "region=c", "x"]
    assert roles["categorical"]["drop_first"] is False
    res = runner.invoke(app, [*args, "--categorical", "bad", "--out", str(tmp_path / "no")])
    assert res.exit_code == 2 and "Invalid value for '--categorical'" in res.output
    assert not (tmp_path / "no").exists()


def test_readme_quickstart_is_what_ci_runs():
    """.ci/plain_install runs the README's fit, predict and score lines as written."""
    lines = _smoke().quickstart_lines()
    assert [w[:2] for w in lines] == [["fedlatent", "fit"], ["fedlatent", "predict"],
                                      ["fedlatent", "score"]]
    assert lines[0][2:5] == ["gmm", "--data", "data.csv"]
    assert lines[1][lines[1].index("--model") + 1] == "fit/"


def test_python_m_runs_the_cli():
    """``python -m fedlatent.cli`` is the ``fedlatent`` command (no entry-point script needed)."""
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    res = subprocess.run([sys.executable, "-m", "fedlatent.cli", "fit", "--help"], env=env,
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Usage: fedlatent fit" in " ".join(res.stdout.split())
