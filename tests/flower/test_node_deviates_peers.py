"""The three "Why" cases of issue 21 that test_node_deviates.py leaves out, played through a
Flower node's own code path (``flower_site.serve``: a fresh ClientNode per message, Flower's
``context.state``, the site directory on disk; no Ray, no SuperLink):

- a private fit killed and resumed (the server app over a grid answered by ``serve``): the
  resumed run does not re-run the private start, the node accepts it and spends no more than
  its plan, a restored old state does not roll its ledger back, and a second fit beyond the data
  set's lifetime budget is refused before any release;
- a server substituting a peer's key-agreement key in the secure-aggregation set-up: the node
  aborts naming the peer, records it on its ledger and masks nothing;
- a server handing a SEC site crafted models no rostered site signed: refused, recorded, no
  loss.
"""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402
from fedlatent.engine.privacy import DifferentialPrivacy  # noqa: E402
from fedlatent.engine.privacy.enforce import policy_to_json  # noqa: E402
from fedlatent.engine.protocol.messages import ERROR_KEY, pack  # noqa: E402
from fedlatent.engine.rounds.loop import FederatedFitError  # noqa: E402
from fedlatent.engine.site import Ledger, SitePolicy  # noqa: E402
from fedlatent.engine.site.keys import Roster, SiteIdentity, SiteKeys  # noqa: E402
from fedlatent.models.gmm.math import compute_precision_cholesky  # noqa: E402
from fedlatent.models.gmm.model import GMMModel  # noqa: E402

pytestmark = pytest.mark.flower

DELTA = 1e-5
RUN = json.dumps({"estimator": "FederatedGaussianMixture", "params": {"n_components": 2}})


def _serve(fd, state, site, policy, method, msg, run=RUN):
    """What one ClientApp process does with one message of a deployed (not simulated) node."""
    from fedlatent.runtime.flower_site import RUN as RUN_KEY
    from fedlatent.runtime.flower_site import serve

    return serve(fd, state, method, {RUN_KEY: run, **msg}, site, policy=policy,
                 dataset="study", simulation=False)


def _rules(site, cid="c0"):
    return [e["rule"] for e in Ledger(site, cid).of("refusal")]


def _gmm_params(shift=0.0):
    cov = np.repeat(np.eye(2)[None] * 2.0, 2, 0)
    return {"weights": np.full(2, 0.5), "means": np.array([[-1.0, 0.0], [2.0, 1.0]]) + shift,
            "precisions_cholesky": compute_precision_cholesky(cov, "full"),
            "center": np.zeros(2)}


# ---- 1. a private fit killed and resumed -----------------------------------------------------
class Stop(BaseException):
    """The server process dies in the middle of a round."""


class Grid:
    """Flower nodes 1..n, each answering with ``serve`` under ``policy``, its own site directory
    and a fresh ``context.state`` (a new Grid: every process of the run is gone, the site
    directories stay). ``stop_at_round``: every node answers that round's E-step, then the
    server dies before it reads a reply."""

    def __init__(self, fd, sites, policy, stop_at_round=None):
        from flwr.app import RecordDict

        self.fd, self.sites, self.policy, self.stop = fd, sites, policy, stop_at_round
        self.states = {i + 1: RecordDict() for i in range(fd.n_clients)}
        self.replies: dict[str, object] = {}
        self.sent: list[str] = []
        self.run = None  # the run's description the server sends (fedlatent.run)

    def get_node_ids(self):
        return list(self.states)

    def push_messages(self, msgs):
        from fedlatent.runtime import flower as fw
        from fedlatent.runtime.flower_site import serve

        ids, stop = [], False
        for m in msgs:
            nid = int(m.metadata.dst_node_id)
            d = fw.decode(m.content)
            method = str(d.pop(fw._METHOD))
            self.sent.append(str(d.get("query", method)))
            self.run = d.get("fedlatent.run", self.run)
            stop = stop or (method == "estep" and int(d["round"]) == self.stop)
            reply = serve(self.fd.subset([self.fd.client_ids[nid - 1]]), self.states[nid],
                          method, d, self.sites[nid - 1], policy=self.policy, dataset="study",
                          simulation=False)
            rid = f"m{len(self.sent)}"
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
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def _private_fd():
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(40, 2)) * 3 + i for i in range(3)})


def _private_gmm(seed=0):
    return fl.FederatedGaussianMixture(2, random_state=seed, max_rounds=4, federation=fl.Federation(
        privacy=DifferentialPrivacy(1.0, DELTA, clip=5.0)))


def _fit(grid, est, out, resume=False):
    from fedlatent.runtime.flower import run_config_for, run_server

    config = run_config_for(est, out_dir=out, min_nodes=grid.fd.n_clients, resume=resume)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_server(grid, config)
    return grid


