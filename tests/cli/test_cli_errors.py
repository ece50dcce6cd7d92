"""Every error a user can cause: one line ``error: ...`` on stderr, a non-zero exit code, no
traceback; warnings as one line ``warning: ...``."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedlatent.cli import app
from fedlatent.engine.contract import registry

runner = CliRunner()


@pytest.fixture
def good_csv(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(60, 2)), columns=["a", "b"])
    df["site"] = np.repeat(["s0", "s1", "s2"], 20)
    path = tmp_path / "good.csv"
    df.to_csv(path, index=False)
    return path


def fit_gmm(data, *extra):
    return ["fit", "gmm", "--data", str(data), "--client", "site", "-k", "2", *extra,
            "--out", "never-written"]


def missing_file(tmp_path, good):
    return fit_gmm(tmp_path / "nope.csv"), "data file", "does not exist"


def empty_file(tmp_path, good):
    (tmp_path / "x.csv").write_bytes(b"")
    return fit_gmm(tmp_path / "x.csv"), "x.csv is empty", ""


def corrupt_parquet(tmp_path, good):
    (tmp_path / "x.parquet").write_bytes(np.random.default_rng(0).bytes(2000))
    return fit_gmm(tmp_path / "x.parquet"), "cannot read", "as a Parquet file"


def binary_csv(tmp_path, good):
    (tmp_path / "x.csv").write_bytes(np.random.default_rng(1).bytes(2000) + b"\x00")
    return fit_gmm(tmp_path / "x.csv"), "cannot read", "binary data"


def header_only_csv(tmp_path, good):
    (tmp_path / "x.csv").write_text("a,b,site\n")
    return fit_gmm(tmp_path / "x.csv"), "has no rows", ""


def unknown_model(tmp_path, good):
    return ["fit", "nope", "--data", str(good)], "unknown model 'nope'; registered:", "gmm"


def unknown_column(tmp_path, good):
    return fit_gmm(good, "--features", "a,zz"), "feature column 'zz' is not in the data", ""


def unknown_client_column(tmp_path, good):
    args = fit_gmm(good)
    args[args.index("site")] = "where"
    return args, "client column 'where' is not in the data", ""


def missing_option(tmp_path, good):
    return ["fit", "gmm", "--data", str(good), "--client", "site"], "Missing option", "--help"


def not_a_model(tmp_path, good):
    return (["predict", "--model", str(good), "--data", str(good), "--out", "p.csv"],
            "is not a fedlatent model", "")


def model_json_without_class(tmp_path, good):
    (tmp_path / "model.json").write_text(json.dumps({"params": {}}))
    return (["score", "--model", str(tmp_path), "--data", str(good)],
            "is not a fedlatent model", "names no estimator class")


def model_json_of_another_class(tmp_path, good):
    (tmp_path / "model.json").write_text(json.dumps({"class": "Pickle"}))
    return (["score", "--model", str(tmp_path / "model.json"), "--data", str(good)],
            "holds a 'Pickle', not a registered fedlatent estimator", "gmm")


def model_not_json(tmp_path, good):
    (tmp_path / "model.json").write_bytes(b"\x80\x04garbage")
    return (["predict", "--model", str(tmp_path), "--data", str(good), "--out", "p.csv"],
            "is not a fedlatent model", "")


def unknown_experiment(tmp_path, good):
    return ["experiment", "nope"], "unknown experiment 'nope'; available:", "fedem-toy"


CASES = [missing_file, empty_file, corrupt_parquet, binary_csv, header_only_csv, unknown_model,
         unknown_column, unknown_client_column, missing_option, not_a_model,
         model_json_without_class, model_json_of_another_class, model_not_json,
         unknown_experiment]


def assert_one_error_line(res, *fragments, code=2):
    assert res.exit_code == code, (res.exit_code, res.output)
    assert "Traceback" not in res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_user_error_is_one_line(case, tmp_path, good_csv, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, *fragments = case(tmp_path, good_csv)
    res = runner.invoke(app, args)
    assert_one_error_line(res, *fragments)
    assert not (tmp_path / "never-written").exists()


@pytest.mark.parametrize(
    "param, message",
    [
        ("colour=1", "--param colour: toy (ToyMixture) has no parameter 'colour'; its "
                     "parameters: n_components, covariance_type"),
        ("n_components", "--param expects NAME=VALUE, got 'n_components'"),
        # the estimator's refusal names the option, not the Python parameter
        (["--components", "0"], "error: --components must be an integer >= 1, got 0"),
        ("covariance_type=round", "error: --covariance-type must be one of ('full', 'tied', "
                                  "'diag', 'spherical'), got 'round'"),
    ],
)
def test_bad_param_is_one_line(toy_estimator, param, message, good_csv, tmp_path):
    res = runner.invoke(app, ["fit", "toy", "--data", str(good_csv), "--client", "site",
                              *(param if isinstance(param, list) else ["--param", param]),
                              "--out", str(tmp_path / "o")])
    assert_one_error_line(res, message)
    assert not (tmp_path / "o").exists()


def test_generic_fit_asks_for_the_columns_its_model_needs(toy_estimator, monkeypatch, good_csv,
                                                         tmp_path):
    supervised = dataclasses.replace(toy_estimator, target=True)
    monkeypatch.setitem(registry._ESTIMATORS, "toy", supervised)
    res = runner.invoke(app, ["fit", "toy", "--data", str(good_csv), "--client", "site",
                              "--out", str(tmp_path / "o")])
    assert_one_error_line(res, "fit toy needs --target COLUMN")


def test_unexpected_error_is_one_line_with_the_debug_hint(monkeypatch, good_csv):
    def boom(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(pd, "read_csv", boom)
    res = runner.invoke(app, fit_gmm(good_csv))
    assert_one_error_line(res, "unexpected RuntimeError: boom second line", "FEDLATENT_DEBUG=1",
                          code=1)
    monkeypatch.setenv("FEDLATENT_DEBUG", "1")
    res = runner.invoke(app, fit_gmm(good_csv))
    assert isinstance(res.exception, RuntimeError) and str(res.exception) == "boom\nsecond line"


def test_convergence_warning_is_one_line(good_csv, tmp_path):
    res = runner.invoke(app, ["fit", "gmm", "--data", str(good_csv), "--client", "site", "-k",
                              "2", "--max-rounds", "2", "--tol", "0", "--out",
                              str(tmp_path / "o"), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() and all(
        ln.startswith("warning: ConvergenceWarning: ") for ln in res.stderr.splitlines()
    ), res.stderr


@pytest.mark.usefixtures("saturation_rule_off")
def test_deprecated_max_iter_still_works_with_a_warning(tmp_path):
    import fedlatent as fl

    fd = fl.datasets.make_synthhlcr(n_agents=4, n_entities=4, entities_per_agent=2,
                                    events_per_entity=8, n_clusters=2, n_features=2,
                                    sigma=0.3, random_state=0)
    fd.to_pandas(client="agent").to_csv(tmp_path / "e.csv", index=False)
    res = runner.invoke(app, ["fit", "hlcr", "--data", str(tmp_path / "e.csv"), "--client",
                              "agent", "--entity", "entity", "--target", "y", "-k", "2",
                              "--max-iter", "3", "--out", str(tmp_path / "o")])
    assert ("warning: FutureWarning: --max-iter is deprecated and will be removed in the next "
            "release; use --max-rounds") in res.stderr
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o" / "model.json").read_text())["fitted"]["n_iter_"] <= 3
