"""Categorical features: ``from_pandas(..., categorical="onehot")`` and ``--categorical onehot``.

The levels are agreed from what each client reports of its column (its distinct labels), never
from rows; new data are encoded with the fit's levels; a text column without ``categorical=``
is refused with a message that names the fix.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.data.categorical import (
    CategoricalEncoding,
    agree_levels,
    categorical_columns,
    client_levels,
)
from fedlatent.data.dataset import DataValidationError

runner = CliRunner()


def table(n: int = 120, seed: int = 0) -> pd.DataFrame:
    """Three sites; 'colour' has a level ('red') only site s2 holds; 'member' is boolean."""
    rng = np.random.default_rng(seed)
    site = np.repeat(["s0", "s1", "s2"], n // 3)
    colour = rng.choice(["blue", "green"], size=n).astype(object)
    colour[site == "s2"] = rng.choice(["blue", "red"], size=(site == "s2").sum())
    member = rng.random(n) < 0.4
    x = rng.normal(size=n)
    effect = {"blue": 0.0, "green": 2.0, "red": -3.0}
    y = 1.0 + 1.5 * x + np.vectorize(effect.get)(colour) + 0.7 * member + 0.05 * rng.normal(
        size=n)
    return pd.DataFrame({"site": site, "colour": colour, "member": member, "x": x, "y": y})


def test_onehot_names_drops_the_reference_level_and_codes_each_row():
    df = table()
    fd = fl.FederatedDataset.from_pandas(df, client="site", target="y", categorical="onehot")
    assert fd.feature_names == ["colour=green", "colour=red", "member=True", "x"]
    assert fd.encoding.levels == {"colour": ("blue", "green", "red"),
                                  "member": ("False", "True")}
    assert fd.encoding.drop_first and fd.encoding.features == ("colour", "member", "x")
    X = fd.to_source_order({c: cd.X for c, cd in fd.items()}, columns=fd.feature_names)
    np.testing.assert_array_equal(X["colour=green"], (df["colour"] == "green").astype(float))
    np.testing.assert_array_equal(X["colour=red"], (df["colour"] == "red").astype(float))
    np.testing.assert_array_equal(X["member=True"], df["member"].astype(float))
    np.testing.assert_array_equal(X["x"], df["x"])
    # the same columns as pandas' own dummy coding with the first level dropped
    ref = pd.get_dummies(df[["colour", "member"]].astype(str), drop_first=True, dtype=float)
    np.testing.assert_array_equal(X[["colour=green", "colour=red", "member=True"]].to_numpy(),
                                  ref.to_numpy())


def test_onehot_all_keeps_every_level_and_rows_sum_to_one():
    fd = fl.FederatedDataset.from_pandas(table(), client="site", features=["colour"],
                                         categorical="onehot-all")
    assert fd.feature_names == ["colour=blue", "colour=green", "colour=red"]
    for _, cd in fd.items():
        np.testing.assert_array_equal(cd.X.sum(axis=1), 1.0)


def test_levels_are_agreed_from_each_clients_reported_labels():
    df = table()
    codes = pd.factorize(df["site"], sort=True)[0]
    ids = np.array(["s0", "s1", "s2"])
    labels = {"colour": df["colour"].astype(str)}
    reports = client_levels(labels, codes, ids)
    # a client reports its distinct labels, sorted: a set, not its rows
    for cid in ids:
        assert reports[cid]["colour"] == sorted(set(df.loc[df["site"] == cid, "colour"]))
    assert reports["s0"]["colour"] == ["blue", "green"]
    assert agree_levels(reports, ["colour"]) == {"colour": ("blue", "green", "red")}
    # a client without 'red' still gets its column (all zeros)
    fd = fl.FederatedDataset.from_pandas(df, client="site", features=["colour"],
                                         categorical="onehot")
    np.testing.assert_array_equal(fd["s0"].X[:, 1], 0.0)


def test_a_mostly_numeric_column_with_a_stray_value_stays_numeric():
    df = table()
    df["x"] = df["x"].astype(object)
    df.loc[5, "x"] = "oops"
    assert categorical_columns(df, ["colour", "member", "x"]) == ["colour", "member"]
    with pytest.raises(DataValidationError, match=r"^client 's0': column 'x' is not numeric "
                       r"\(value 'oops'\); convert it to numbers or leave it out of features$"):
        fl.FederatedDataset.from_pandas(df, client="site", target="y", categorical="onehot")


def test_a_text_column_without_categorical_names_the_fix():
    with pytest.raises(DataValidationError, match=r"^client 's0': column 'colour' is not "
                       r"numeric \(value '(blue|green)'\); convert it to numbers or leave it out "
                       r"of features, or encode its levels as indicator columns with "
                       r"categorical='onehot'$"):
        fl.FederatedDataset.from_pandas(table(), client="site", target="y")


def test_new_data_are_encoded_with_the_training_levels():
    train = fl.FederatedDataset.from_pandas(table(), client="site", target="y",
                                            categorical="onehot")
    new = pd.DataFrame({"site": ["s9", "s9"], "colour": ["green", "blue"],
                        "member": [True, False], "x": [0.5, -1.0], "y": [0.0, 0.0]})
    fd = fl.FederatedDataset.from_pandas(new, client="site", target="y",
                                         categorical=train.encoding)
    assert fd.feature_names == train.feature_names
    np.testing.assert_array_equal(fd["s9"].X, [[1, 0, 1, 0.5], [0, 0, 0, -1.0]])


def test_an_unseen_level_is_an_error_or_all_zeros():
    train = fl.FederatedDataset.from_pandas(table(), client="site", target="y",
                                            categorical="onehot")
    new = pd.DataFrame({"site": ["s9", "s9"], "colour": ["green", "purple"],
                        "member": [True, False], "x": [0.5, -1.0]})
    with pytest.raises(DataValidationError, match=r"^client 's9': column 'colour' has level "
                       r"'purple', unseen when the encoding was agreed \(levels: \['blue', "
                       r"'green', 'red'\]\); pass handle_unknown='ignore' to code it as all "
                       r"zeros, or agree the encoding on data that hold it$"):
        fl.FederatedDataset.from_pandas(new, client="site", categorical=train.encoding)
    fd = fl.FederatedDataset.from_pandas(new, client="site", categorical=train.encoding,
                                         handle_unknown="ignore")
    np.testing.assert_array_equal(fd["s9"].X[:, :2], [[1, 0], [0, 0]])


def test_a_missing_label_is_refused_naming_the_client():
    df = table()
    df.loc[100, "colour"] = None
    with pytest.raises(DataValidationError, match=r"^client 's2': column 'colour' has 1 missing "
                       r"values; give them a level of their own \(e\.g\. "
                       r"df\[col\]\.fillna\('missing'\)\) or drop those rows$"):
        fl.FederatedDataset.from_pandas(df, client="site", target="y", categorical="onehot")


def test_a_bad_mode_is_refused():
    with pytest.raises(DataValidationError, match=r"^categorical must be one of \['onehot', "
                       r"'onehot-all'\] or a CategoricalEncoding"):
        fl.FederatedDataset.from_pandas(table(), client="site", categorical="dummy")


def test_encoding_round_trips_through_json():
    enc = fl.FederatedDataset.from_pandas(table(), client="site", target="y",
                                          categorical="onehot").encoding
    assert CategoricalEncoding.from_json(json.loads(json.dumps(enc.to_json()))) == enc
    with pytest.raises(ValueError, match=r"^not a categorical encoding"):
        CategoricalEncoding.from_json({"levels": {"c": []}, "drop_first": True})


def test_lcr_on_encoded_columns_equals_the_fit_on_dummy_columns():
    """Exactness: the encoded dataset is the dummy-coded one (same numbers, same fit)."""
    df = table()
    fd = fl.FederatedDataset.from_pandas(df, client="site", target="y", categorical="onehot")
    dummies = pd.get_dummies(df[["colour", "member"]].astype(str), drop_first=True, dtype=float)
    dummies.columns = ["colour=green", "colour=red", "member=True"]
    manual = pd.concat([df[["site"]], dummies, df[["x", "y"]]], axis=1)
    fd2 = fl.FederatedDataset.from_pandas(manual, client="site", target="y")
    kw = {"tol": 1e-8, "random_state": 0, "max_rounds": 30}
    a = fl.LatentClassRegression(1, **kw).fit(fd)
    b = fl.LatentClassRegression(1, **kw).fit(fd2)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_allclose(a.coef_[0], [2.0, -3.0, 0.7, 1.5], atol=0.05)


@pytest.fixture
def raw_csv(tmp_path):
    path = tmp_path / "raw.csv"
    table().to_csv(path, index=False)
    return path


def test_cli_fit_with_categorical_onehot_and_predict_with_the_same_levels(raw_csv, tmp_path):
    out = tmp_path / "m"
    res = runner.invoke(app, ["fit", "lcr", "--data", str(raw_csv), "--client", "site",
                              "--target", "y", "--categorical", "onehot", "--out", str(out),
                              "--param", "n_components=1", "--param", "tol=1e-8"])
    assert res.exit_code == 0, res.output
    roles = json.loads((out / "roles.json").read_text())
    assert roles["features"] == ["colour=green", "colour=red", "member=True", "x"]
    assert roles["categorical"]["levels"]["colour"] == ["blue", "green", "red"]
    # predict on a file holding only two of the levels: the fit's columns, the fit's numbers
    new = table(30, seed=5).iloc[:20]
    new = new[new["colour"] != "red"].sample(frac=1.0, random_state=2)
    new_path = tmp_path / "new.csv"
    new.to_csv(new_path, index=False)
    res = runner.invoke(app, ["predict", "--model", str(out), "--data", str(new_path),
                              "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 0, res.output
    pred = pd.read_csv(tmp_path / "p.csv")
    est = fl.LatentClassRegression.load(out / "model")
    want = fl.FederatedDataset.from_pandas(
        pd.read_csv(new_path), client="site", target="y",
        categorical=CategoricalEncoding.from_json(roles["categorical"]))
    np.testing.assert_allclose(pred["prediction"], est.predict_dataset(want).to_numpy(),
                               rtol=1e-12)


def test_cli_text_column_without_the_option_names_the_option(raw_csv, tmp_path):
    res = runner.invoke(app, ["fit", "gmm", "--data", str(raw_csv), "--client", "site",
                              "-k", "2", "--out", str(tmp_path / "m")])
    assert res.exit_code == 2
    assert ("convert it to numbers or leave it out of features, or encode its levels as "
            "indicator columns with --categorical onehot") in res.stderr


def test_cli_fit_hlcr_on_a_raw_file_with_text_columns(tmp_path):
    """features default to every other column, so a raw file's text columns reach the fit: with
    --categorical onehot they are encoded (the issue's 'fit hlcr on a raw file fails')."""
    rng = np.random.default_rng(4)
    n = 90
    df = pd.DataFrame({
        "school_type": np.repeat(["public", "private", "public"], n // 3),  # the agent
        "school": np.repeat([f"sch{k}" for k in range(9)], n // 9),  # the entity
        "gender": rng.choice(["F", "M"], size=n),
        "ses": rng.normal(size=n),
    })
    df["score"] = 2.0 * df["ses"] + np.where(df["gender"] == "F", 1.0, 0.0) + rng.normal(
        scale=0.3, size=n)
    path = tmp_path / "raw.csv"
    df.to_csv(path, index=False)
    out = tmp_path / "m"
    args = ["fit", "hlcr", "--data", str(path), "--client", "school_type", "--entity",
            "school", "--target", "score", "-k", "2", "--max-rounds", "3", "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "--categorical onehot" in res.stderr
    res = runner.invoke(app, [*args, "--categorical", "onehot"])
    assert res.exit_code == 0, res.output
    roles = json.loads((out / "roles.json").read_text())
    assert roles["features"] == ["gender=M", "ses"]


def test_the_fitted_estimator_keeps_the_encoding_through_save_and_load(tmp_path):
    fd = fl.FederatedDataset.from_pandas(table(), client="site", target="y",
                                         categorical="onehot")
    lcr = fl.LatentClassRegression(1, max_rounds=5, random_state=0).fit(fd)
    assert lcr.encoding_ == fd.encoding
    lcr.save(tmp_path / "m")
    back = fl.LatentClassRegression.load(tmp_path / "m")
    assert back.encoding_ == fd.encoding
    new = fl.FederatedDataset.from_pandas(table(12, seed=3), client="site", target="y",
                                          categorical=back.encoding_)
    np.testing.assert_allclose(back.predict_dataset(new).to_numpy(),
                               lcr.predict_dataset(new).to_numpy(), rtol=1e-13)


def test_named_columns_encode_numeric_codes_too():
    df = table()
    df["region"] = np.tile([3, 1, 2], len(df) // 3)
    fd = fl.FederatedDataset.from_pandas(df, client="site", features=["region", "x"],
                                         categorical="onehot", categorical_columns=["region"])
    assert fd.feature_names == ["region=2", "region=3", "x"]
    X = fd.to_source_order({c: cd.X for c, cd in fd.items()}, columns=fd.feature_names)
    np.testing.assert_array_equal(X["region=3"], (df["region"] == 3).astype(float))
    with pytest.raises(DataValidationError, match=r"^categorical column 'zip' is not a feature; "
                       r"features: \['region', 'x'\]$"):
        fl.FederatedDataset.from_pandas(df, client="site", features=["region", "x"],
                                        categorical="onehot", categorical_columns=["zip"])
    with pytest.raises(DataValidationError, match=r"^categorical_columns is given without "
                       r"categorical=; add categorical='onehot'$"):
        fl.FederatedDataset.from_pandas(df, client="site", categorical_columns=["region"])


def test_cli_categorical_columns(raw_csv, tmp_path):
    df = pd.read_csv(raw_csv)
    df["region"] = np.tile([3, 1, 2], len(df) // 3)
    df.to_csv(raw_csv, index=False)
    out = tmp_path / "m"
    res = runner.invoke(app, ["fit", "gmm", "--data", str(raw_csv), "--client", "site",
                              "--features", "region,x", "-k", "2", "--categorical", "onehot",
                              "--categorical-columns", "region", "--out", str(out)])
    assert res.exit_code == 0, res.output
    roles = json.loads((out / "roles.json").read_text())
    assert roles["features"] == ["region=2", "region=3", "x"]
    res = runner.invoke(app, ["predict", "--model", str(out), "--data", str(raw_csv),
                              "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 0, res.output
    assert len(pd.read_csv(tmp_path / "p.csv")) == len(df)
