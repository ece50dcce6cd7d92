"""``fedlatent fit`` with a site too small for the disclosure rules: the site is left out,
the warning is printed as one line, and the output folder lists it with why."""

import csv

import numpy as np
import pandas as pd
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app


def test_fit_prints_the_warning_and_writes_the_sites_left_out(tmp_path):
    rng = np.random.default_rng(0)
    frames = [pd.DataFrame(rng.normal(size=(120, 2)), columns=["a", "b"]).assign(site=f"s{i}")
              for i in range(3)]
    frames.append(pd.DataFrame(rng.normal(size=(6, 2)), columns=["a", "b"]).assign(site="tiny"))
    path = tmp_path / "data.csv"
    pd.concat(frames).to_csv(path, index=False)
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["fit", "gmm", "--data", str(path), "--client", "site", "-k",
                                   "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    # (the fit at tol="auto" also reaches a component collapsed onto ~5 nearly collinear
    # rows, and says so in a warning of its own: degenerate_components_)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("warning: Sites")]
    assert len(lines) == 1 and "SitesExcludedWarning: 1 of 4 sites left out" in lines[0]
    assert "client 'tiny': the round statistic carries 12 free numbers" in lines[0]
    assert "excluded_clients.csv" in res.output
    with open(out / "excluded_clients.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["client", "reason"] and [r[0] for r in rows[1:]] == ["tiny"]
    assert "Merge sites to at least 19 records" in rows[1][1]
    model = fl.FederatedGaussianMixture.load(out / "model")
    assert list(model.excluded_clients_) == ["tiny"]
