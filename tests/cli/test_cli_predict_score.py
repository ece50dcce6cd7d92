"""fit, then predict and score, for every model: the CSV has one row per input row, in the input
order, equal to ``est.predict_dataset`` mapped back; the score is ``est.score_dataset``."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.engine.contract.registry import estimator_by_class_name

# the saturation rule (issue 22) off for this module: its federations' clients are smaller than
# the rule allows, and it tests something else (conftest.py)
pytestmark = pytest.mark.usefixtures("saturation_rule_off_module")

runner = CliRunner()


def gmm_case():
    rng = np.random.default_rng(0)
    frames = []
    for c in (3, 10, 7, 1):  # sorted as text: "1" < "10" < "3" < "7"
        f = pd.DataFrame(rng.normal(loc=4 * (c % 2), size=(30, 2)), columns=["a", "b"])
        f["site"] = c
        frames.append(f)
    df = pd.concat(frames, ignore_index=True)
    return df, df, ["gmm", "--client", "site", "--features", "a,b", "-k", "2",
                    "--max-rounds", "30"]


def fedgmm_case():
    from fedlatent.data.fedgmm_data import make_fedgmm_synthetic

    sp = make_fedgmm_synthetic(4, 80, n_features=2, mean_scale=2.0, random_state=0)
    return sp.train.to_pandas(), sp.test.to_pandas(), [
        "fedgmm", "--client", "client", "--target", "y", "--input-components", "2",
        "--learners", "2", "--max-rounds", "5"]


def hlcr_case():
    fd = fl.datasets.make_synthhlcr(n_agents=6, n_entities=6, entities_per_agent=2,
                                    events_per_entity=10, n_clusters=2, n_features=2,
                                    sigma=0.3, random_state=0)
    df = fd.to_pandas(client="agent")
    return df, df, ["hlcr", "--client", "agent", "--entity", "entity", "--target", "y",
                    "--features", "x0,x1", "--clusters", "2", "--sigma", "0.3",
                    "--max-rounds", "5"]


def sec_case():
    from fedlatent.data.sec_data import make_sec_simulation1

    fd, _ = make_sec_simulation1(n_learners=6, n_samples=25, snr=64.0, random_state=0)
    df = fd.to_pandas(client="learner")
    return df, df, ["sec", "--client", "learner", "--target", "y", "--candidates", "linear",
                    "--clusters", "2"]


def lcr_case():
    rng = np.random.default_rng(0)
    frames = []
    for c in range(5):
        x = rng.uniform(0, 10, size=40)
        line = rng.random(40) < (0.2 + 0.15 * c)
        y = np.where(line, 5 + 2 * x, 15 - x) + rng.normal(size=40)
        frames.append(pd.DataFrame({"x": x, "y": y, "site": f"s{c}"}))
    df = pd.concat(frames, ignore_index=True)
    return df, df, ["lcr", "--client", "site", "--features", "x", "--target", "y",
                    "--param", "n_components=2", "--param", "tol=1e-6", "--max-rounds", "40"]


CASES = {"gmm": gmm_case, "fedgmm": fedgmm_case, "hlcr": hlcr_case, "sec": sec_case,
         "lcr": lcr_case}


def shuffled(df):
    """Rows of the clients interleaved: the file's order is not the dataset's."""
    return df.sample(frac=1.0, random_state=1).reset_index(drop=True)


def expected(model_dir, df):
    """The saved estimator, the dataset of ``df`` with the fit's roles, and each row's
    prediction of ``est.predict_dataset`` in the file's order."""
    meta = json.loads((model_dir / "model.json").read_text())
    roles = json.loads((model_dir / "roles.json").read_text())
    est = estimator_by_class_name(meta["class"]).load(model_dir / "model")
    target = roles["target"] if roles["target"] in df.columns else None
    fd = fl.FederatedDataset.from_pandas(df, client=roles["client"],
                                         features=list(est.feature_names_in_), target=target,
                                         entity=roles["entity"])
    if hasattr(est, "load_client_weights"):  # FedGMM: each client's own weights
        for c in fd.client_ids:
            est.load_client_weights(c, model_dir / "clients" / f"{c}.npz")
    pred = est.predict_dataset(fd)
    if hasattr(pred, "index"):  # a Series in the table's order, indexed by its rows
        assert pred.index.equals(df.index)
        return est, fd, roles["client"], pred.to_numpy()
    order = np.argsort(df[roles["client"]].astype(str).to_numpy(), kind="stable")
    pred = np.asarray(pred)
    in_file_order = np.empty_like(pred)
    in_file_order[order] = pred
    return est, fd, roles["client"], in_file_order


