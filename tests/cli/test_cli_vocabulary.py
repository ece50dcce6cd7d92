"""One command-line vocabulary (issue 26, item 4; issue 41): the options map onto the estimator,
the old spellings warn and still work, ``--version``, ``predict --proba``, help text never cut.
The option table itself (every parameter an option on every command): test_cli_options.py."""

import json

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

import fedlatent
from fedlatent.cli import app
from fedlatent.engine.contract.registry import estimator_names

runner = CliRunner()


def command(*path):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.get_command(typer.Context(cmd), name)
        assert cmd is not None, path
    return cmd


def flags(cmd):
    return {o for p in cmd.params for o in [*p.opts, *p.secondary_opts]}


def test_version_prints_the_package_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.output == f"fedlatent {fedlatent.__version__}\n"


def _mixture_csv(path):
    rng = np.random.default_rng(0)
    frames = []
    for c in range(4):
        f = pd.DataFrame(rng.normal(loc=4 * (c % 2), size=(40, 2)), columns=["a", "b"])
        f["site"] = f"s{c}"
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)
    return path


def _lcr_csv(path):
    rng = np.random.default_rng(0)
    frames = []
    for c in range(4):
        x = rng.uniform(0, 10, size=40)
        y = np.where(rng.random(40) < 0.5, 5 + 2 * x, 15 - x) + rng.normal(size=40)
        frames.append(pd.DataFrame({"x": x, "y": y, "site": f"s{c}"}))
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)
    return path


def _params(out):
    return json.loads((out / "model.json").read_text())["params"]


def test_generic_command_maps_the_shared_options_onto_the_estimator(tmp_path):
    data = _lcr_csv(tmp_path / "d.csv")
    out = tmp_path / "o"
    res = runner.invoke(app, ["fit", "lcr", "--data", str(data), "--client", "site",
                              "--features", "x", "--target", "y", "-k", "2", "--tol", "1e-5",
                              "--participation", "0.5", "--quantize", "8", "--max-rounds", "7",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    # no option deprecated or ignored (7 rounds at tol 1e-5 may leave the fit unconverged: that
    # ConvergenceWarning is the fit's, not the vocabulary's)
    assert [w for w in res.stderr.splitlines()
            if w.startswith("warning:") and "ConvergenceWarning" not in w] == []
    p = _params(out)
    assert (p["n_components"], p["tol"], p["max_rounds"]) == (2, 1e-5, 7)
    assert p["federation"]["participation"] == 0.5
    assert p["federation"]["quantizer"] == {"levels": 8}


def test_deprecated_param_spelling_warns_and_gives_the_same_model(tmp_path):
    data = _lcr_csv(tmp_path / "d.csv")
    base = ["fit", "lcr", "--data", str(data), "--client", "site", "--features", "x",
            "--target", "y", "--max-rounds", "5"]
    new = runner.invoke(app, [*base, "--components", "2", "--out", str(tmp_path / "new")])
    old = runner.invoke(app, [*base, "--param", "n_components=2", "--out", str(tmp_path / "old")])
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert ("warning: FutureWarning: --param n_components= is deprecated and will be removed "
            "in the next release; use --components") in old.stderr.splitlines()
    assert "deprecated" not in new.stderr
    assert _params(tmp_path / "old") == _params(tmp_path / "new")


@pytest.mark.usefixtures("saturation_rule_off")
def test_hlcr_clusters_is_a_deprecated_spelling_of_components(tmp_path):
    fd = fedlatent.datasets.make_synthhlcr(n_agents=6, n_entities=6, entities_per_agent=2,
                                           events_per_entity=10, n_clusters=2, n_features=2,
                                           sigma=0.3, random_state=0)
    data = tmp_path / "e.csv"
    fd.to_pandas(client="agent").to_csv(data, index=False)
    base = ["fit", "hlcr", "--data", str(data), "--client", "agent", "--entity", "entity",
            "--target", "y", "--features", "x0,x1", "--sigma", "0.3", "--max-rounds", "3"]
    new = runner.invoke(app, [*base, "-k", "2", "--tol", "0.5", "--out", str(tmp_path / "n")])
    old = runner.invoke(app, [*base, "--clusters", "2", "--tol", "0.5",
                              "--out", str(tmp_path / "o")])
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert "--clusters is deprecated" in old.stderr and "use --components/-k" in old.stderr
    assert _params(tmp_path / "n")["n_clusters"] == 2
    assert _params(tmp_path / "n")["tol"] == 0.5  # --tol: a shared option hlcr had not
    assert _params(tmp_path / "o") == _params(tmp_path / "n")
    assert "--clusters" not in command("fit", "hlcr").get_help(
        typer.Context(command("fit", "hlcr")))  # the old spelling works, hidden


def test_an_option_the_model_cannot_use_is_not_offered(tmp_path):
    from fedlatent.data.sec_data import make_sec_simulation1

    fd, _ = make_sec_simulation1(n_learners=6, n_samples=25, snr=64.0, random_state=0)
    data = tmp_path / "s.csv"
    fd.to_pandas(client="learner").to_csv(data, index=False)
    base = ["fit", "sec", "--data", str(data), "--client", "learner", "--target", "y",
            "--candidates", "linear", "-k", "2"]
    res = runner.invoke(app, [*base, "--max-rounds", "4", "--out", str(tmp_path / "x")])
    assert res.exit_code == 2  # SEC is one-shot: no rounds to bound
    assert res.stderr.startswith("error: No such option '--max-rounds'")
    assert not (tmp_path / "x").exists()
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert _params(tmp_path / "o")["n_clusters"] == 2


def test_flower_app_shared_options_equal_the_deprecated_json(tmp_path):
    pytest.importorskip("flwr")
    new = runner.invoke(app, ["flower", "app", "gmm", "-k", "2", "--participation", "0.5",
                              "--max-rounds", "7", "--seed", "3", "--min-nodes", "2",
                              "--param", "covariance_type=diag", "--out", str(tmp_path / "n"),
                              "--result-dir", str(tmp_path / "r")])
    old = runner.invoke(app, ["flower", "app", "gmm", "--params",
                              '{"n_components": 2, "max_rounds": 7, "covariance_type": "diag"}',
                              "--federation", '{"participation": 0.5}', "--seed", "3",
                              "--min-nodes", "2", "--out", str(tmp_path / "o"),
                              "--result-dir", str(tmp_path / "r")])
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert "warning" not in new.stderr
    assert "--params JSON is deprecated" in old.stderr
    assert "--federation JSON is deprecated" in old.stderr
    text = (tmp_path / "n" / "pyproject.toml").read_text()
    assert text == (tmp_path / "o" / "pyproject.toml").read_text()
    assert '\\"participation\\": 0.5' in text and '\\"n_components\\": 2' in text


def test_predict_proba_writes_one_column_per_component(tmp_path):
    data = _mixture_csv(tmp_path / "d.csv")
    res = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,b", "-k", "2", "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    plain = tmp_path / "p.csv"
    res = runner.invoke(app, ["predict", "--model", str(tmp_path / "m"), "--data", str(data),
                              "--out", str(plain)])
    assert res.exit_code == 0, res.output
    assert list(pd.read_csv(plain).columns) == ["row", "site", "prediction"]
    out = tmp_path / "pp.csv"
    res = runner.invoke(app, ["predict", "--model", str(tmp_path / "m"), "--data", str(data),
                              "--out", str(out), "--proba"])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out)
    assert list(df.columns) == ["row", "site", "prediction", "proba_0", "proba_1"]
    proba = df[["proba_0", "proba_1"]].to_numpy()
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-9)
    assert (proba.argmax(axis=1) == df["prediction"].to_numpy()).all()
    est = fedlatent.FederatedGaussianMixture.load(tmp_path / "m" / "model")
    raw = pd.read_csv(data)
    np.testing.assert_allclose(proba, est.predict_proba(raw[["a", "b"]].to_numpy()), atol=1e-9)