def test_a_killed_private_fit_resumes_on_the_node_within_its_plan(flower_task, tmp_path):
    from fedlatent.runtime.flower import load_result

    fd, policy = _private_fd(), SitePolicy(lifetime_epsilon=1.0, lifetime_delta=DELTA)
    sites = [tmp_path / f"s{i}.site" for i in range(3)]
    with pytest.raises(Stop):  # the sites answered round 3, the server died before reading it
        _fit(Grid(fd, sites, policy, stop_at_round=3), _private_gmm(), tmp_path / "out")
    resumed = _fit(Grid(fd, sites, policy), _private_gmm(), tmp_path / "out", resume=True)
    est = load_result(tmp_path / "out")
    assert est.n_iter_ == 4 and est.flower_status_["resumed_from"] == 2
    # no private start again (moments, hard_stats): rounds 3 and 4 only
    assert resumed.sent == (["describe"] * 3 + ["settings"] * 3  # the floors announced
                            + ["setup"] * 3 + ["estep"] * 6)
    plan = est.privacy_calibration_
    assert plan.releases == 6 and plan.epsilon == 1.0
    for i, site in enumerate(sites):
        ledger = Ledger(site, f"c{i}")
        (run,) = {e["run"] for e in ledger.of("plan")}
        assert [e["release"] for e in ledger.of("release")] == [1, 2, 3, 4, 5, 6]
        assert [e["round"] for e in ledger.of("replay")] == [3]  # round 3 asked again: kept
        spent = ledger.lifetime_epsilon("study", DELTA)
        assert spent == pytest.approx(est.privacy_spent_[0], rel=1e-9)
        assert spent <= plan.epsilon
        assert ledger.of("refusal") == []
    # the server restores node 1's state of round 3 (5 releases made) and asks a 7th release
    after = _serve(fd.subset(["c0"]), resumed.states[1], sites[0], policy, "estep",
                   {"seed": 0, "round": 5, "mode": "full", "fedlatent.restore": 3,
                    **pack("params", _gmm_params())}, run=resumed.run)
    assert f"would be release 7 of run {run!r}, whose plan has 6" in after[ERROR_KEY]
    assert len(Ledger(sites[0], "c0").of("release")) == 6
    # a second fit on the same data set: beyond the lifetime budget, refused at its setup
    second = Grid(fd, sites, policy)
    with pytest.raises(FederatedFitError, match=r"site 'c0' refused \(privacy.lifetime-epsilon"
                                                 r"\): this plan would bring data set 'study' "
                                                 r"to epsilon="):
        _fit(second, _private_gmm(seed=1), tmp_path / "out2")
    assert "estep" not in second.sent and "moments" not in second.sent
    for i, site in enumerate(sites):
        ledger = Ledger(site, f"c{i}")
        assert len(ledger.of("release")) == 6  # nothing released for the second fit
        assert _rules(site, f"c{i}")[-1] == "privacy.lifetime-epsilon"


# ---- 2. substituted secure-aggregation keys --------------------------------------------------
PEERS = ("c0", "a", "b")
SECAGG = {"threshold": 2, "scale": 2.0**20, "bound": 10.0, "slots": 2, "run": "sa-1",
          "round": 0, "participation": 1.0}


def _sited(tmp_path, cid, keys, roster=True):
    """A policy file naming the site's key (and the consortium's roster): a SuperNode's."""
    keys[cid].save(tmp_path / "key.pem")
    text = '[site]\nsigning-key = "key.pem"\n'
    if roster:
        (tmp_path / "roster.json").write_text(
            Roster({u: k.public_key for u, k in keys.items()}).to_json())
        text += 'roster = "roster.json"\n'
    (tmp_path / "policy.toml").write_text(text)
    return SitePolicy.load(tmp_path / "policy.toml")


