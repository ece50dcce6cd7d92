"""One option table per model (issue 41): every constructor parameter of every registered
estimator, and every Federation setting the model can use, is an option of ``fit NAME``,
``flower local NAME``, ``flower app NAME`` and ``site try NAME``, with the same flag, help and
default everywhere; an option the model cannot use is not offered.

The expected flags are derived here from the estimators themselves (their constructor, the
Federation dataclass, their capabilities), not read from the command line's table."""

import dataclasses
import inspect
import json

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

import fedlatent as fl
from fedlatent.cli import app
from fedlatent.engine.contract.registry import estimator_entries, estimator_names, model_class

COMMANDS = [("fit",), ("flower", "local"), ("flower", "app"), ("site", "try")]
#: the parameters whose flag is not their hyphenated name (the documented vocabulary)
COUNTS = ("n_components", "n_clusters", "n_input_components")
RENAMED = {"random_state": "--seed", "verbose": "--progress", "fit_intercept": "--intercept",
           "n_learners": "--learners"}
FEDERATION_RENAMED = {"quantizer": "--quantize", "alpha": "--control-variate-step"}
#: Federation settings that act on rounds (a one-shot model has none)
ROUNDS = {"participation", "step_size", "client_weighting", "quantizer", "control_variates",
          "alpha", "variance_reduction", "batch_size", "track_h", "on_invalid", "acceleration"}


def command(*path):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.get_command(typer.Context(cmd), name)
        assert cmd is not None, path
    return cmd


def flags(cmd):
    return {o for p in cmd.params for o in [*p.opts, *p.secondary_opts]}


def help_by_flag(cmd):
    return {p.opts[0]: p.help for p in cmd.params if not p.hidden}


