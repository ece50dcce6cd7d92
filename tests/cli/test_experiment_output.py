"""``fedlatent experiment NAME``: a short table on the terminal (the full one in NAME.csv) and
every file the run wrote named (issue 14, section 7)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from fedlatent import experiments
from fedlatent.cli import app
from fedlatent.cli.experiment import SHORT_ROWS


@pytest.fixture
def long_experiment(tmp_path, monkeypatch):
    """An experiment with a 50-row table that writes a figure and a file in a subdirectory."""
    (tmp_path / "longtab.py").write_text(
        '__all__ = ["long_table"]\n\n\n'
        "def long_table(quick=False, out=None, random_state=0):\n"
        '    """A long table."""\n'
        "    from pathlib import Path\n\n"
        "    import pandas as pd\n\n"
        "    out = Path(out)\n"
        "    (out / 'sub').mkdir(parents=True, exist_ok=True)\n"
        "    (out / 'long_table.png').write_bytes(b'png')\n"
        "    (out / 'sub' / 'detail.txt').write_text('x')\n"
        '    return pd.DataFrame({"row": range(50), "value": [i * 0.5 for i in range(50)]})\n'
    )
    monkeypatch.setattr(experiments, "__path__", [*experiments.__path__, str(tmp_path)])
    experiments._index.cache_clear()
    yield
    monkeypatch.undo()
    experiments._index.cache_clear()
    sys.modules.pop("fedlatent.experiments.longtab", None)
    vars(experiments).pop("long_table", None)


def test_prints_a_short_table_and_names_every_file(long_experiment, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "old.txt").write_text("from an earlier run")  # not written by this run
    res = CliRunner().invoke(app, ["experiment", "long_table", "--out", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["row", "value"]
    assert len(lines) == 1 + SHORT_ROWS + 1 + 3
    assert lines[SHORT_ROWS + 1] == (f"... {50 - SHORT_ROWS} more rows: the full table is "
                                     f"{out / 'long_table.csv'}")
    assert lines[-3:] == [f"wrote {out / 'long_table.csv'}", f"wrote {out / 'long_table.png'}",
                          f"wrote {out / 'sub' / 'detail.txt'}"]
    assert len((out / "long_table.csv").read_text().splitlines()) == 51
