"""Formulas (issue 43): ``from_pandas(..., formula="y ~ x1 + C(sex) + x1:x2 | age")`` builds the
design a hand-built one equals, with the levels agreed across sites that hold different subsets
of them; the formula is kept with the fitted model (predict on a DataFrame applies it, also
after loading), and ``fedlatent fit --formula`` wires it through the command line."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.data.formula import FormulaDesign
from fedlatent.data.validation import DataValidationError
from fedlatent.engine.faults import FederatedFitError

OFF = fl.DisclosurePolicy.off()


def table(seed=0, n_site=120):
    """Three sites: 'a' holds sex F and M, 'b' M and X, 'c' every level (and ages that move
    the class probabilities)."""
    rng = np.random.default_rng(seed)
    sexes = [["F", "M"], ["M", "X"], ["F", "M", "X"]]
    parts = []
    for s, levels in zip("abc", sexes):
        n = n_site
        df = pd.DataFrame({"site": s, "x1": rng.normal(size=n), "x2": rng.normal(size=n),
                           "sex": rng.choice(levels, size=n), "age": rng.uniform(-2, 2, n),
                           "expo": rng.uniform(0.5, 2.0, n)})
        k = rng.random(n) < 1 / (1 + np.exp(-2 * df["age"]))
        eff = df["sex"].map({"F": 0.0, "M": 0.4, "X": -0.3})
        df["y"] = np.where(k, 1 + df.x1, 4 - df.x1) + eff + 0.5 * df.x1 * df.x2 \
            + 0.5 * rng.normal(size=n)
        df["count"] = rng.poisson(df["expo"] * np.exp(0.3 + 0.5 * df.x1 + eff))
        parts.append(df)
    return pd.concat(parts, ignore_index=True)


def hand_matrix(df, concomitant=True):
    """x1, sex=M, sex=X (F the reference), x1*x2, and age: the design written out."""
    cols = [df.x1, (df.sex == "M").astype(float), (df.sex == "X").astype(float), df.x1 * df.x2]
    return np.column_stack(cols + ([df.age] if concomitant else []))


def by_hand(df, concomitant=True):
    names = ["x1", "sM", "sX", "x1x2"] + (["age"] if concomitant else [])
    X = hand_matrix(df, concomitant)
    data = {s: (X[(df.site == s).to_numpy()], df.y.to_numpy()[(df.site == s).to_numpy()])
            for s in "abc"}
    return fl.FederatedDataset.from_arrays(data, feature_names=names)


def fit_quietly(est, fd):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, progress=False)


def test_the_design_is_the_hand_built_one_with_levels_agreed_across_sites():
    df = table()
    fd = fl.FederatedDataset.from_pandas(df, client="site",
                                         formula="y ~ x1 + C(sex) + x1:x2 | age")
    assert fd.feature_names == ["x1", "C(sex)[T.M]", "C(sex)[T.X]", "x1:x2", "age"]
    assert fd.target_name == "y" and fd.formula.levels == {"sex": ("F", "M", "X")}
    assert fd.formula.concomitant == ("age",) and fd.formula.intercept
    hand = by_hand(df)
    for s in "abc":  # site 'a' has no X, site 'b' no F: the same columns for both
        np.testing.assert_array_equal(fd[s].X, hand[s].X)
        np.testing.assert_array_equal(fd[s].y, hand[s].y)
    assert fd["a"].X[:, 2].sum() == 0 and fd["b"].X[:, 1:3].sum(1).min() == 1


@pytest.mark.parametrize("family", ["gaussian", "poisson"])
def test_a_formula_fit_equals_the_hand_built_design_fit(family):
    df = table()
    kw = dict(random_state=0, max_rounds=40, federation=fl.Federation(disclosure=OFF))
    if family == "gaussian":
        fd = fl.FederatedDataset.from_pandas(df, client="site",
                                             formula="y ~ x1 + C(sex) + x1:x2 | age")
        hand = by_hand(df)
        a = fit_quietly(fl.LatentClassRegression(2, **kw), fd)
        b = fit_quietly(fl.LatentClassRegression(2, concomitant=["age"], **kw), hand)
    else:
        hand = fl.FederatedDataset.from_arrays(
            {s: (np.column_stack([hand_matrix(df[df.site == s], False),
                                  np.log(df.expo[(df.site == s).to_numpy()])]),
                 df["count"].to_numpy(float)[(df.site == s).to_numpy()]) for s in "abc"},
            feature_names=["x1", "sM", "sX", "x1x2", "logexpo"])
        fd = fl.FederatedDataset.from_pandas(df.assign(logexpo=np.log(df.expo)), client="site",
                                             features=["logexpo"],
                                             formula="count ~ x1 + C(sex) + x1:x2")
        a = fit_quietly(fl.LatentClassRegression(2, family="poisson", offset="logexpo", **kw),
                        fd)
        b = fit_quietly(fl.LatentClassRegression(2, family="poisson", offset="logexpo", **kw),
                        hand)
    for name in ("weights_", "coef_", "intercept_"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-10, atol=1e-12,
                                   err_msg=name)
    if family == "gaussian":
        np.testing.assert_allclose(a.concomitant_coef_, b.concomitant_coef_, rtol=1e-10,
                                   atol=1e-12)
    assert a.score(fd) == pytest.approx(b.score(hand), rel=1e-10)


def test_the_formula_is_kept_with_the_model_and_applied_to_data_frames(tmp_path):
    df = table()
    fd = fl.FederatedDataset.from_pandas(df, client="site",
                                         formula="y ~ x1 + C(sex) + x1:x2 | age")
    est = fit_quietly(fl.LatentClassRegression(2, random_state=0, max_rounds=20,
                                               federation=fl.Federation(disclosure=OFF)), fd)
    new = df.iloc[:7].drop(columns=["site"])
    design = hand_matrix(df.iloc[:7])
    np.testing.assert_allclose(est.predict(new), est.predict(design), rtol=1e-12)
    # a DataFrame with the formula's response scores without y
    assert est.score(new) == pytest.approx(est.score(design, new["y"]), rel=1e-12)
    est.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m.json").read_text())
    assert meta["formula"]["formula"] == "y ~ x1 + C(sex) + x1:x2 | age"
    back = fl.LatentClassRegression.load(tmp_path / "m")
    assert isinstance(back.formula_, FormulaDesign)
    np.testing.assert_allclose(back.predict(new), est.predict(new), rtol=1e-12)
    with pytest.raises(DataValidationError, match="column 'sex' has level 'Z', unseen"):
        back.predict(new.assign(sex="Z"))


def test_new_data_are_coded_with_the_training_levels():
    df = table()
    fd = fl.FederatedDataset.from_pandas(df, client="site", formula="y ~ x1 + C(sex)")
    only_m = df[df.sex == "M"].drop(columns="y")
    new = fl.FederatedDataset.from_pandas(only_m, client="site", formula=fd.formula)
    assert new.feature_names == fd.feature_names and new.target_name is None


@pytest.mark.parametrize("formula, message", [
    ("y ~ center(x1)", "'center\\(x1\\)' learns from the data"),
    ("np.log(y) ~ x1", "the response must be one column"),
    ("y ~ x1 | age | x2", "has 3 parts after '~'"),
])
def test_formulas_the_sites_cannot_agree_on_are_refused(formula, message):
    with pytest.raises(DataValidationError, match=message):
        fl.FederatedDataset.from_pandas(table(), client="site", formula=formula)


def test_formula_and_categorical_are_exclusive_and_fit_intercept_must_agree():
    with pytest.raises(DataValidationError, match="either formula= or categorical="):
        fl.FederatedDataset.from_pandas(table(), client="site", formula="y ~ x1",
                                        categorical="onehot")
    fd = fl.FederatedDataset.from_pandas(table(), client="site", formula="y ~ x1 - 1")
    with pytest.raises(ValueError, match="has no intercept but fit_intercept=True"):
        fl.LatentClassRegression(2).fit(fd, progress=False)


def test_a_rare_level_of_a_formula_variable_is_refused_by_the_site():
    """Site 'a' holds two records of level X: it refuses the setup (the rare-level rule) and
    is left out by name; with on_refusal='stop' the fit stops."""
    df = table()
    df.loc[df.index[df.site == "a"][:2], "sex"] = "X"  # site 'a' now holds 2 records of X
    fd = fl.FederatedDataset.from_pandas(df, client="site", formula="y ~ x1 + C(sex)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = fl.LatentClassRegression(2, random_state=0).fit(fd, progress=False)
    assert list(est.excluded_clients_) == ["a"]
    assert "column 'sex' has 1 level(s) held by fewer than" in est.excluded_clients_["a"]
    assert "'X'" not in est.excluded_clients_["a"]  # no level name reaches the server
    with pytest.raises(FederatedFitError,
                       match=r"client 'a': column 'sex' has 1 level\(s\) held by fewer"):
        fl.LatentClassRegression(2, random_state=0, federation=fl.Federation(
            on_refusal="stop")).fit(fd, progress=False)


def test_fit_formula_on_the_command_line(tmp_path):
    from fedlatent.cli import app

    df = table()
    data, out = tmp_path / "d.csv", tmp_path / "m"
    df.to_csv(data, index=False)
    res = CliRunner().invoke(app, [
        "fit", "lcr", "--data", str(data), "--client", "site", "--formula",
        "y ~ x1 + C(sex) + x1:x2 | age", "-k", "2", "--max-rounds", "20", "--seed", "0",
        "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    est = fl.LatentClassRegression.load(out / "model")
    assert est.formula_.formula == "y ~ x1 + C(sex) + x1:x2 | age"
    assert est.concomitant_coef_.shape == (2, 1)
    pred = tmp_path / "p.csv"
    res = CliRunner().invoke(app, ["predict", "--model", str(out), "--data", str(data),
                                   "--out", str(pred)])
    assert res.exit_code == 0, res.output
    got = pd.read_csv(pred)
    fd = fl.FederatedDataset.from_pandas(df, client="site", formula=est.formula_)
    want = est.predict_dataset(fd)
    np.testing.assert_allclose(got["prediction"].to_numpy(), want.to_numpy(), rtol=1e-10)
