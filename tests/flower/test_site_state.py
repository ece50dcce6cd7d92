"""Site state that outlives a deployed run: written by every node after each round it takes part
in, read back for personalized prediction at the site and for resuming a run that stopped.

The Flower server (``run_server``) runs here over a Grid that answers in-process with the
ClientApp's own node code (``serve``) and one site directory per node: the same code paths as a
deployment, without its processes (the loopback deployment test is in test_deploy.py).
"""

from __future__ import annotations

import json
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.node.site_state import (
    KEEP,
    check_run,
    read_site_state,
    run_key,
    write_site_state,
)
from tolerance import assert_close, assert_same

RUN = {"estimator": "fedgmm", "params": {"n_input_components": 2, "random_state": 1}}


# ---------------------------------------------------------------------------------------------
# The site directory
# ---------------------------------------------------------------------------------------------
def test_entries_are_kept_newest_first_and_read_back_exactly(tmp_path):
    for k in range(1, 6):
        write_site_state(tmp_path, client_id="a", state={"model/pi": np.full(2, k / 10.0),
                                                        "V/nk": np.arange(3.0) * k},
                         round_=k, run=RUN)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"state-{s:06d}.{e}" for s in (3, 4, 5) for e in ("json", "npz")]
    assert KEEP == 3
    site = read_site_state(tmp_path)
    assert (site.client_id, site.round, site.key) == ("a", 5, run_key(RUN))
    assert_same(site.state["model/pi"], [0.5, 0.5])  # the values written, read back
    assert_same(site.state["V/nk"], [0.0, 5.0, 10.0])
    # a server checkpointed one round behind its sites: the state of that round
    assert read_site_state(tmp_path, at_most_round=4, run_key=run_key(RUN)).round == 4
    with pytest.raises(FileNotFoundError, match=r"holds no entry of run [0-9a-f]{16} written at "
                                                r"round <= 2; the site's state of this run is "
                                                r"lost: start the run afresh"):
        read_site_state(tmp_path, at_most_round=2, run_key=run_key(RUN))


def test_a_new_run_replaces_the_previous_runs_entries(tmp_path):
    write_site_state(tmp_path, client_id="a", state={"x": np.ones(1)}, round_=3, run=RUN)
    other = {**RUN, "params": {**RUN["params"], "random_state": 2}}
    write_site_state(tmp_path, client_id="a", state={"x": np.zeros(1)}, round_=1, run=other)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state-000002.json",
                                                          "state-000002.npz"]
    with pytest.raises(FileNotFoundError, match=f"holds no entry of run {run_key(RUN)}"):
        read_site_state(tmp_path, run_key=run_key(RUN))


def test_a_damaged_entry_is_refused(tmp_path):
    write_site_state(tmp_path, client_id="a", state={"x": np.ones(4)}, round_=1, run=RUN)
    npz = tmp_path / "state-000001.npz"
    data = bytearray(npz.read_bytes())
    data[-30] ^= 0xFF
    npz.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"state-000001.npz does not match state-000001.json: "
                                         r"its sha256 is"):
        read_site_state(tmp_path)


def test_missing_directory_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"site state directory .*nowhere does not exist; "
                                                r"give the directory the site named in its node "
                                                r"config \(site-dir\)"):
        read_site_state(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="holds no state-\\*.json entry"):
        read_site_state(tmp_path)


def test_check_run_names_what_differs(tmp_path):
    write_site_state(tmp_path, client_id="a", state={"x": np.ones(1)}, round_=1, run=RUN)
    site = read_site_state(tmp_path)
    check_run(site, "fedgmm", RUN["params"])
    with pytest.raises(ValueError, match=r"written by a 'fedgmm' fit, the model is a 'gmm'"):
        check_run(site, "gmm", RUN["params"])
    with pytest.raises(ValueError, match=r"other settings \(random_state differ\)"):
        check_run(site, "fedgmm", {**RUN["params"], "random_state": 7})


# ---------------------------------------------------------------------------------------------
# The server app over a Grid answered by the ClientApp's node code, one site directory per node
# ---------------------------------------------------------------------------------------------
class Stop(BaseException):
    """The server process ends (a crash, a Ctrl-C) in the middle of a round."""


