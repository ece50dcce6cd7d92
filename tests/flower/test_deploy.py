"""A real Flower deployment on loopback (superlink + one supernode per client file) gives the
in-process fit for each message flow (:data:`DEPLOYED_MODELS`), reports a failed server app,
resumes a stopped run from the server's checkpoint and the sites' states, survives a crashed
supernode, and leaves no process behind. One deployment (a module-scoped fixture) serves all
of these but the crashed supernode, which kills a node of a deployment of its own, at the same
time."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import tomllib
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from flower_cases import CASES, assert_same_fit

from fedlatent.engine.contract.registry import estimator_names
from fedlatent.runtime.flower_local import (
    APP_COMPONENTS,
    free_ports,
    pid_alive,
    toml_value,
    write_app,
)

pytestmark = pytest.mark.flower

# a healthy exchange takes ~5-15 s on a quiet machine, over 30 s at a load of 15 (the setup
# exchange then lost a live node); a dead node costs one timeout, in a thread beside the others
ROUND_TIMEOUT = 90.0


def assert_all_gone(pids):
    assert pids, "no PID was recorded"
    alive = [p for p in pids if pid_alive(p)]
    assert alive == [], f"processes still running: {alive}"


# ---------------------------------------------------------------------------------------------
# The app directory (no Flower needed)
# ---------------------------------------------------------------------------------------------
TRICKY = 'quote " backslash \\ newline \n tab \t bell \x07 del \x7f unicode é ∑ 😀'


def test_write_app_round_trips_through_tomllib(tmp_path):
    config = {
        "estimator": "gmm",
        "params": json.dumps({"n_components": 2, "name": TRICKY, "w": [0.25, 1e-300]}),
        "federation": json.dumps({"participation": 0.5, "step_size": 1.0}),
        "min-nodes": 3,
        "round-timeout": 25.0,
        "node-wait": 60.0,
        "out-dir": str(tmp_path / "out dir"),
        "data-name": TRICKY,
        "record": False,
        "big": 2**62,
        "tiny": 5e-324,
        "neg": -0.0,
    }
    app = write_app(tmp_path / "app", config)
    assert app == tmp_path / "app"
    with (app / "pyproject.toml").open("rb") as f:
        doc = tomllib.load(f)
    got = doc["tool"]["flwr"]["app"]["config"]
    assert got == config
    assert [type(v) for v in got.values()] == [type(v) for v in config.values()]
    assert json.loads(got["params"])["name"] == TRICKY
    assert doc["tool"]["flwr"]["app"]["components"] == APP_COMPONENTS
    assert doc["tool"]["flwr"]["app"]["publisher"] == "fedlatent"
    assert doc["project"]["dependencies"] == []
    assert {"name", "version"} <= set(doc["project"])
    assert "fedlatent must already be installed" in (app / "README.md").read_text()


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_toml_value_infinities(value):
    assert tomllib.loads(f"x = {toml_value(value)}")["x"] == value


def test_toml_value_nan():
    assert np.isnan(tomllib.loads(f"x = {toml_value(float('nan'))}")["x"])


@pytest.mark.parametrize(
    "config, err, match",
    [
        ({"params": {"k": 2}}, TypeError, r"got dict .*encode structures as a JSON string"),
        ({"w": [1, 2]}, TypeError, r"got list"),
        ({"": 1}, ValueError, r"TOML keys must be non-empty strings; got ''"),
        ({"s": "\ud800"}, ValueError, r"lone surrogate"),
    ],
)
def test_write_app_rejects_what_toml_cannot_hold(tmp_path, config, err, match):
    with pytest.raises(err, match=match):
        write_app(tmp_path / "app", config)
    assert not (tmp_path / "app").exists()


def test_quoted_keys_round_trip(tmp_path):
    app = write_app(tmp_path / "app", {"a.b c": 1, "ok-key_2": "v"})
    with (app / "pyproject.toml").open("rb") as f:
        assert tomllib.load(f)["tool"]["flwr"]["app"]["config"] == {"a.b c": 1, "ok-key_2": "v"}


def test_free_ports_are_distinct_and_bindable():
    import socket

    ports = free_ports(5)
    assert len(set(ports)) == 5
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


# ---------------------------------------------------------------------------------------------
# fedlatent flower app / partition (no deployment)
# ---------------------------------------------------------------------------------------------
def invoke(*args):
    from typer.testing import CliRunner

    from fedlatent.cli import app

    return CliRunner().invoke(app, ["flower", *map(str, args)])


def test_cli_app_writes_the_run_config(tmp_path):
    res = invoke("app", "gmm", "--out", tmp_path / "app",
                 "--params", '{"n_components": 2, "random_state": 3, "max_rounds": 7}',
                 "--federation", '{"participation": 0.5}', "--min-nodes", 3,
                 "--round-timeout", 20, "--node-wait", 45)
    assert res.exit_code == 0, res.output
    with (tmp_path / "app" / "pyproject.toml").open("rb") as f:
        config = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    assert config["estimator"] == "gmm"
    params = json.loads(config["params"])
    assert (params["n_components"], params["random_state"], params["max_rounds"]) == (2, 3, 7)
    assert json.loads(config["federation"])["participation"] == 0.5
    assert (config["min-nodes"], config["round-timeout"], config["node-wait"]) == (3, 20.0, 45.0)
    assert config["out-dir"] == str((tmp_path / "app" / "result").resolve())
    assert f"flwr run {tmp_path / 'app'} <connection> --stream" in res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope"], "error: unknown model 'nope'; registered: " + ", ".join(estimator_names())),
        (["gmm", "--params", "{n_components: 2}"], "error: --params is not valid JSON"),
        (["gmm", "--params", "[2]"], "error: --params must be a JSON object"),
        (["gmm", "--params", '{"n_components": 2, "colour": 1}'],
         "error: cannot build gmm from --params/--federation"),
        (["gmm", "--params", '{"n_components": 2}', "--min-nodes", 0],
         "error: --min-nodes must be >= 1, got 0"),
    ],
)
def test_cli_app_refuses_bad_input_and_writes_nothing(tmp_path, args, message):
    res = invoke("app", *args, "--out", tmp_path / "app")
    assert res.exit_code == 2
    assert message in res.output
    assert not (tmp_path / "app").exists()


def test_cli_partition_writes_one_file_per_client_and_the_node_commands(tmp_path):
    import pandas as pd

    from fedlatent.data.files import read_client_file

    rng = np.random.default_rng(0)
    df = pd.DataFrame(rng.normal(size=(90, 3)), columns=["a", "b", "c"])
    df["site"] = np.repeat(["s0", "s1", "s2"], 30)
    df.to_csv(tmp_path / "d.csv", index=False)
    res = invoke("partition", "--data", tmp_path / "d.csv", "--client", "site",
                 "--features", "a,c", "--out", tmp_path / "parts", "--superlink", "10.0.0.5:9000")
    assert res.exit_code == 0, res.output
    files = sorted((tmp_path / "parts").glob("*.parquet"))
    assert len(files) == 3
    cred = (tmp_path / "parts" / "credentials").resolve()
    assert "--insecure" not in res.output  # TLS and SuperNode authentication by default
    assert (f"flower-superlink --ssl-ca-certfile {cred}/certificates/ca.crt --ssl-certfile "
            f"{cred}/certificates/server.pem --ssl-keyfile {cred}/certificates/server.key "
            "--enable-supernode-auth --port 9000") in res.output
    for i, path in enumerate(files):
        fd = read_client_file(path)
        assert fd.client_ids == [f"s{i}"] and fd.feature_names == ["a", "c"]
        np.testing.assert_array_equal(fd[f"s{i}"].X, df.loc[df.site == f"s{i}", ["a", "c"]])
        assert f"flwr supernode register {cred}/keys/supernode-{i}.pub '<connection>'" \
            in res.output
        line = (f"flower-supernode --root-certificates {cred}/certificates/ca.crt "
                f"--auth-supernode-private-key {cred}/keys/supernode-{i} --superlink "
                f"10.0.0.5:9000 --port {9094 + i} --node-config 'data-path=\"{path.resolve()}\"'")
        assert line in res.output
    # the SuperLink's certificate names the address the sites were told
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((cred / "certificates" / "server.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.0.0.5" in [str(a) for a in names.get_values_for_type(x509.IPAddress)]
    insecure = invoke("partition", "--data", tmp_path / "d.csv", "--client", "site",
                      "--out", tmp_path / "parts2", "--insecure")
    assert insecure.exit_code == 0 and "flower-supernode --insecure" in insecure.output
    assert "warning: --insecure: no TLS and no SuperNode authentication" in insecure.output


@pytest.mark.parametrize(
    "data, extra, message",
    [
        ("empty", [], "holds no .parquet client files"),
        ("table", [], "error: give --client COLUMN (or --split-rows N to split the rows)"),
        # gmm has no entity level: --entity is not offered where it cannot work
        ("table", ["--split-rows", 3, "--entity", "e"], "error: No such option '--entity'"),
        ("table", ["--split-rows", 0], "error: --split-rows must be between 1 and the 40 rows"),
        ("table", ["--clients", 0], "error: --split-rows must be between 1 and the 40 rows"),
        ("parts", ["--clients", 4], "error: --clients 4 but the data hold 2 clients"),
    ],
)
def test_cli_local_refuses_bad_input_before_starting_anything(tmp_path, data, extra, message):
    import pandas as pd

    from fedlatent.data.files import write_client_files

    (tmp_path / "empty").mkdir()
    df = pd.DataFrame(np.random.default_rng(0).normal(size=(40, 2)), columns=["a", "b"])
    df.to_csv(tmp_path / "table.csv", index=False)
    write_client_files(fl_two_clients(), tmp_path / "parts")
    path = {"empty": tmp_path / "empty", "table": tmp_path / "table.csv",
            "parts": tmp_path / "parts"}[data]
    res = invoke("local", "gmm", "--data", path, "--params", '{"n_components": 2}', *extra,
                 "--out", tmp_path / "out")
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert not (tmp_path / "out" / "deploy").exists()


def fl_two_clients():
    import fedlatent as fl

    rng = np.random.default_rng(1)
    return fl.FederatedDataset.from_arrays({"a": rng.normal(size=(10, 2)),
                                            "b": rng.normal(size=(12, 2))})


def test_run_app_refuses_an_override_not_in_the_app(tmp_path):
    from fedlatent.runtime.flower_local import LocalDeployment, run_app

    app = write_app(tmp_path / "app", {"out-dir": str(tmp_path / "out"), "min-nodes": 1})
    dep = LocalDeployment([tmp_path / "x.parquet"], workdir=tmp_path / "dep")  # not started
    with pytest.raises(ValueError, match=r"run-config overrides \['colour'\] are not in the app's "
                                         r"\[tool.flwr.app.config\] \(keys: \['min-nodes', "
                                         r"'out-dir'\]\)"):
        run_app(app, dep, overrides={"colour": 1})
    assert dep.pids == []


# ---------------------------------------------------------------------------------------------
# Real deployments (flwr installed): one loopback deployment serves every check of this module
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def flwr():
    return pytest.importorskip("flwr")


def client_files(fd, where):
    from fedlatent.data.files import write_client_files

    files = write_client_files(fd, where)
    return [files[c] for c in fd.client_ids]


def state_case():
    """FedGMM stopped after round 2 and resumed (random initialization: one query; no control
    variates: no extra exchange after round 1)."""
    import fedlatent as fl
    from fedlatent.data.fedgmm_data import make_fedgmm_synthetic

    sp = make_fedgmm_synthetic(n_clients=3, n_samples_per_client=100, n_features=3,
                               mean_scale=2.0, fractions=(0.8, 0.1, 0.1), random_state=5)
    fed = fl.Federation(control_variates=False)
    return sp.train, lambda: fl.FedGMM(2, 2, max_rounds=3, tol=0.0, init_params="random",
                                       federation=fed, random_state=12)


def lean(name):
    """The model's Flower case with lean rounds: one round where the model has a round loop (the
    simulation tests run two, the second from parameters the server computed and sent), and the
    random start where the default is the k-means one (one exchange instead of four)."""
    fd, make = CASES[name]()

    def make_lean():
        est = make()
        if "max_rounds" in est.get_params():
            est.set_params(max_rounds=1)
        if est.get_params().get("init_params") == "kmeans-sums":  # four exchanges; the
            est.set_params(init_params="random")  # simulation tests keep the k-means start
        return est

    return fd, make_lean


def private_case():
    """The secure and differentially private GMM whose sites' ledgers are checked (GMM's data;
    a file of its own, so its site directory and ledger are its own). Two rounds: the sites
    verify them (verified rounds are on by default under secure aggregation), round 2 replayed
    from round 1's verified aggregate."""
    import fedlatent as fl

    fd, _ = CASES["gmm"]()
    return fd, lambda: fl.FederatedGaussianMixture(2, max_rounds=2, random_state=3,
                                                   federation=fl.Federation(
                                                       privacy=fl.DifferentialPrivacy(
                                                           2.0, 1e-5, clip=6.0),
                                                       secure_aggregation=True))


