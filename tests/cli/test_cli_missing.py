"""Issue 25: the command line fits and predicts the Gaussian mixture on a file with missing
values (empty cells); models that cannot take them still refuse with today's error."""

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from fedlatent.cli import app

runner = CliRunner()


def _file(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"site": np.repeat(["s0", "s1", "s2"], 30)})
    df["a"] = rng.normal(size=len(df)) + 3 * (df["site"] == "s1")
    df["b"] = rng.normal(size=len(df))
    df["y"] = df["a"] + rng.normal(size=len(df))
    df.loc[rng.random(len(df)) < 0.2, "b"] = np.nan
    df.loc[df["site"] == "s2", "a"] = np.nan  # a site without column a
    path = tmp_path / "d.csv"
    df.to_csv(path, index=False)
    return path, df


def test_gmm_fit_and_predict_with_empty_cells(tmp_path):
    path, df = _file(tmp_path)
    res = runner.invoke(app, ["fit", "gmm", "-k", "2", "--data", str(path), "--client", "site",
                              "--features", "a,b", "--out", str(tmp_path / "m"),
                              "--max-rounds", "5"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "p.csv"
    res = runner.invoke(app, ["predict", "--model", str(tmp_path / "m"), "--data", str(path),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    pred = pd.read_csv(out)
    assert len(pred) == len(df)
    assert set(pred.iloc[:, -1].unique()) <= {0, 1}


def test_lcr_fit_refuses_empty_cells(tmp_path):
    path, _ = _file(tmp_path)
    res = runner.invoke(app, ["fit", "lcr", "--target", "y", "--data", str(path), "--client",
                              "site", "--features", "a,b", "--out", str(tmp_path / "m")])
    assert res.exit_code == 2
    assert "client 's0': column 'b' has" in res.output and "NaN values; drop or impute them " \
        "before fitting" in res.output
