"""A server that deviates from the protocol, against sites that hold a policy (issue 21).

Each "Why" case of issue 21 (except keys and SEC models) is played by a server that sends the
sites the messages a deviating server would: it drops the disclosure floor, re-plans the
privacy budget, raises epsilon, leaves DP out, sets the noise seed, restores a site's state,
re-asks a question, names another file. Every attempt is refused with a one-line reason
(site, rule, fix), written to the site's ledger, and the server learns nothing the policy does
not allow.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.privacy import DifferentialPrivacy
from fedlatent.engine.privacy.disclosure import effective
from fedlatent.engine.privacy.enforce import policy_to_json
from fedlatent.engine.protocol.exchange import setup_clients
from fedlatent.engine.protocol.messages import ERROR_KEY, pack, unpack
from fedlatent.engine.rounds.loop import FederatedFitError
from fedlatent.engine.site import SitePolicy
from fedlatent.engine.site.ledger import read_ledger
from fedlatent.engine.site.policy import PolicyError
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.gmm.math import compute_precision_cholesky
from fedlatent.models.gmm.model import GMMModel
from tolerance import assert_same

DELTA = 1e-5
OFF = fl.DisclosurePolicy.off()


def _fd(tiny=False):
    rng = np.random.default_rng(0)
    parts = {f"c{i}": rng.normal(size=(40, 2)) * 3 + i for i in range(3)}
    if tiny:
        parts["tiny"] = np.array([[1.25, -0.5]])
    return fl.FederatedDataset.from_arrays(parts)


def _params():
    cov = np.repeat(np.eye(2)[None] * 2.0, 2, 0)
    return {"weights": np.full(2, 0.5), "means": np.array([[-1.0, 0.0], [2.0, 1.0]]),
            "precisions_cholesky": compute_precision_cholesky(cov, "full"),
            "center": np.zeros(2)}


def _setup_msg(disclosure=None, dp=None, releases=0, run="r1", model="gmm"):
    msg = {"model": model, "model_config": json.dumps(GMMModel(2, "full", 1e-6).get_config()),
           "disclosure": policy_to_json(fl.DisclosurePolicy() if disclosure is None
                                        else disclosure), "run": run}
    if dp is not None:
        msg["privacy"] = json.dumps(dp.to_config())
        msg["privacy_releases"] = int(releases)
    return msg


class Server:
    """A server that sends whatever it likes to the sites of an in-process runtime."""

    def __init__(self, fd, policy, **kw):
        self.rt = InProcessRuntime(fd, batched=False, policies=policy, **kw)

    def send(self, method, msg, clients=None):
        ids = list(self.rt.client_ids if clients is None else clients)
        return self.rt.call(ids, method, {c: dict(msg) for c in ids})

    def estep(self, k, clients=None):
        return self.send("estep", {"seed": 0, "round": k, "mode": "full",
                                   **pack("params", _params())}, clients)

    def ledger(self, cid):
        return self.rt.nodes[cid].guard.ledger


def _errors(replies):
    return {c: r.get(ERROR_KEY) for c, r in replies.items()}


def _refusals(ledger, rule):
    return [e for e in ledger.entries if e["kind"] == "refusal" and e.get("rule") == rule]


# ---- disclosure control is the site's ------------------------------------------------------
def test_a_setup_dropping_the_disclosure_floor_is_refused_naming_site_rule_and_fix():
    server = Server(_fd(tiny=True), SitePolicy())
    replies = server.send("setup", _setup_msg(disclosure=OFF))
    assert _errors(replies)["tiny"] == (
        "site 'tiny' refused (disclosure): the server's disclosure policy is looser than the "
        "site's floor: min_records=0 (floor 3), min_records_per_block=0 (floor 3), "
        "max_parameters_per_record=inf (floor 0.33), tree_min_leaf=1 (floor 3), "
        "max_levels_density=inf (floor 0.33), allow_row_storing_learners=True (floor False); "
        "fix: send Federation(disclosure=...) at least as strict as the site's (a server adopts "
        "the floors the sites announce at setup)")
    # the server goes on as if it had been accepted: nothing comes back
    after = server.estep(0, ["tiny"])
    assert after["tiny"][ERROR_KEY].startswith("site 'tiny' refused (setup): estep asked "
                                               "before a setup it accepted")
    assert [e["rule"] for e in server.ledger("tiny").entries] == ["disclosure", "setup"]


def test_an_aggregate_count_scope_without_secure_aggregation_does_not_return_a_1_row_sites_row():
    aggregate = effective(fl.DisclosurePolicy(), True)
    server = Server(_fd(tiny=True), SitePolicy())  # the floor's scope is per client
    refused = server.send("setup", _setup_msg(disclosure=aggregate))["tiny"][ERROR_KEY]
    assert refused.startswith("client 'tiny': refused by the disclosure policy: min_records=3 "
                              "(it holds fewer records")
    # a site whose floor counts on the aggregate (it expects secure aggregation)
    server = Server(_fd(tiny=True), SitePolicy(disclosure=aggregate))
    replies = server.send("setup", _setup_msg(disclosure=aggregate))
    assert all(ERROR_KEY not in r for r in replies.values())  # a legitimate setup
    reply = server.estep(0, ["tiny"])["tiny"]  # ... but the reply is not masked
    assert reply[ERROR_KEY] == (
        "DisclosureRefused: client 'tiny': the statistic of this step is a sum over fewer than "
        "min_records=3 records (DataSHIELD nfilter.tab); it is not sent. Merge small clients "
        "or lower DisclosurePolicy(min_records=...); DisclosurePolicy.off() disables every rule")
    assert not any(k.startswith("delta/") for k in reply)


# ---- the privacy budget is the site's ----------------------------------------------------------
def test_a_second_setup_of_the_same_run_with_a_longer_plan_is_refused():
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0)
    server = Server(_fd(), SitePolicy())
    assert all(ERROR_KEY not in r for r in server.send("setup", _setup_msg(dp=dp, releases=4))
               .values())
    for k in range(1, 5):
        assert all(ERROR_KEY not in r for r in server.estep(k).values())
    again = server.send("setup", _setup_msg(dp=dp, releases=54))
    assert again["c0"][ERROR_KEY] == (
        "site 'c0' refused (plan): run 'r1' was set up with another plan (the plan of a run is "
        "fixed at its first setup: releases, exchanges, rounds); fix: start a new run; its "
        "releases count against the site's lifetime budget")
    fifth = server.estep(5)
    assert fifth["c0"][ERROR_KEY].startswith("site 'c0' refused (setup)")
    assert server.ledger("c0").releases("r1") == 4


def test_a_new_run_after_the_budget_is_spent_is_refused_by_the_lifetime_budget():
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0)
    server = Server(_fd(), SitePolicy(lifetime_epsilon=1.0, lifetime_delta=DELTA))
    server.send("setup", _setup_msg(dp=dp, releases=4))
    for k in range(1, 5):
        server.estep(k)
    again = server.send("setup", _setup_msg(dp=dp, releases=54, run="r2"))
    assert again["c1"][ERROR_KEY].startswith(
        "site 'c1' refused (privacy.lifetime-epsilon): this plan would bring data set "
        "'default' to epsilon=")
    assert "(spent so far 0.9999) above its lifetime budget 1.0" in again["c1"][ERROR_KEY]
    assert server.ledger("c1").releases("r2") == 0
    assert server.ledger("c1").lifetime_epsilon("default", DELTA) == pytest.approx(1.0, rel=1e-4)


@pytest.mark.parametrize(("policy", "dp", "rule"), [
    (SitePolicy(max_epsilon=2.0), DifferentialPrivacy(1e4, DELTA, clip=5.0),
     "(privacy.max-epsilon): epsilon=10000 above its ceiling 2.0; fix: ask for epsilon <= 2.0"),
    (SitePolicy(max_delta=1e-6), DifferentialPrivacy(1.0, 1e-3, clip=5.0),
     "(privacy.max-delta): delta=0.001 above its ceiling 1e-06; fix: ask for delta <= 1e-06"),
    (SitePolicy(privacy_required=True), None,
     "(privacy.required): the fit is not differentially private; fix: fit with "
     "Federation(privacy=DifferentialPrivacy(...))"),
    (SitePolicy(privacy_required=True, verified_suffices=True), None,  # until rounds are
     "(privacy.required): the fit is not differentially private; fix: fit with "  # verified
     "Federation(privacy=DifferentialPrivacy(...))"),
    (SitePolicy(), DifferentialPrivacy(1.0, DELTA, clip=5.0, noise_seed=3),
     "(privacy.noise-seed): a noise_seed lets whoever knows it remove the noise; the site "
     "draws its own; fix: drop noise_seed (only a site whose policy says simulation = true "
     "honours it)"),
    (SitePolicy(max_releases=10), DifferentialPrivacy(1.0, DELTA, clip=5.0),
     "(limits.max-releases): the plan has 54 releases, above its limit 10; fix: plan at most "
     "10 releases (fewer rounds)"),
    (SitePolicy(models=("lcr",)), None,
     "(answer.models): model 'gmm' is not one it answers; fix: fit one of ['lcr'], or ask the "
     "site's operator"),
], ids=["epsilon-1e4", "delta", "no-dp", "no-dp-nor-verified", "noise-seed", "releases",
        "model"])
def test_a_setup_below_the_sites_floor_is_refused_and_recorded(policy, dp, rule):
    server = Server(_fd(), policy)
    replies = server.send("setup", _setup_msg(dp=dp, releases=54))
    for c, r in replies.items():
        assert r[ERROR_KEY] == f"site {c!r} refused {rule}"
        assert len(_refusals(server.ledger(c), rule[1:rule.index(")")])) == 1
    assert all(ERROR_KEY in r for r in server.estep(1).values())  # and nothing after it


def test_a_simulation_site_honours_the_noise_seed_and_a_deployed_one_does_not_reuse_it():
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0, noise_seed=3)

    def first_reply(policy):
        server = Server(_fd(), policy)
        server.send("setup", _setup_msg(dp=dp, releases=2))
        return unpack(server.estep(1)["c0"], "delta")["sx"]

    # the same noise seed, the same operations on one machine: every bit the same
    assert_same(first_reply(SitePolicy(simulation=True)), first_reply(SitePolicy(simulation=True)))
    node = ClientNode("c0", _fd()["c0"])  # a node without a policy file: refused (issue 39)
    assert node.handle("setup", _setup_msg(dp=dp, releases=2))[ERROR_KEY].startswith(
        "site 'c0' refused (privacy.noise-seed)")
    assert node.privacy is None


def test_restoring_a_sites_state_does_not_roll_back_its_release_count(tmp_path):
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0)
    policy = SitePolicy(directory=tmp_path)
    server = Server(_fd(), policy)
    server.send("setup", _setup_msg(dp=dp, releases=3))
    before = {c: dict(n.state) for c, n in server.rt.nodes.items()}
    first = server.estep(1)
    for k in (2, 3):
        server.estep(k)
    for c, node in server.rt.nodes.items():  # the server restores every site's state
        node.state = dict(before[c])
    again = server.estep(1)  # the same question: the recorded answer, no fresh noise
    for c in again:
        # the recorded answer sent again, not recomputed: the same bytes
        assert_same(unpack(again[c], "delta")["sx"], unpack(first[c], "delta")["sx"])
    fourth = server.estep(4)
    assert "refused (privacy.plan): round 4's statistic would be release 4 of run 'r1', whose " \
           "plan has 3" in fourth["c2"][ERROR_KEY]
    assert len(_refusals(server.ledger("c2"), "privacy.plan")) == 1
    # a new process (a node rebuilt from the site directory) counts from the ledger too
    node = ClientNode("c2", _fd()["c2"], policy=SitePolicy(directory=tmp_path / "site-c2"))
    node.handle("setup", _setup_msg(dp=dp, releases=3))
    rep = node.handle("estep", {"seed": 0, "round": 5, "mode": "full",
                                **pack("params", _params())})
    assert "would be release 4 of run 'r1', whose plan has 3" in rep[ERROR_KEY]
    assert [e["release"] for e in read_ledger(tmp_path / "site-c2" / "ledger.jsonl")
            if e["kind"] == "release"] == [1, 2, 3]


# ---- one question, one answer --------------------------------------------------------------
def test_re_asking_moments_under_secure_aggregation_with_one_client_left_out_is_refused():
    from fedlatent.engine.secagg.secure import open_channel

    rng = np.random.default_rng(1)
    fd = fl.FederatedDataset.from_arrays({f"s{i}": rng.normal(size=(20, 2)) for i in range(5)})
    server = Server(fd, SitePolicy(disclosure=fl.DisclosurePolicy(count_scope="aggregate")))
    model = GMMModel(2, "full", 1e-6)
    n_units = setup_clients(server.rt, model, effective(fl.DisclosurePolicy(), True), run="r1")
    channel = open_channel(server.rt, fl.Federation(secure_aggregation=True), n_units, 3)
    ids = server.rt.client_ids
    ask = {"query": "moments", "seed": 0}
    full = channel.sum("query", {c: ask for c in ids}, round=0, exchange="moments")
    assert full["sums"]["n"] == pytest.approx(100.0)
    with pytest.raises(FederatedFitError, match="fewer than the threshold|threshold"):
        channel.sum("query", {c: ask for c in ids[:-1]}, round=0, exchange="moments#2")
    for c in ids[:-1]:
        (ref,) = _refusals(server.ledger(c), "one-answer")
        assert ref["reason"] == (
            f"site {c!r} refused (one-answer): moments of round 0 of run 'r1' was answered "
            "already (a second answer to another question, or under other masks, lets the server "
            "difference the two); fix: a server asks each question once")


def test_a_setup_replayed_as_a_flower_node_stores_it_is_the_same_plan():
    server = Server(_fd(), SitePolicy())
    server.send("setup", _setup_msg())
    stored = {**_setup_msg(), "privacy": "", "privacy_releases": 0}  # flower_site's record
    assert all(ERROR_KEY not in r for r in server.send("setup", stored).values())
    assert len(server.ledger("c0").of("plan")) == 1


def test_a_round_asked_again_with_other_parameters_is_refused():
    server = Server(_fd(), SitePolicy())
    server.send("setup", _setup_msg())
    server.estep(1)
    msg = {"seed": 0, "round": 1, "mode": "full", **pack("params", {**_params(),
                                                                    "means": np.zeros((2, 2))})}
    again = server.send("estep", msg)
    assert again["c0"][ERROR_KEY].startswith("site 'c0' refused (one-answer): estep of round 1")


# ---- what the site answers ---------------------------------------------------------------------
@pytest.mark.parametrize(("policy", "method", "msg", "rule"), [
    (SitePolicy(exchanges=("estep",)), "query", {"query": "kmeans", "k": 2, "min_points": 1},
     "(answer.exchanges): exchange 'kmeans' is not one it answers; fix: use only ['estep'], "
     "or ask the site's operator"),
    (SitePolicy(secure_aggregation_required=True), "estep",
     {"seed": 0, "round": 1, "mode": "full", **pack("params", _params())},
     "(secure-aggregation.required): estep is not masked; fix: fit with "
     "Federation(secure_aggregation=True)"),
    (SitePolicy(max_rounds=2), "estep",
     {"seed": 0, "round": 3, "mode": "full", **pack("params", _params())},
     "(limits.max-rounds): round 3 is beyond its limit 2; fix: plan at most 2 rounds"),
    (SitePolicy(max_message_bytes=100), "estep",
     {"seed": 0, "round": 1, "mode": "full", **pack("params", _params())},
     "(limits.max-message-bytes): the message holds 134 bytes, above its limit 100; fix: send "
     "smaller messages"),
], ids=["exchange", "secagg", "rounds", "bytes"])
def test_a_message_outside_what_the_site_answers_is_refused(policy, method, msg, rule):
    server = Server(_fd(), policy)
    server.send("setup", _setup_msg())
    replies = server.send(method, msg)
    for c, r in replies.items():
        assert r[ERROR_KEY] == f"site {c!r} refused {rule}"


# ---- the server names a data set, never a file ---------------------------------------------
def _context(tmp_path, name, policy_path=None):
    nc = {"data-path": str(tmp_path)}
    if policy_path is not None:
        nc["policy-path"] = str(policy_path)
    return SimpleNamespace(node_config=nc, run_config={"data-name": name})


def test_only_the_sites_data_sets_are_read_under_a_policy(tmp_path):
    pytest.importorskip("flwr")
    from fedlatent.runtime.flower_site import _node_data_path, node_policy

    (tmp_path / "site.toml").write_text('[datasets]\nstudy = "data/study.parquet"\n')
    ctx = _context(tmp_path, "study", tmp_path / "site.toml")
    policy = node_policy(ctx.node_config)
    assert _node_data_path(ctx, None, policy) == tmp_path / "data" / "study.parquet"
    with pytest.raises(PolicyError, match=r"data set 'other' is not one this site holds; "
                                          r"known: \['study'\]"):
        _node_data_path(_context(tmp_path, "other"), None, policy)


def test_a_refusal_lists_every_violated_rule_at_once_with_its_fix():
    """Issue 39: one setup, one refusal naming every rule (not one rule per try)."""
    from fedlatent.engine.site.guard import refusal_rules
    from fedlatent.engine.site.report import report_rows

    policy = SitePolicy(disclosure=fl.DisclosurePolicy(min_records=5), max_epsilon=1.0,
                        models=("lcr",))
    server = Server(_fd(), policy)
    dp = DifferentialPrivacy(2.0, DELTA, clip=5.0, noise_seed=1)
    text = server.send("setup", _setup_msg(dp=dp, releases=4))["c0"][ERROR_KEY]
    assert text == (
        "site 'c0' refused (answer.models): model 'gmm' is not one it answers; fix: fit one of "
        "['lcr'], or ask the site's operator; also (disclosure): the server's disclosure policy "
        "is looser than the site's floor: min_records=3 (floor 5); fix: send Federation("
        "disclosure=...) at least as strict as the site's (a server adopts the floors the "
        "sites announce at setup); also (privacy.max-epsilon): epsilon=2 above its ceiling "
        "1.0; fix: ask for epsilon <= 1.0; also (privacy.noise-seed): a noise_seed lets "
        "whoever knows it remove the noise; the site draws its own; fix: drop noise_seed (only "
        "a site whose policy says simulation = true honours it)")
    rules = ["answer.models", "disclosure", "privacy.max-epsilon", "privacy.noise-seed"]
    assert refusal_rules(text) == rules
    (entry,) = server.ledger("c0").of("refusal")
    assert entry["rules"] == rules
    (row,) = report_rows(server.ledger("c0").entries)
    assert row[-1] == ", ".join(f"{r} x1" for r in sorted(rules))