#: models whose deployment run is another test's run (each run costs about a hundred CPU-seconds
#: of client processes): FedGMM's is the stopped and resumed one, still checked against its
#: in-process fit (the secure private GMM cannot be: a site refuses a noise seed)
OWN_RUN = {"fedgmm": ("state", state_case)}

#: the models run on the deployment, one per message flow: GMM (EM rounds, as LCR's and LCA's),
#: HLCR (the agents' sampler state kept across messages), SEC (no round loop: selection and
#: exchange of learners) and FedGMM (stopped and resumed: :data:`OWN_RUN`). What a deployment
#: adds to the simulation (gRPC, SuperNodes, node config, one client process per message) does
#: not depend on the model; every model runs the same ClientApp, reading its node's data file,
#: on Flower's simulation (tests/flower/test_simulation.py)
DEPLOYED_MODELS = ("fedgmm", "gmm", "hlcr", "sec")

#: the data sets the deployment's three nodes hold, one file each in the node's directory
#: (data-path = the directory; an app's data-name picks the file)
DEPLOYED = {**{n: CASES[n] for n in DEPLOYED_MODELS if n not in OWN_RUN}, "state": state_case}

#: each SuperNode's site policy (``policy-path``): its own signing key (the ledger's anchor and
#: its site states signed), DP ceilings and a lifetime budget per data set; the consortium pins
#: no roster, so SEC's learners are told to evaluate unsigned models
POLICY = """[site]
signing-key = "site-key.pem"
[privacy]
max-epsilon = 5.0
lifetime-epsilon = 10.0
lifetime-delta = 1e-5
[sec]
evaluate-others = true
"""


