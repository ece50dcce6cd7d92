"""``--weight COLUMN`` (issue 24 item 5): a fit command of the shared vocabulary reads the
data's frequency weights; the fit equals the one on the file with those rows repeated."""

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedlatent.cli import app

runner = CliRunner()


def _fit(tmp_path, df, name, *extra):
    data, out = tmp_path / f"{name}.csv", tmp_path / name
    df.to_csv(data, index=False)
    res = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,b", "-k", "2", "--max-rounds", "5", "--tol", "0",
                              "--seed", "3", "--out", str(out), "--no-progress", *extra])
    assert res.exit_code == 0, res.output
    return np.load(out / "model.npz", allow_pickle=False), res.output


def test_weight_option_equals_repeated_rows(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"site": np.repeat(["s0", "s1", "s2"], 200),
                       "a": rng.normal(size=600), "b": rng.normal(size=600)})
    df["a"] += 3 * (df.index % 2)  # enough rows that no k-means cell is a small block: the
    # start's disclosure rule counts records, so a cell of 2 weighted rows would differ
    df["w"] = rng.integers(1, 4, size=600)
    got, text = _fit(tmp_path, df, "weighted", "--weight", "w")
    want, _ = _fit(tmp_path, df.loc[df.index.repeat(df["w"])].drop(columns="w"), "repeated")
    for k in ("weights_", "means_", "covariances_"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12, err_msg=k)
    assert "2 features" in text  # the weight column is not a feature


def test_weight_option_names_a_bad_column(tmp_path):
    df = pd.DataFrame({"site": ["s0"] * 6, "a": np.arange(6.0), "b": np.ones(6),
                       "w": [1, 1, -2, 1, 1, 1]})
    data = tmp_path / "d.csv"
    df.to_csv(data, index=False)
    res = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,b", "-k", "2", "--weight", "w",
                              "--out", str(tmp_path / "o")])
    assert res.exit_code != 0
    assert "weight column 'w' has negative values at clients 's0'" in res.output


@pytest.mark.parametrize("cmd", [("fit", "lcr"), ("flower", "local", "lcr")])
def test_weight_is_a_shared_option(cmd):
    import typer

    c = typer.main.get_command(app)
    for name in cmd:
        c = c.get_command(typer.Context(c), name)
    assert "--weight" in {o for p in c.params for o in p.opts}
