"""Experiments are discovered: ``fedlatent experiment --help`` lists every one of
``fl.experiments.available()`` with its description, and a new module needs no edit."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent import experiments
from fedlatent.cli import app


def flat(text: str) -> str:
    """Help text without the panels' box characters, on one line."""
    return " ".join("".join(ch for ch in text if not 0x2500 <= ord(ch) <= 0x257F).split())


def test_every_experiment_is_listed_with_its_description():
    res = CliRunner().invoke(app, ["experiment", "--help"])
    assert res.exit_code == 0, res.output
    available = fl.experiments.available()
    assert {"fedem_toy", "hlcr_figure3", "sec_simulation1", "fedgmm_synthetic"} <= set(available)
    for name, description in available.items():
        assert description, name
        # listed as options are spelled, with hyphens; the Python name runs it too
        assert f"{name.replace('_', '-')} {flat(description)}" in flat(res.output)


def test_available_is_every_module_s_all_that_follows_the_contract():
    available = experiments.available()
    assert list(available) == sorted(available)
    assert set(available) <= set(experiments.__all__)
    # helpers listed in a module's __all__ without (quick, out, random_state) are not experiments
    assert "toy_settings" not in available and "make_toy_federation" not in available
    assert available["hlcr_figure3"] == experiments.hlcr_figure3.__doc__.strip().splitlines()[0]


def test_experiments_are_imported_on_first_use():
    code = ("import sys, fedlatent as fl\n"
            "names = fl.experiments.available()\n"
            "print(sorted(m for m in sys.modules if m.startswith('fedlatent.experiments.')))\n"
            "f = fl.experiments.sec_attack\n"
            "print(f.__module__, 'fedlatent.experiments.hlcr' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["[]", "fedlatent.experiments.sec False"]


@pytest.fixture
def extra_module(tmp_path, monkeypatch):
    """A module added to the package (here through its __path__), as experiments/lcr.py will be."""
    (tmp_path / "later.py").write_text(
        '__all__ = ["later_table", "helper"]\n\n\n'
        "def later_table(quick=False, out=None, random_state=0):\n"
        '    """A reproduction added later.\n\n    More text.\n    """\n'
        "    import pandas as pd\n\n"
        '    return pd.DataFrame({"quick": [quick], "seed": [random_state]})\n\n\n'
        "def helper(x):\n"
        '    """Not an experiment."""\n'
    )
    monkeypatch.setattr(experiments, "__path__", [*experiments.__path__, str(tmp_path)])
    experiments._index.cache_clear()
    yield
    monkeypatch.undo()
    experiments._index.cache_clear()
    sys.modules.pop("fedlatent.experiments.later", None)
    vars(experiments).pop("later_table", None)


def test_a_new_module_is_found_with_no_edit(extra_module, tmp_path):
    assert experiments.available()["later_table"] == "A reproduction added later."
    assert "helper" not in experiments.available()
    assert fl.experiments.later_table(quick=True)["quick"].item()
    res = CliRunner().invoke(app, ["experiment", "later_table", "--quick", "--seed", "4",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "later_table.csv").read_text().splitlines() == ["quick,seed",
                                                                           "True,4"]
    res = CliRunner().invoke(app, ["experiment", "later-table", "--quick", "--seed", "5",
                                   "--out", str(tmp_path / "h")])  # as options are spelled
    assert res.exit_code == 0, res.output
    assert (tmp_path / "h" / "later_table.csv").read_text().splitlines() == ["quick,seed",
                                                                           "True,5"]