def parameters(cls):
    return [k for k, p in inspect.signature(cls.__init__).parameters.items()
            if k != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def expected_flags(entry):
    """``(offered, not offered)`` flags of the model, from its estimator alone."""
    params = parameters(entry.cls)
    count = next((c for c in COUNTS if c in params), None)
    want = {"--components" if p == count else RENAMED.get(p, "--" + p.replace("_", "-"))
            for p in params if p != "federation"}
    unwanted = set()
    if "federation" in params:
        caps = entry.cls().capabilities
        try:
            refused = getattr(model_class(entry.name), "acceleration_refusal", "")
        except KeyError:  # an estimator registered without a model of its name
            refused = ""
        for f in dataclasses.fields(fl.Federation):
            if f.name.startswith("_") or f.name == "random_state":  # --seed seeds it
                continue
            flag = FEDERATION_RENAMED.get(f.name, "--" + f.name.replace("_", "-"))
            usable = not (
                (f.name in ROUNDS and "max_rounds" not in params)
                or (f.name.startswith("secagg") or f.name == "secure_aggregation")
                and not caps.secure_aggregation
                or f.name == "privacy" and not caps.differential_privacy
                or f.name == "acceleration" and refused)
            (want if usable else unwanted).add(flag)
        want.add("--min-records")
    if not entry.target:
        unwanted.add("--target")
    if not entry.entity:
        unwanted.add("--entity")
    return want, unwanted


@pytest.mark.parametrize("where", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("name", estimator_names())
def test_every_parameter_of_the_estimator_is_an_option_and_only_those_that_work(name, where):
    want, unwanted = expected_flags(estimator_entries()[name])
    have = flags(command(*where, name))
    assert sorted(want - have) == []
    assert sorted(unwanted & have) == []
    assert "--param" in have


def test_options_a_model_cannot_use_are_named_in_the_issue_and_left_out():
    sec = flags(command("fit", "sec"))
    assert not {"--privacy", "--secure-aggregation", "--max-rounds"} & sec
    assert "--entity" not in flags(command("fit", "lcr")) | flags(command("fit", "lca"))
    assert "--acceleration" not in flags(command("fit", "hlcr"))  # a Gibbs sweep, not EM
    hlcr = flags(command("fit", "hlcr"))
    assert {"--intercept", "--no-intercept"} <= flags(command("fit", "lcr")) & hlcr


@pytest.mark.parametrize("name", estimator_names())
def test_fit_has_the_checkpoint_options_where_the_model_runs_rounds(name):
    entry = estimator_entries()[name]
    rounds = "max_rounds" in parameters(entry.cls)
    have = flags(command("fit", name))
    assert ({"--checkpoint", "--checkpoint-every", "--resume"} <= have) == rounds
    assert not {"--checkpoint"} & flags(command("flower", "local", name))  # it always does
    assert "--progress" in have or not rounds


@pytest.mark.parametrize("name", estimator_names())
def test_the_same_option_has_the_same_help_on_every_command(name):
    helps = [help_by_flag(command(*where, name)) for where in COMMANDS]
    model = {r for r in helps[0] if r not in ("--data", "--client", "--out", "--resume",
                                              "--target", "--entity")}
    for other in helps[1:]:
        assert {f: other[f] for f in model if f in other} == {
            f: helps[0][f] for f in model if f in other}


def test_shared_options_have_one_help_across_models_and_every_option_has_help():
    seen: dict[str, set[str]] = {}
    for name in estimator_names():
        for flag, text in help_by_flag(command("fit", name)).items():
            assert text and text.strip(), (name, flag)
            seen.setdefault(flag, set()).add(text.split(" [default")[0])
    for flag in ("--seed", "--max-rounds", "--tol", "--participation", "--privacy",
                 "--disclosure", "--min-records", "--data", "--client", "--weight"):
        assert len(seen[flag]) == 1, (flag, seen[flag])


@pytest.mark.parametrize("name", estimator_names())
def test_every_default_of_the_estimator_is_shown(name):
    entry = estimator_entries()[name]
    shown = help_by_flag(command("fit", name))
    sig = inspect.signature(entry.cls.__init__).parameters
    count = next((c for c in COUNTS if c in sig), None)
    for p in parameters(entry.cls):
        default = sig[p].default
        if p in ("federation", "random_state") or default is None or isinstance(default, tuple):
            continue
        flag = "--components" if p == count else RENAMED.get(p, "--" + p.replace("_", "-"))
        text = str(default) if not isinstance(default, bool) else ("on" if default else "off")
        assert f"[default: {text}]" in shown[flag], (flag, shown[flag])
    assert "[default: 0]" in shown["--seed"]  # the command line is reproducible by default


def test_a_newly_registered_model_gets_its_table(toy_estimator):
    want, _ = expected_flags(toy_estimator)
    for where in COMMANDS:
        assert sorted(want - flags(command(*where, "toy"))) == []


# ---- the commands of the issue's "done when" ---------------------------------------------------
runner = CliRunner()


def _sec_csv(path):
    from fedlatent.data.sec_data import make_sec_simulation1

    fd, truth = make_sec_simulation1(n_learners=6, n_samples=25, snr=64.0, random_state=0)
    fd.to_pandas(client="learner").to_csv(path, index=False)
    return path


def _params(out):
    return json.loads((out / "model.json").read_text())["params"]


def test_fit_sec_k_auto_lets_sec_choose_k(tmp_path):
    data = _sec_csv(tmp_path / "s.csv")
    res = runner.invoke(app, ["fit", "sec", "--data", str(data), "--client", "learner",
                              "--target", "y", "--candidates", "linear", "-k", "auto",
                              "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert _params(tmp_path / "o")["n_clusters"] is None  # SEC's own choice of K
    assert "K = 2 (penalty)" in res.output  # the simulation's two clusters, chosen


def test_k_auto_where_the_model_does_not_choose_k_is_one_error_line(tmp_path):
    pd.DataFrame({"c": ["a"] * 6 + ["b"] * 6, "v": [0, 1, 2] * 4}).to_csv(tmp_path / "d.csv",
                                                                           index=False)
    res = runner.invoke(app, ["fit", "lca", "--data", str(tmp_path / "d.csv"), "--client", "c",
                              "-k", "auto", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert res.stderr == ("error: --components auto: LatentClassAnalysis does not choose it; "
                          "give a whole number\n")


def _mixture_csv(path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(160, 2)), columns=["a", "b"])
    df["site"] = np.repeat(["s0", "s1", "s2", "s3"], 40)
    df["region"] = np.tile(["north", "south", "east", "west"], 40)
    df.to_csv(path, index=False)
    return path


def test_fit_gmm_takes_param_and_its_own_options_alike(tmp_path):
    data = _mixture_csv(tmp_path / "d.csv")
    base = ["fit", "gmm", "--data", str(data), "--client", "site", "--features", "a,b", "-k", "2",
            "--max-rounds", "5"]
    a = runner.invoke(app, [*base, "--param", "covariance_type=diag", "--param", "n_init=2",
                            "--out", str(tmp_path / "a")])
    b = runner.invoke(app, [*base, "--covariance-type", "diag", "--n-init", "2",
                            "--out", str(tmp_path / "b")])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert _params(tmp_path / "a") == _params(tmp_path / "b")
    assert (_params(tmp_path / "a")["covariance_type"], _params(tmp_path / "a")["n_init"]) == (
        "diag", 2)
    both = runner.invoke(app, [*base, "--covariance-type", "full", "--param",
                               "covariance_type=diag", "--out", str(tmp_path / "c")])
    assert both.exit_code == 2
    assert "--covariance-type 'full' and --covariance-type diag of --param disagree" in \
        both.stderr


def test_federation_settings_are_options(tmp_path):
    data = _mixture_csv(tmp_path / "d.csv")
    res = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,b", "-k", "2", "--max-rounds", "4",
                              "--min-records", "5", "--acceleration", "squarem",
                              "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    fed = _params(tmp_path / "o")["federation"]
    assert fed["disclosure"]["min_records"] == 5
    assert fed["acceleration"] == fl.Federation(acceleration="squarem").to_config()["acceleration"]
    assert (tmp_path / "ck.npz").exists()
    off = runner.invoke(app, ["fit", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,b", "-k", "2", "--max-rounds", "2",
                              "--disclosure", "off", "--out", str(tmp_path / "p")])
    assert off.exit_code == 0, off.output
    assert _params(tmp_path / "p")["federation"]["disclosure"] == json.loads(
        __import__("fedlatent.engine.privacy.enforce", fromlist=["x"]).policy_to_json(
            fl.DisclosurePolicy.off()))


def test_privacy_option_errors_name_the_option_and_its_keys(tmp_path):
    data = _mixture_csv(tmp_path / "d.csv")
    base = ["fit", "gmm", "--data", str(data), "--client", "site", "--features", "a,b", "-k",
            "2", "--out", str(tmp_path / "o")]
    res = runner.invoke(app, [*base, "--privacy", "epsilon=1"])
    assert res.stderr == ("error: --privacy needs delta and clip too, e.g. "
                          "'epsilon=1,delta=1e-5,clip=3'\n")
    res = runner.invoke(app, [*base, "--privacy", "epsilon=1,delta=1e-5,clip=3,colour=2"])
    assert res.stderr.startswith("error: --privacy: unknown key 'colour'; its keys: epsilon, "
                                 "delta, clip, noise")


def test_flower_app_and_local_take_the_models_own_options(tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    import tomllib

    from fedlatent.cli import flower_run

    res = runner.invoke(app, ["flower", "app", "gmm", "-k", "2", "--covariance-type", "diag",
                              "--min-nodes", "2", "--out", str(tmp_path / "app")])
    assert res.exit_code == 0, res.output
    with (tmp_path / "app" / "pyproject.toml").open("rb") as f:
        config = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    assert json.loads(config["params"])["covariance_type"] == "diag"

    started = {}

    def no_deployment(sites, app_dir, workdir, timeout):  # everything up to the processes
        started.update(sites=sites, app_dir=app_dir)
        raise typer.Exit(0)

    monkeypatch.setattr(flower_run, "_deploy_and_run", no_deployment)
    data = _mixture_csv(tmp_path / "d.csv")
    res = runner.invoke(app, ["flower", "local", "gmm", "--data", str(data), "--client", "site",
                              "--features", "a,region", "--categorical", "onehot",
                              "--covariance-type", "diag", "-k", "2",
                              "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    with (started["app_dir"] / "pyproject.toml").open("rb") as f:
        config = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    assert json.loads(config["params"])["covariance_type"] == "diag"
    sites = started["sites"]
    assert sites.ids == ["s0", "s1", "s2", "s3"]
    assert sites.roles["features"] == ["a", "region=north", "region=south", "region=west"]
    assert sites.encoding is not None  # written to roles.json with the result