@pytest.fixture(params=list(CASES))
def fitted(request, tmp_path):
    train, test, args = CASES[request.param]()
    train_path, test_path = tmp_path / "train.csv", tmp_path / "test.csv"
    train.to_csv(train_path, index=False)
    test = shuffled(test)
    test.to_csv(test_path, index=False)
    model, data = args[0], args[1:]
    res = runner.invoke(app, ["fit", model, "--data", str(train_path), *data,
                              "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    return tmp_path / "m", test, test_path


def test_predict_writes_one_row_per_input_row_in_input_order(fitted, tmp_path):
    model_dir, df, path = fitted
    res = runner.invoke(app, ["predict", "--model", str(model_dir), "--data", str(path),
                              "--out", str(tmp_path / "pred.csv")])
    assert res.exit_code == 0, res.output
    pred = pd.read_csv(tmp_path / "pred.csv")
    est, fd, client, want = expected(model_dir, df)
    assert pred["row"].tolist() == list(range(len(df)))
    assert pred[client].astype(str).tolist() == df[client].astype(str).tolist()
    if want.dtype.kind == "f":
        np.testing.assert_allclose(pred["prediction"], want, rtol=1e-12)
    else:
        np.testing.assert_array_equal(pred["prediction"], want)


def test_score_prints_score_dataset(fitted):
    model_dir, df, path = fitted
    res = runner.invoke(app, ["score", "--model", str(model_dir / "model.json"),
                              "--data", str(path)])
    assert res.exit_code == 0, res.output
    est, fd, _, _ = expected(model_dir, df)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith(f"{est._score_name}: ")]
    assert len(line) == 1, res.output
    assert float(line[0].split(": ")[1]) == pytest.approx(est.score_dataset(fd), rel=1e-12)


def test_a_registered_model_without_a_command_gets_fit_predict_score(toy_estimator, tmp_path):
    df, _, _ = gmm_case()
    path = tmp_path / "d.parquet"
    shuffled(df).to_parquet(path)
    out = tmp_path / "m"
    res = runner.invoke(app, ["fit", "--help"])
    assert "toy" in res.output and "A toy mixture (tests only)" in res.output
    res = runner.invoke(app, ["fit", "toy", "--data", str(path), "--client", "site",
                              "--features", "a,b", "--param", "n_components=2",
                              "--param", 'covariance_type="diag"', "--max-rounds", "7",
                              "--seed", "3", "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "model.json").read_text())
    assert meta["class"] == "ToyMixture"
    assert {k: meta["params"][k] for k in ("n_components", "covariance_type", "max_rounds",
                                          "random_state")} == {
        "n_components": 2, "covariance_type": "diag", "max_rounds": 7, "random_state": 3}
    assert len(pd.read_csv(out / "history.csv")) <= 7
    df = pd.read_parquet(path)
    res = runner.invoke(app, ["predict", "--model", str(out), "--data", str(path),
                              "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 0, res.output
    est, fd, _, want = expected(out, df)
    np.testing.assert_array_equal(pd.read_csv(tmp_path / "p.csv")["prediction"], want)
    res = runner.invoke(app, ["score", "--model", str(out), "--data", str(path)])
    assert res.exit_code == 0, res.output
    assert f"mean log-likelihood: {est.score_dataset(fd)!r}" in res.stdout


def test_fedgmm_global_and_per_row_scores(tmp_path):
    train, test, args = fedgmm_case()
    train.to_csv(tmp_path / "train.csv", index=False)
    test = shuffled(test)
    test.to_csv(tmp_path / "test.csv", index=False)
    res = runner.invoke(app, ["fit", *args[:1], "--data", str(tmp_path / "train.csv"),
                              *args[1:], "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["predict", "--model", str(tmp_path / "m"), "--data",
                              str(tmp_path / "test.csv"), "--global",
                              "--out", str(tmp_path / "g.csv")])
    assert res.exit_code == 0, res.output
    est = fl.FedGMM.load(tmp_path / "m" / "model")
    X = test[list(est.feature_names_in_)].to_numpy()
    g = pd.read_csv(tmp_path / "g.csv")
    np.testing.assert_array_equal(g["prediction"], est.predict(X))
    np.testing.assert_allclose(g[[f"proba_{c}" for c in est.classes_]], est.predict_proba(X),
                               rtol=1e-10)
    res = runner.invoke(app, ["score", "--model", str(tmp_path / "m"), "--data",
                              str(tmp_path / "test.csv"), "--global",
                              "--out", str(tmp_path / "s.csv")])
    assert res.exit_code == 0, res.output
    s = pd.read_csv(tmp_path / "s.csv")
    want = est.score_samples(X, test["y"].to_numpy())
    np.testing.assert_allclose(s[list(want.columns)], want, rtol=1e-10)
