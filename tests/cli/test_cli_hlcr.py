import json

import numpy as np
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app


def _csv(tmp_path):
    fd = fl.datasets.make_synthhlcr(n_agents=8, n_entities=8, entities_per_agent=3,
                                    events_per_entity=15, n_clusters=2, n_features=3,
                                    sigma=0.3, random_state=0)
    path = tmp_path / "events.csv"
    fd.to_pandas(client="agent").to_csv(path, index=False)
    return path


@pytest.mark.usefixtures("saturation_rule_off")
def test_fit_hlcr_writes_model_and_history(tmp_path):
    path = _csv(tmp_path)
    res = CliRunner().invoke(app, [
        "fit", "hlcr", "--data", str(path), "--client", "agent", "--entity", "entity",
        "--target", "y", "--features", "x0,x1,x2", "--clusters", "2", "--sigma", "0.3",
        "--max-iter", "8", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "HLCR (federated): 8 agents" in res.output
    meta = json.loads((tmp_path / "out" / "model.json").read_text())
    assert meta["class"] == "HLCR" and meta["params"]["n_clusters"] == 2
    est = fl.HLCR.load(tmp_path / "out" / "model")
    assert est.coef_.shape == (2, 3)
    hist = (tmp_path / "out" / "history.csv").read_text().splitlines()
    assert hist[0].split(",")[-2:] == ["log_joint", "train_mse"]
    assert np.isfinite(float(hist[-1].split(",")[-1]))


def test_fit_hlcr_bad_inputs_fail_cleanly(tmp_path):
    path = _csv(tmp_path)
    base = ["fit", "hlcr", "--data", str(path), "--client", "agent", "--target", "y",
            "--clusters", "2", "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(app, base + ["--entity", "nope"])
    assert res.exit_code == 2
    assert "entity column 'nope' is not in the data" in res.output
    res = CliRunner().invoke(app, base + ["--entity", "entity", "--sigma", "0"])
    assert res.exit_code == 2 and "sigma must be a finite number > 0" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.usefixtures("saturation_rule_off")
def test_fit_hlcr_estimates_sigma_and_chooses_k_by_default_words(tmp_path):
    path = _csv(tmp_path)
    res = CliRunner().invoke(app, [
        "fit", "hlcr", "--data", str(path), "--client", "agent", "--entity", "entity",
        "--target", "y", "--features", "x0,x1,x2", "--clusters", "auto", "--max-rounds", "16",
        "--random-intercept", "no", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    est = fl.HLCR.load(tmp_path / "out" / "model")
    assert est.sigma == "auto" and est.n_clusters == "auto"
    assert sorted(est.k_scores_) == [1, 2, 3, 4, 5, 6]
    from fedlatent.models.hlcr.selection import K_TIE

    top = max(est.k_scores_.values())  # the smallest K within K_TIE of the best score
    assert est.n_clusters_ == min(k for k, v in est.k_scores_.items() if v >= top - K_TIE)
    assert est.n_clusters_ == 2  # the generator's K
    assert f"K={est.n_clusters_}, sigma={est.sigma_:.4g}" in res.output
    assert abs(est.sigma_ - 0.3) < 0.1  # the generator's noise sd, estimated


def test_fit_hlcr_refuses_text_where_a_number_or_auto_is_expected(tmp_path):
    path = _csv(tmp_path)
    res = CliRunner().invoke(app, [
        "fit", "hlcr", "--data", str(path), "--client", "agent", "--entity", "entity",
        "--target", "y", "--clusters", "2", "--sigma", "big", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "--sigma must be a number or 'auto', got 'big'" in res.output
    assert not (tmp_path / "o").exists()