class SiteGrid:
    """Nodes 1..n answering in-process with ``serve`` (each its own ``context.state`` and site
    directory); ``stop_at_round``: every node takes part in that round's E-step, then the
    server dies before it sees a reply (the sites are one round ahead of its checkpoint)."""

    def __init__(self, fd, sites, stop_at_round=None):
        from flwr.app import RecordDict

        self.fd, self.sites, self.stop = fd, sites, stop_at_round
        self.states = {i + 1: RecordDict() for i in range(fd.n_clients)}
        self.replies: dict[str, object] = {}
        self.n = 0

    def get_node_ids(self):
        return list(self.states)

    def push_messages(self, msgs):
        from fedlatent.runtime import flower as fw

        ids, stop = [], False
        for m in msgs:
            nid = int(m.metadata.dst_node_id)
            d = fw.decode(m.content)
            method = str(d.pop(fw._METHOD))
            cid = self.fd.client_ids[nid - 1]
            stop = stop or (method == "estep" and int(d["round"]) == self.stop)
            reply = fw.serve(self.fd.subset([cid]), self.states[nid], method, d,
                             self.sites[nid - 1])
            self.n += 1
            rid = f"m{self.n}"
            self.replies[rid] = SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=rid, src_node_id=nid),
                has_error=lambda: False, content=fw.encode(reply))
            ids.append(rid)
        if stop:
            raise Stop
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in ids if i in self.replies]