def site_policies(node_dirs):
    """A policy file and a signing key per node directory; returns the policy paths."""
    from fedlatent.engine.site.keys import SiteKeys

    paths = []
    for d in node_dirs:
        SiteKeys.generate().save(d / "site-key.pem")
        (d / "policy.toml").write_text(POLICY)
        paths.append(d / "policy.toml")
    return paths


def pinned_policies(node_dirs, sites):
    """Issue 37: the consortium pins a roster. Each node's policy is :data:`POLICY` with its
    signing key and the roster of the three sites' keys (a deployed site refuses secure
    aggregation without one); returns the policy paths."""
    from fedlatent.engine.site.keys import Roster, SiteKeys

    keys = {}
    for d, c in zip(node_dirs, sites):
        key = keys[c] = SiteKeys.generate()
        key.save(d / "site-key.pem")
    roster = Roster({c: k.public_key for c, k in keys.items()}).to_json()
    policy = POLICY.replace("[site]\n", '[site]\nroster = "roster.json"\n')
    for d in node_dirs:
        (d / "roster.json").write_text(roster)
        (d / "policy.toml").write_text(policy)
    return [d / "policy.toml" for d in node_dirs]


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    """Three SuperNodes of a consortium that pins a roster (:func:`pinned_policies`), holding the
    secure and private GMM's data: the deployment of secure aggregation against a cheating
    server (the module's other deployment pins none, so SEC's learners evaluate unsigned
    models)."""
    pytest.importorskip("flwr")
    from fedlatent.runtime.flower_local import LocalDeployment

    root = tmp_path_factory.mktemp("pinned")
    fd, _ = private_case()
    node_dirs = [root / f"site-{i}" for i in range(3)]
    for d, f in zip(node_dirs, client_files(fd, root / "data")):
        d.mkdir()
        f.replace(d / "private.parquet")
    dep = LocalDeployment(node_dirs, workdir=root / "dep",
                          policy_paths=pinned_policies(node_dirs, fd.client_ids))
    with dep:
        yield SimpleNamespace(dep=dep, node_dirs=node_dirs, root=root)
        pids = dep.all_pids()
    assert_all_gone(pids)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """Three SuperNodes and a SuperLink for the whole module (starting them costs seconds and
    every test here needs the same three sites); at the end every process it started is gone.
    The dead-supernode scenario kills a node of a deployment of its own."""
    pytest.importorskip("flwr")
    from fedlatent.runtime.flower_local import LocalDeployment

    root = tmp_path_factory.mktemp("deploy")
    node_dirs = [root / f"site-{i}" for i in range(3)]
    for d in node_dirs:
        d.mkdir()
    for name, case in DEPLOYED.items():
        fd, _ = case()
        assert fd.n_clients == 3
        for d, f in zip(node_dirs, client_files(fd, root / "data" / name)):
            f.replace(d / f"{name}.parquet")
    from fedlatent.runtime.flower_credentials import make_credentials

    # TLS and SuperNode authentication, as a deployment runs (one spare key, never registered)
    dep = LocalDeployment(node_dirs, workdir=root / "dep", policy_paths=site_policies(node_dirs),
                          credentials=make_credentials(root / "credentials", 4))
    with dep:
        assert dep.startup_seconds > 0
        yield SimpleNamespace(dep=dep, node_dirs=node_dirs, root=root)
        pids = dep.all_pids()
        assert len(pids) >= 4  # the SuperLink and three SuperNodes at least
    assert_all_gone(pids)