def test_predict_proba_of_a_model_without_feature_probabilities_is_one_error(tmp_path):
    data = _lcr_csv(tmp_path / "d.csv")
    res = runner.invoke(app, ["fit", "lcr", "--data", str(data), "--client", "site",
                              "--features", "x", "--target", "y", "-k", "2", "--max-rounds", "3",
                              "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["predict", "--model", str(tmp_path / "m"), "--data", str(data),
                              "--out", str(tmp_path / "p.csv"), "--proba"])
    assert res.exit_code == 2
    assert res.stderr.strip() == ("error: --proba: LatentClassRegression has no probabilities "
                                  "of the features alone (predict_proba(X)); leave out --proba")
    assert not (tmp_path / "p.csv").exists()


def _all_commands():
    paths = [(), ("fit",), ("flower",), ("experiment",), ("predict",), ("score",), ("demo",)]
    paths += [("fit", n) for n in estimator_names()]
    paths += [("flower", n) for n in ("local", "app", "partition")]
    paths += [("experiment", "fedem-toy"), ("experiment", "fedem_toy")]
    return paths


def _squeezed(text):
    return "".join(str(text).split())


@pytest.mark.parametrize("path", _all_commands(), ids=lambda p: " ".join(p) or "fedlatent")
def test_help_text_is_never_cut(path):
    res = runner.invoke(app, [*path, "--help"])
    assert res.exit_code == 0, res.output
    assert "…" not in res.output
    shown = _squeezed(res.output)
    cmd = command(*path)
    for param in cmd.params:
        if getattr(param, "help", None) and not param.hidden:
            assert _squeezed(param.help) in shown, (param.name, param.help)
        for opt in [*param.opts, *param.secondary_opts]:
            if not param.hidden:
                assert opt in res.output, opt
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(typer.Context(cmd)):
            sub = cmd.get_command(typer.Context(cmd), name)
            text = sub.short_help or (sub.help or "").strip().split("\n\n")[0]
            assert _squeezed(text) in shown, (name, text)