@pytest.mark.parametrize(("forge", "why"), [
    ("unsigned", r"carries no signature"),
    ("copied", r"does not verify against its rostered key: it was substituted"),
], ids=["unsigned-key", "real-signature-beside-a-substituted-key"])
def test_a_substituted_peer_key_aborts_the_node_naming_the_peer(tmp_path, forge, why):
    from flwr.app import RecordDict

    from fedlatent.engine.secagg import (
        FixedPoint,
        SecAggClient,
        SecAggConfig,
        SecAggServer,
        SecureAggregationError,
    )
    from fedlatent.engine.secagg.protocol import as_u8

    keys = {u: SiteKeys.generate() for u in PEERS}
    policy = _sited(tmp_path, "c0", keys)
    fd = fl.FederatedDataset.from_arrays(
        {"c0": np.random.default_rng(0).normal(size=(40, 2)) * 3})
    state, site = RecordDict(), tmp_path / "site"

    def node(method, msg):
        return _serve(fd, state, site, policy, method, msg)

    setup = {"model": "gmm", "model_config": json.dumps(GMMModel(2, "full", 1e-6).get_config()),
             "disclosure": policy_to_json(fl.DisclosurePolicy(count_scope="aggregate")),
             "run": "r1"}
    assert ERROR_KEY not in node("setup", setup)
    config = SecAggConfig(2, FixedPoint(scale=2.0**20, bound=10.0), slots=2)
    peers = {u: SecAggClient(u, config, run="sa-1") for u in ("a", "b")}  # 'b': the server's
    commits = {"c0": node("secagg", {"step": "keys", **SECAGG})}
    commits.update({u: c.commitment() for u, c in peers.items()})
    server = SecAggServer(config, run="sa-1")
    close = server.collect_commitments(commits)
    announced = {"c0": node("secagg", {"step": "open", "closed": as_u8(close["closed"]),
                                       "n": close["n"]})}
    announced["a"] = peers["a"].open(close["closed"], close["n"], signer=keys["a"])
    announced["b"] = peers["b"].open(close["closed"], close["n"])  # the server's own keys
    if forge == "copied":  # the real 'b' signs its own keys; the server copies the signature
        real = SecAggClient("b", config, run="sa-1")
        real.commitment()
        announced["b"]["signature"] = real.open(close["closed"], 3, signer=keys["b"])["signature"]
    relayed = server.collect_keys(announced)
    with pytest.raises(SecureAggregationError, match=rf"client 'c0': peer 'b' is not "
                                                     rf"authenticated: .*{why}"):
        node("secagg", {"step": "roster", **relayed})  # the ClientApp sends this back
    (refusal,) = Ledger(site, "c0").of("refusal")
    assert refusal["rule"] == "secagg.peer" and "peer 'b' is not authenticated" in \
        refusal["reason"]
    # the server goes on as if the node had dealt its shares: it masks nothing
    with pytest.raises(SecureAggregationError, match=r"call receive_peer_keys first"):
        node("secagg", {"step": "shares"})
    masked = {"seed": 0, "round": 1, "mode": "full", **pack("params", _gmm_params()),
              "secagg/slot": 0, "secagg/participants": json.dumps(list(PEERS)),
              "secagg/round": 1, "secagg/exchange": "estep", "secagg/unit": 1 / 120,
              "secagg/weight": 1.0}
    with pytest.raises(SecureAggregationError, match=r"call receive_peer_keys first"):
        node("estep", masked)
    assert not any(e["kind"] == "answer" for e in Ledger(site, "c0").entries)


@pytest.mark.parametrize("lacks", ["no-policy", "a-key-but-no-roster"])
def test_a_deployed_node_without_a_pinned_roster_refuses_secure_aggregation(tmp_path, lacks):
    """Issue 37: without a roster of the consortium's keys the server could stand in for every
    peer (its own commitments, keys and confirmations) and unmask the site's replies, as it did
    on a node with no policy file (2.9e-10 in the issue); a deployed node now refuses the key
    set-up, naming the fix, before any secret exists. With the roster it commits."""
    from flwr.app import RecordDict

    keys = {u: SiteKeys.generate() for u in PEERS}
    policy = None if lacks == "no-policy" else _sited(tmp_path, "c0", keys, roster=False)
    fd = fl.FederatedDataset.from_arrays(
        {"c0": np.random.default_rng(0).normal(size=(40, 2)) * 3})
    state = RecordDict()

    def node(method, msg, policy=policy, site=tmp_path / "site"):
        return _serve(fd, state, site, policy, method, msg)

    setup = {"model": "gmm", "model_config": json.dumps(GMMModel(2, "full", 1e-6).get_config()),
             "disclosure": policy_to_json(fl.DisclosurePolicy(count_scope="aggregate")),
             "run": "r1"}
    assert ERROR_KEY not in node("setup", setup)
    with pytest.raises(ValueError, match=r"site 'c0' refuses secure aggregation: a deployed site "
                       r"needs a pinned roster .*fedlatent site roster roster.json "
                       r"SITE=DIR/site-key.pub"):
        node("secagg", {"step": "keys", **SECAGG})
    assert "fedlatent.secagg" not in state  # no secret was drawn
    pinned = _sited(tmp_path / "pinned", "c0", keys)
    state = RecordDict()
    assert ERROR_KEY not in node("setup", setup, policy=pinned, site=tmp_path / "pinned" / "s")
    reply = node("secagg", {"step": "keys", **SECAGG}, policy=pinned,
                 site=tmp_path / "pinned" / "s")
    assert sorted(reply) == ["commit"] and reply["commit"].shape == (32,)