def app_for(deployment, tag, name, est, **kw):
    """An app (``app-<tag>``) fitting ``est`` on the nodes' ``name`` files; its result in
    ``out-<tag>``, a directory of its own."""
    from fedlatent.runtime.flower import run_config_for

    # the runs share the nodes, each serving one message at a time: on a loaded machine an
    # exchange can wait minutes behind the others' (a timeout only ends a failing run sooner)
    kw = {"min_nodes": 3, "round_timeout": 600.0, "node_wait": 600.0, **kw}
    out = deployment.root / f"out-{tag}"
    assert not out.exists(), f"{out} is another test's"
    return write_app(deployment.root / f"app-{tag}", run_config_for(
        est, out_dir=out, data_name=f"{name}.parquet", **kw)), out


# A SuperNode serves one message at a time, each in a fresh client process (importing
# fedlatent), and sleeps between polls: one run alone leaves the nodes idle most of the time.
# So every run of this module but the dead-node one runs at once, each server app started once
# the previous one is up; the tests then check their results.
def _launch(runs, key, target, out, deadline=120.0):
    """Start ``target`` in a thread recording its result (or exception) in ``runs[key]``; return
    once its server app has written ``out/status.json`` (server apps starting all at once on a
    loaded machine failed Flower's task-token check) or the thread ended."""

    def go():
        try:
            runs[key] = target()
        except BaseException as e:  # noqa: BLE001 - examined in the test thread
            runs[key] = e

    t = threading.Thread(target=go)
    t.start()
    end = time.monotonic() + deadline
    while t.is_alive() and not (out / "status.json").exists() and time.monotonic() < end:
        time.sleep(0.2)
    return t


