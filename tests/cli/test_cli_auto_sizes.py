"""Sizes chosen by the estimator from the command line: ``fit gmm -k auto`` (lowest BIC) and
``fit fedgmm --learners auto`` (held-out log-likelihood); a size that is neither a number nor
'auto' is one error line naming the option."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedlatent.cli import app

runner = CliRunner()


@pytest.fixture
def three_blobs(tmp_path):
    rng = np.random.default_rng(0)
    frames = []
    for i in range(6):
        X = rng.normal(size=(80, 2)) + (i % 3) * 5.0
        y = (X[:, 0] + rng.normal(size=80) > (i % 3) * 5.0).astype(int)
        frames.append(pd.DataFrame({"client": f"c{i}", "x1": X[:, 0], "x2": X[:, 1], "y": y}))
    path = tmp_path / "blobs.csv"
    pd.concat(frames).to_csv(path, index=False)
    return path


def test_fit_gmm_k_auto_chooses_the_three_blobs(three_blobs, tmp_path):
    out = tmp_path / "fit"
    r = runner.invoke(app, ["fit", "gmm", "--data", str(three_blobs), "--client", "client",
                            "--features", "x1,x2", "-k", "auto", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "K=3 (full)" in r.output
    meta = json.loads((out / "model.json").read_text())
    sel = meta["selection"]  # the choice and every candidate's BIC are saved with the model
    assert sel["param"] == "n_components" and sel["value"] == 3
    bic = {row["n_components"]: row["bic"] for row in sel["scores"]}
    assert min(bic, key=bic.get) == 3
    p = runner.invoke(app, ["predict", "--model", str(out), "--data", str(three_blobs),
                            "--out", str(tmp_path / "pred.csv")])
    assert p.exit_code == 0, p.output
    assert len(pd.read_csv(tmp_path / "pred.csv")) == 480


@pytest.mark.parametrize("option", ["-k", "--components"])
def test_a_size_that_is_not_a_number_is_one_error_line(three_blobs, option):
    r = runner.invoke(app, ["fit", "gmm", "--data", str(three_blobs), "--client", "client",
                            option, "three", "--out", "never-written"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "error: --components must be a whole number or 'auto', got 'three'")


def test_fit_fedgmm_learners_auto(three_blobs, tmp_path):
    out = tmp_path / "fit"
    r = runner.invoke(app, ["fit", "fedgmm", "--data", str(three_blobs), "--client", "client",
                            "--target", "y", "--input-components", "2", "--learners", "auto",
                            "--max-rounds", "10", "--out", str(out)])
    assert r.exit_code == 0, r.output
    line = next(s for s in r.output.splitlines() if s.startswith("FedGMM:"))
    m2 = int(line.split("M2=")[1].split(",")[0])
    assert line.split("M1=")[1].startswith("2,")
    sel = json.loads((out / "model.json").read_text())["selection"]
    assert sel["param"] == "n_learners" and sel["value"] == m2  # printed = saved choice
    score = {row["n_learners"]: row["heldout_loglik"] for row in sel["scores"]}
    assert len(score) > 1 and max(score, key=score.get) == m2  # highest held-out likelihood