# ---- 3. injected SEC models ------------------------------------------------------------------
SEC_SITES = ("victim", "mallory", "other")


def _stumps(n):
    """``n`` crafted depth-1 trees (an allowed type): with enough of them the losses give back
    every row (tests/models/sec/test_sec_signed.py plays the whole attack)."""
    from sklearn.tree import DecisionTreeRegressor

    from fedlatent.models.sec import dumps_model

    ts = np.linspace(0.1, 0.9, n)
    return [dumps_model(DecisionTreeRegressor(max_depth=1).fit([[t - 1e-7], [t + 1e-7]],
                                                               [0.0, 1.0])) for t in ts]


def _sec_node(tmp_path, policy_extra="", roster=True):
    """The victim's node: its data, its policy file (key, roster), a fresh state."""
    from flwr.app import RecordDict

    keys = {s: SiteKeys.generate() for s in SEC_SITES}
    policy = _sited(tmp_path, "victim", keys, roster=roster)
    if policy_extra:
        text = (tmp_path / "policy.toml").read_text() + policy_extra
        (tmp_path / "policy.toml").write_text(text)
        policy = SitePolicy.load(tmp_path / "policy.toml")
    rng = np.random.default_rng(7)
    x = (rng.permutation(20) + 0.5) / 20
    fd = fl.FederatedDataset.from_arrays({"victim": (x[:, None], rng.normal(3.0, 2.0, 20))})
    state, site = RecordDict(), tmp_path / "site"
    run = json.dumps({"estimator": "SEC", "params": {}})

    def node(method, msg):
        return _serve(fd, state, site, policy, method, msg, run=run)

    assert ERROR_KEY not in node("setup", {"model": "sec", "run": "fit-1",
                                           "model_config": json.dumps({"standardize": False})})
    return node, keys, site


def _exchange(models, offset=0, signer=None, keys=None, run="fit-1"):
    from fedlatent.models.sec.signed import model_signature

    msg = {"query": "exchange", "seed": 0, "offset": offset, "run": run}
    for k, b in enumerate(models):
        msg[f"model/{k}"] = b
        if signer is not None:
            msg[f"signer/{k}"] = signer
            msg[f"signature/{k}"] = model_signature(SiteIdentity(keys[signer], site=signer), b,
                                                    run)
    return msg


def test_crafted_sec_models_no_rostered_site_signed_get_no_loss_from_the_node(tmp_path):
    node, keys, site = _sec_node(tmp_path)
    models = _stumps(4)
    unsigned = node("query", _exchange(models[:2]))
    assert "loss" not in unsigned
    assert unsigned[ERROR_KEY].startswith(
        "client 'victim': site 'victim' refused (sec.signature): model 0 of the exchange claims "
        "to come from site '', which is not in the pinned roster (3 sites)")
    # signed by the server's own key under a rostered site's name: does not verify
    forged = _exchange(models[2:], offset=2, signer="other", keys={"other": SiteKeys.generate()})
    reply = node("query", forged)
    assert "loss" not in reply
    assert "refused (sec.signature): model 2 of the exchange from site 'other' does not " \
           "verify" in reply[ERROR_KEY]
    assert _rules(site, "victim") == ["sec.signature", "sec.signature"]
    assert Ledger(site, "victim").of("sec-model") == []


def test_the_sec_quota_and_the_roster_hold_across_the_nodes_processes(tmp_path):
    node, keys, site = _sec_node(tmp_path / "quota")  # quota: one model per rostered site, 3
    models = _stumps(4)
    assert np.asarray(node("query", _exchange(models[:3], signer="mallory", keys=keys))[
        "loss"]).shape == (3,)
    fourth = node("query", _exchange(models[3:], offset=3, signer="mallory", keys=keys,
                                     run="sec-2"))  # a new label does not reset the count
    assert "loss" not in fourth and "refused (sec.quota): the exchange asks for 1 more " \
        "distinct models in run 'fit-1', beyond its quota of 3 per run" in fourth[ERROR_KEY]
    assert [e["signer"] for e in Ledger(site, "victim").of("sec-model")] == ["mallory"] * 3
    lone, _, lone_site = _sec_node(tmp_path / "lone", roster=False)  # a key, no roster
    reply = lone("query", _exchange(models[:1]))
    assert "loss" not in reply and "refused (sec.roster): it pins no roster" in reply[ERROR_KEY]
    assert _rules(lone_site, "victim") == ["sec.roster"]