def _guarded(fn, *args):
    try:
        return fn(*args)
    except BaseException as e:  # noqa: BLE001 - examined in the test thread
        return e


def _stop_and_resume(deployment, app, out, log_of):
    """Run ``app``; stop it (``flwr stop``) once round 2 has ended; resume it. Return the round
    it was stopped at, the first run's exception and the wall time."""
    from fedlatent.runtime.flower_local import _stop_run, run_app

    dep, t0, seen = deployment.dep, time.monotonic(), {}

    def stop_at_two(status):
        if int(status.get("round") or 0) >= 2 and "stopped_at" not in seen:
            seen["stopped_at"] = int(status["round"])
            while "state" not in log_of:  # set by the launcher once this run's server is up
                time.sleep(0.1)
            _stop_run(dep, log_of["state"])

    try:
        run_app(app, dep, timeout=1500, on_round=stop_at_two)
        first = None
    except RuntimeError as e:  # the stopped run does not finish
        first = e
    first_status = json.loads((out / "status.json").read_text())["status"]
    run_app(app, dep, overrides={"resume": True}, timeout=1500)
    return SimpleNamespace(stopped_at=seen.get("stopped_at"), first=first,
                           first_status=first_status, wall=time.monotonic() - t0)


@pytest.fixture(scope="module")
def runs(deployment, pinned):
    """The results of every run, all at once: on the module's deployment ``runs[name]`` for
    each case not in :data:`OWN_RUN` (its out-dir, or the exception), ``runs["failed"]`` (a
    server app that must fail) and ``runs["state"]`` (FedGMM stopped after round 2, then
    resumed); on a deployment of its own ``runs["dead"]`` (a SuperNode killed mid-run)."""
    pytest.importorskip("flwr")
    from fedlatent.runtime.flower_local import run_app

    dep, out = deployment.dep, {}
    results: dict[str, object] = {}
    threads, log_of = [], {}
    # 0. the dead-node scenario, on a deployment of its own (it kills a node): at once with the
    # rest, its waits for the dead node overlap their work
    (deployment.root / "dead").mkdir()
    dead = threading.Thread(target=lambda: results.__setitem__(
        "dead", _guarded(_dead_node_scenario, deployment.root / "dead")))
    dead.start()
    threads.append(dead)
    # 1. the run that is stopped and resumed: its log is the only one when its server is up
    fd, make = state_case()
    app, out["state"] = app_for(deployment, "state", "state", make())
    before = set(dep.workdir.glob("flwr-run-*.log"))
    threads.append(_launch(results, "state", lambda: _stop_and_resume(
        deployment, app, out["state"], log_of), out["state"]))
    (log_of["state"],) = set(dep.workdir.glob("flwr-run-*.log")) - before
    # 2. a server app that fails: min-nodes above the 3 nodes started, a short wait
    _, make = CASES["gmm"]()
    failed, out["failed"] = app_for(deployment, "failed", "gmm", make())
    threads.append(_launch(results, "failed", lambda: run_app(
        failed, dep, overrides={"min-nodes": 5, "node-wait": 1.0}, timeout=300), out["failed"]))
    # 3. the secure and private GMM under the sites' policies, which pin a roster
    _, make = private_case()
    private, out["private"] = app_for(pinned, "private", "private", make())
    threads.append(_launch(results, "private", lambda: run_app(private, pinned.dep,
                                                               timeout=1500), out["private"]))
    # 4. one model per message flow
    apps = {}
    for name in sorted(set(DEPLOYED_MODELS) - set(OWN_RUN)):
        _, make = lean(name)
        apps[name], out[name] = app_for(deployment, name, name, make())
        threads.append(_launch(results, name, lambda a=apps[name]: run_app(a, dep, timeout=1500),
                               out[name]))
    for t in threads:
        t.join()
    dep.all_pids()  # every process seen is checked gone when the deployment stops
    pinned.dep.all_pids()
    return SimpleNamespace(results=results, out=out, apps=apps)