@pytest.fixture
def flower_task(monkeypatch):
    """Flower's Message needs the id of a run (a ServerApp's); this test's run is 1."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def fedgmm_case(rounds=4):
    from fedlatent.data.fedgmm_data import make_fedgmm_synthetic

    sp = make_fedgmm_synthetic(n_clients=3, n_samples_per_client=90, n_features=3,
                               mean_scale=2.0, fractions=(0.8, 0.1, 0.1), random_state=5)
    fed = fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), control_variates=True)
    return sp.train, lambda: fl.FedGMM(2, 2, max_rounds=rounds, tol=0.0, init_params="random",
                                       federation=fed, random_state=12)


def run(fd, make, tmp_path, *, resume=False, stop_at_round=None):
    from fedlatent.runtime.flower import run_config_for, run_server

    sites = [tmp_path / "sites" / f"s{i}.site" for i in range(fd.n_clients)]
    config = run_config_for(make(), out_dir=tmp_path / "out", min_nodes=fd.n_clients,
                            resume=resume)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_server(SiteGrid(fd, sites, stop_at_round), config)
    return sites


def fitted_inprocess(fd, make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make().fit(fd)


FITTED = ("weights_x_", "means_", "precisions_cholesky_", "coef_", "weights_y_")


def test_site_state_gives_the_inprocess_personalized_prediction(flower_task, tmp_path):
    from fedlatent.runtime.flower import load_result

    fd, make = fedgmm_case()
    ref = fitted_inprocess(fd, make)
    sites = run(fd, make, tmp_path)
    est = load_result(tmp_path / "out")
    for a in FITTED:
        np.testing.assert_allclose(getattr(est, a), getattr(ref, a), rtol=1e-12, atol=0)
    for i, cid in enumerate(fd.client_ids):
        site = read_site_state(sites[i])
        assert site.client_id == cid and site.round <= 4
        node = ref._runtime.nodes[cid].state
        assert sorted(site.state) == sorted(node)  # the whole private state: pi_c, V_c, ...
        for k in node:
            np.testing.assert_allclose(site.state[k], node[k], rtol=0, atol=1e-12)
    X = fd[fd.client_ids[1]].X
    mine = est.load_site_state(sites[1])
    assert mine.client == fd.client_ids[1]
    np.testing.assert_allclose(mine.predict_proba(X),
                               ref.personalize(fd.client_ids[1]).predict_proba(X),
                               rtol=0, atol=1e-10)
    # another site's directory is another client's state; another fit's is refused
    assert est.load_site_state(sites[2]).client == fd.client_ids[2]
    other = fl.FedGMM(2, 2, max_rounds=4, tol=0.0, init_params="random", random_state=13,
                      federation=est.federation)
    for a in ("weights_x_", "weights_y_", "classes_", "params_", "n_iter_"):
        setattr(other, a, getattr(est, a))
    with pytest.raises(ValueError, match=r"written by a fit with other settings "
                                         r"\(random_state differ\)"):
        other.load_site_state(sites[1])


def test_stopped_run_resumes_to_the_uninterrupted_result(flower_task, tmp_path):
    from fedlatent.runtime.flower import load_result

    fd, make = fedgmm_case(rounds=5)
    ref = fitted_inprocess(fd, make)
    full_sites = run(fd, make, tmp_path / "full")  # the same run, uninterrupted
    full = load_result(tmp_path / "full" / "out")
    with pytest.raises(Stop):
        run(fd, make, tmp_path, stop_at_round=3)  # sites took round 3, the server died in it
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    assert status["round"] == 2 and status["status"] == "error"
    sites = run(fd, make, tmp_path, resume=True)
    est = load_result(tmp_path / "out")
    assert est.flower_status_["resumed_from"] == 2
    assert len(est.history_) == 5
    # exact against the uninterrupted run of the same server and nodes: the resumed rounds
    # repeat its operations in the same order from the checkpointed bits, on one machine;
    # to 1e-12 against the in-process fit (other code paths, tests/tolerance.py)
    for a in FITTED:
        assert_same(getattr(est, a), getattr(full, a), err_msg=a)
        assert_close(getattr(est, a), getattr(ref, a), err_msg=a)
    assert [r.participants for r in est.history_] == [r.participants for r in ref.history_]
    assert [r.participants for r in est.history_] == [r.participants for r in full.history_]
    for i, cid in enumerate(fd.client_ids):
        node = ref._runtime.nodes[cid].state
        site = read_site_state(sites[i]).state
        uninterrupted = read_site_state(full_sites[i]).state
        assert sorted(site) == sorted(node) == sorted(uninterrupted)
        for k in node:
            assert_same(site[k], uninterrupted[k], err_msg=f"{cid} {k}")
            assert_close(site[k], node[k], err_msg=f"{cid} {k}")


def test_resume_without_a_checkpoint_says_so(flower_task, tmp_path):
    fd, make = fedgmm_case()
    with pytest.raises(FileNotFoundError, match=r"resume: there is no checkpoint .*checkpoint.npz"
                                                r" to resume from; run without resume"):
        run(fd, make, tmp_path, resume=True)


def test_resume_after_the_sites_lost_their_state_names_the_client(flower_task, tmp_path):
    import shutil

    from fedlatent.runtime.flower import load_result

    fd, make = fedgmm_case()
    with pytest.raises(Stop):
        sites = run(fd, make, tmp_path, stop_at_round=3)
    sites = [tmp_path / "sites" / f"s{i}.site" for i in range(fd.n_clients)]
    shutil.rmtree(sites[0])
    with pytest.raises(Exception, match=rf"client '{fd.client_ids[0]}'"):
        run(fd, make, tmp_path, resume=True)
    with pytest.raises(RuntimeError, match="the Flower run failed"):
        load_result(tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# fedlatent predict --site-state
# ---------------------------------------------------------------------------------------------
def test_cli_predict_with_site_state_equals_inprocess(flower_task, tmp_path):
    import pandas as pd
    from typer.testing import CliRunner

    from fedlatent.cli import app
    from fedlatent.data.files import write_client_files

    fd, make = fedgmm_case()
    ref = fitted_inprocess(fd, make)
    sites = run(fd, make, tmp_path)
    files = write_client_files(fd, tmp_path / "data")
    cid = fd.client_ids[0]
    out = tmp_path / "pred.csv"
    res = CliRunner().invoke(app, ["predict", "--model", str(tmp_path / "out"), "--site-state",
                                   str(sites[0]), "--data", str(files[cid]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    got = pd.read_csv(out)
    want = ref.personalize(cid).predict_proba(fd[cid].X)
    proba = got[[f"proba_{c}" for c in ref.classes_.tolist()]].to_numpy()
    np.testing.assert_allclose(proba, want, rtol=0, atol=1e-10)
    assert_same(got["prediction"], ref.classes_[want.argmax(axis=1)])  # labels
    assert (got["client"] == cid).all()
    # another site's data with this site's state: refused, nothing written
    other = fd.client_ids[1]
    res = CliRunner().invoke(app, ["predict", "--model", str(tmp_path / "out"), "--site-state",
                                   str(sites[0]), "--data", str(files[other]), "--out",
                                   str(tmp_path / "no.csv")])
    assert res.exit_code == 2
    assert f"holds client {other!r}, the site state" in res.output
    assert not (tmp_path / "no.csv").exists()


# ---------------------------------------------------------------------------------------------
# fedlatent flower app / local: seed, min-nodes, the extra
# ---------------------------------------------------------------------------------------------
def invoke(*args):
    from typer.testing import CliRunner

    from fedlatent.cli import app

    return CliRunner().invoke(app, ["flower", *map(str, args)])


def app_config(path):
    import tomllib

    with (path / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


def test_cli_app_seed_and_min_nodes_from_the_sites(tmp_path):
    from fedlatent.data.files import write_client_files

    fd, _ = fedgmm_case()
    write_client_files(fd, tmp_path / "parts")
    res = invoke("app", "gmm", "--params", '{"n_components": 2}', "--seed", 42,
                 "--data", tmp_path / "parts", "--out", tmp_path / "app")
    assert res.exit_code == 0, res.output
    config = app_config(tmp_path / "app")
    assert json.loads(config["params"])["random_state"] == 42
    assert config["min-nodes"] == 3 and config["resume"] is False
    res = invoke("app", "gmm", "--params", '{"n_components": 2}', "--out", tmp_path / "app2")
    assert res.exit_code == 0, res.output
    assert json.loads(app_config(tmp_path / "app2")["params"])["random_state"] == 0
    assert app_config(tmp_path / "app2")["min-nodes"] == 1
    assert "warning: --min-nodes not given and no --data to count the sites" in res.output


def test_cli_app_refuses_two_seeds(tmp_path):
    res = invoke("app", "gmm", "--params", '{"n_components": 2, "random_state": 1}', "--seed", 2,
                 "--out", tmp_path / "app")
    assert res.exit_code == 2
    assert "error: --seed 2 and --seed 1 of --params disagree; give it once" in res.output
    assert not (tmp_path / "app").exists()


@pytest.mark.parametrize("command", ["app", "local"])
def test_cli_without_the_flower_extra_says_what_to_install_and_writes_nothing(
        tmp_path, monkeypatch, command):
    import pandas as pd

    monkeypatch.setitem(sys.modules, "flwr", None)
    pd.DataFrame({"a": [1.0, 2.0, 3.0], "c": ["x", "y", "x"]}).to_csv(tmp_path / "d.csv",
                                                                        index=False)
    extra = ["--data", tmp_path / "d.csv", "--client", "c"] if command == "local" else []
    res = invoke(command, "gmm", "--params", '{"n_components": 1}', *extra,
                 "--out", tmp_path / "out")
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: the Flower extra is not installed; install it with: pip install "
        "'fedlatent[flower]'"]
    assert not (tmp_path / "out").exists()


def test_cli_local_resume_without_a_checkpoint_starts_nothing(tmp_path):
    from fedlatent.data.files import write_client_files

    fd, _ = fedgmm_case()
    write_client_files(fd, tmp_path / "parts")
    res = invoke("local", "fedgmm", "--data", tmp_path / "parts", "--resume",
                 "--out", tmp_path / "out")
    assert res.exit_code == 2
    assert "--resume: there is no checkpoint" in res.output and "run without --resume" in \
        res.output
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# The node's data, cached as arrays in its site directory
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gmm", "fedgmm", "hlcr", "lcr"])
def test_node_data_cache_reads_back_exactly_and_follows_the_file(name, tmp_path):
    from flower_cases import CASES

    from fedlatent.data.files import read_client_file, write_client_files
    from fedlatent.runtime import flower_site as fs

    fd, _ = CASES[name]()
    cid = fd.client_ids[0]
    path = write_client_files(fd.subset([cid]), tmp_path / "data")[cid]
    site = tmp_path / "site"
    fs._DATA_CACHE.clear()
    first = fs._load_node_data(path, site)  # from the file; writes the cache
    assert (site / "data-cache.npz").exists() and (site / "data-cache.json").exists()
    fs._DATA_CACHE.clear()
    cached = fs._cached(path, site)
    assert cached is not None
    want = read_client_file(path)
    for got in (first, cached):
        assert got.client_ids == [cid] and got.feature_names == want.feature_names
        assert (got.target_name, got.entity_name) == (want.target_name, want.entity_name)
        for attr in ("X", "y", "entity"):
            a, b = getattr(got[cid], attr), getattr(want[cid], attr)
            assert (a is None) == (b is None), attr
            if a is not None:
                assert a.dtype == b.dtype, attr
                assert_same(a, b, err_msg=attr)  # the values cached, read back
    # the data file changes: the cache is not used, and is rewritten on the next load
    other = fd.client_ids[1]
    write_client_files(fd.subset([other]), tmp_path / "new")
    path.write_bytes(next((tmp_path / "new").glob("*.parquet")).read_bytes())
    assert fs._cached(path, site) is None
    fs._DATA_CACHE.clear()
    assert fs._load_node_data(path, site).client_ids == [other]
    assert fs._cached(path, site).client_ids == [other]


def test_run_app_reports_every_round_while_it_waits(tmp_path):
    import subprocess
    import threading
    import time

    from fedlatent.runtime.flower_local import _wait_reporting

    status = tmp_path / "status.json"

    def server():
        for k in (1, 2, 3):
            time.sleep(0.6)
            status.write_text(json.dumps({"round": k, "last": {
                "objective": -1.5 * k, "participants": 3, "missing": ["b"] if k == 2 else [],
                "seconds": 0.25}}))

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2.6)"])
    t = threading.Thread(target=server)
    t.start()
    seen = []
    _wait_reporting(proc, time.monotonic() + 60, status, seen.append)
    t.join()
    assert [s["round"] for s in seen] == [1, 2, 3]
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            _wait_reporting(slow, time.monotonic() + 0.5, status, None)
    finally:
        slow.kill()
        slow.wait()


def test_flower_local_prints_one_line_per_round(capsys):
    from fedlatent.cli.flower_run import _print_round

    _print_round({"round": 2, "last": {"objective": -1.25, "participants": 2,
                                       "missing": ["site-1"], "seconds": 3.5}})
    assert capsys.readouterr().out == ("round 2: objective -1.25, 2 clients answered "
                                       "(missing site-1), 3.5 s\n")