@pytest.mark.slow
@pytest.mark.deployment
def test_the_deployment_is_encrypted_and_admits_only_registered_supernodes(flwr, deployment):
    """Issue 39: the SuperLink serves TLS only, and a SuperNode whose key was never registered
    (or that does not speak TLS) is refused; the three registered ones joined."""
    import subprocess

    from fedlatent.runtime.flower_deployment import _flower_exe, free_port

    dep = deployment.dep
    assert "Uvicorn running on https://" in (dep.workdir / "superlink.log").read_text()
    cred = dep.credentials
    for name, security in (("unregistered", ["--root-certificates", str(cred.ca),
                                             "--auth-supernode-private-key",
                                             str(cred.node_keys[3])]),
                           ("plain", ["--insecure"])):
        log = deployment.root / f"intruder-{name}.log"
        with log.open("wb") as fh:
            p = subprocess.run(
                [_flower_exe("flower-supernode"), *security, "--superlink", dep.address,
                 "--port", str(free_port()), "--max-retries", "0", "--node-config",
                 f'data-path="{deployment.node_dirs[0]}"'],
                stdout=fh, stderr=subprocess.STDOUT, env=dep.env(deployment.root / name),
                timeout=120)
        assert p.returncode != 0 and "could not establish a connection to the SuperLink" \
            in log.read_text(), log.read_text()[-2000:]
    link = (dep.workdir / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in link  # the unregistered one
    assert len(set(re.findall(r"Activated node_id=(\d+)", link))) == 3  # the registered ones


@pytest.mark.deployment
def test_each_message_flow_on_one_deployment_equals_inprocess(flwr, runs):
    from fedlatent.runtime.flower import load_result

    for name in DEPLOYED_MODELS:
        key, case = OWN_RUN.get(name, (name, lambda n=name: lean(n)))
        fd, make = case()
        if isinstance(runs.results[key], BaseException):
            raise runs.results[key]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = make().fit(fd)
            est = load_result(runs.out[key])
        assert_same_fit(name, ref, est, rtol=1e-8)
        st = est.flower_status_
        assert st["status"] == "ok" and st["clients"] == fd.client_ids and st["lost"] == {}
        if name != "sec":  # SEC has no round loop
            assert st["round"] == ref.n_rounds_ == len(est.history_)


@pytest.mark.slow
@pytest.mark.deployment
def test_a_secure_private_fit_under_site_policies_is_on_every_sites_signed_ledger(
        flwr, pinned, runs):
    """Each SuperNode holds a policy file (node config ``policy-path``) naming its signing key
    and the consortium's pinned roster: a verified, secure and differentially private GMM runs
    end to end (each site checks its reply is in the sum and replays round 2: issue 38)
    (every site verifies its peers' signed keys, commits before the graph is drawn, confirms
    its split before every reveal: issue 37; without the roster a deployed site refuses), every
    site's ledger (its anchor signed with the site's key) records the plan's releases, and each
    ledger composes to the server's ``privacy_spent_``; the site states it wrote are signed
    with its key."""
    from fedlatent.engine.node.site_state import read_site_state
    from fedlatent.engine.site import Ledger, SitePolicy
    from fedlatent.engine.site.keys import Roster, SiteKeys
    from fedlatent.runtime.flower import load_result

    deployment = pinned
    for d in deployment.node_dirs:
        assert SitePolicy.load(d / "policy.toml").roster == d / "roster.json"
    if isinstance(runs.results["private"], BaseException):
        raise runs.results["private"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = load_result(runs.out["private"])
    fd, _ = private_case()
    assert est.flower_status_["status"] == "ok" and est.flower_status_["lost"] == {}
    plan = est.privacy_calibration_.releases
    assert plan == 4  # the private start's two releases and two rounds
    assert list(est.history_.to_frame()["participants"]) == [3, 3]  # no site refused
    for c, d in zip(fd.client_ids, deployment.node_dirs):
        key = SiteKeys.load(d / "site-key.pem")
        ledger = Ledger(d / "private.site", c, keys=key)  # chain and signed anchor verified
        assert [e["release"] for e in ledger.of("release")] == list(range(1, plan + 1))
        assert len(ledger.of("secagg-keys")) == 1 and ledger.of("refusal") == []
        assert [e["verified"] for e in ledger.of("plan")] == [True]  # a verified run
        # the budget is kept under the data file's content, not the server's data-name
        dataset = "sha256:" + hashlib.sha256((d / "private.parquet").read_bytes()).hexdigest()
        assert {e["dataset"] for e in ledger.of("release")} == {dataset}
        assert ledger.lifetime_epsilon(dataset, 1e-5) == pytest.approx(
            est.privacy_spent_[0], rel=1e-9)
        state = read_site_state(d / "private.site", trust=Roster({c: key.public_key}))
        assert state.client_id == c


@pytest.mark.slow
@pytest.mark.deployment
def test_failed_server_app_raises_its_error(flwr, runs):
    err = runs.results["failed"]
    assert isinstance(err, RuntimeError), err
    msg = str(err)
    assert msg.startswith("Flower run failed: the server app reported status 'error': "
                          "TimeoutError: only 3 of min-nodes=5 Flower nodes connected within 1 s")
    assert "superlink.log" in msg  # the logs' tails come with it
    status = json.loads((runs.out["failed"] / "status.json").read_text())
    assert status["status"] == "error" and status["round"] == 0


@pytest.mark.slow
@pytest.mark.deployment
def test_stopped_deployment_resumes_and_sites_predict_with_their_state(flwr, deployment, runs):
    """A FedGMM run stopped after round 2 (``flwr stop``) and resumed (server checkpoint + the
    sites' own states) ends as the uninterrupted in-process fit, and a site then predicts with
    the state it kept as the in-process personalized prediction. Flower keeps a node's
    ``context.state`` per run, so the resumed run's nodes start from nothing but their site
    directories."""
    from fedlatent.runtime.flower import load_result

    fd, make = state_case()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = make().fit(fd)
    res = runs.results["state"]
    if isinstance(res, BaseException):
        raise res
    assert res.stopped_at == 2, "the run ended before round 2"
    assert isinstance(res.first, RuntimeError), res.first  # the first run did not finish
    assert res.first_status != "ok"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = load_result(runs.out["state"])
    assert est.flower_status_["resumed_from"] in (1, 2)
    assert len(est.history_) == 3
    for a in ("weights_x_", "means_", "precisions_cholesky_", "coef_", "weights_y_"):
        x, y = np.asarray(getattr(est, a)), np.asarray(getattr(ref, a))
        assert float(np.max(np.abs(x - y))) <= 1e-10 * max(1.0, float(np.max(np.abs(y)))), a
    # a site predicts with the state it kept: the in-process personalized prediction
    cid = fd.client_ids[1]
    mine = est.load_site_state(deployment.node_dirs[1] / "state.site")
    assert mine.client == cid
    X = fd[cid].X
    np.testing.assert_allclose(mine.predict_proba(X), ref.personalize(cid).predict_proba(X),
                               rtol=0, atol=1e-10)
    print(f"stop + resume on a loopback deployment: {res.wall:.0f} s")


def _dead_node_scenario(root):
    """On a deployment of its own (it kills a node): a GMM run whose SuperNode 1 is killed
    (SIGKILL) once round 2 has ended. Returns what the test checks; every process it started is
    checked gone."""
    import fedlatent as fl
    from fedlatent.runtime.flower_local import LocalDeployment, run_app

    fd, _ = CASES["gmm"]()
    dirs = [root / f"site-{i}" for i in range(3)]
    for d, f in zip(dirs, client_files(fd, root / "data")):
        d.mkdir()
        f.replace(d / "gmm.parquet")
    # random init: one initialization query instead of three (each costs a network exchange)
    est0 = fl.FederatedGaussianMixture(2, max_rounds=4, tol=0.0, random_state=11,
                                       init_params="random")
    res = SimpleNamespace(fd=fd, killed_at=None, error=None, victim=1)
    with LocalDeployment(dirs, workdir=root / "dep") as dep:
        here = SimpleNamespace(dep=dep, root=root)
        app, res.out = app_for(here, "dead", "gmm", est0, min_nodes=fd.n_clients,
                               round_timeout=ROUND_TIMEOUT, node_wait=600.0)
        result: dict[str, object] = {}
        t = threading.Thread(target=lambda: result.setdefault("error", _run(run_app, app, dep)))
        t.start()
        deadline = time.monotonic() + 1200
        while t.is_alive() and time.monotonic() < deadline:
            try:
                status = json.loads((res.out / "status.json").read_text())
            except (OSError, ValueError):
                status = {}
            if status.get("round", 0) >= 2:
                res.killed_at = int(status["round"])
                dep.kill_node(res.victim)
                break
            time.sleep(0.1)
        t.join()
        res.error = result.get("error")
        res.victim_alive = pid_alive(dep.node_pids[res.victim])
        pids = dep.all_pids()
    assert_all_gone(pids)
    return res


def _run(run_app, app, dep):
    try:
        run_app(app, dep, timeout=1200)
    except BaseException as e:  # noqa: BLE001 - examined in the test thread
        return e
    return None


@pytest.mark.slow
@pytest.mark.deployment
def test_dead_supernode_is_missing_from_later_rounds(flwr, runs):
    from fedlatent.runtime.flower import load_result

    res = runs.results["dead"]
    if isinstance(res, BaseException):
        raise res
    assert not res.victim_alive
    if res.error is not None:
        raise res.error
    assert res.killed_at is not None, "the run ended before round 2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = load_result(res.out)
    fd = res.fd
    cid = fd.client_ids[res.victim]
    hist = est.history_
    assert est.flower_status_["status"] == "ok"
    assert len(hist) == 4
    # rounds 1..k ended before the kill with every client; round k+1 may have been answered
    # before the crash; every round after that misses exactly the dead client
    k = res.killed_at
    assert k == 2  # status.json is polled every 0.1 s, a round takes seconds
    assert [r.missing for r in hist[:k]] == [[]] * k
    assert [r.missing for r in hist[k + 1 :]] == [[cid]] * (len(hist) - k - 1)
    assert [r.participants for r in hist[k + 1 :]] == [fd.n_clients - 1] * (len(hist) - k - 1)
    assert cid in est.flower_status_["lost"]
