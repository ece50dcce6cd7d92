"""A node without a policy file holds the library's default site policy (issue 39, item 1).

Each case of issue 39's first "why" is played by a server against ``ClientNode``s built without
a policy (as a deployed SuperNode without ``policy-path`` is): it re-asks a question under
other masks, re-plans a run, raises epsilon in a second setup, sets the noise seed, drops the
disclosure floor, restores a site's state after a crash. Every attempt is refused with a
one-line reason (site, rule, fix); the in-process runtime, which holds every site itself,
relaxes the policy explicitly (``SitePolicy.for_simulation``).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.privacy import DifferentialPrivacy
from fedlatent.engine.privacy.disclosure import effective
from fedlatent.engine.privacy.enforce import policy_to_json
from fedlatent.engine.protocol.exchange import setup_clients
from fedlatent.engine.protocol.messages import ERROR_KEY, REFUSED_KEY, pack, unpack
from fedlatent.engine.rounds.loop import FederatedFitError
from fedlatent.engine.site import SitePolicy
from fedlatent.engine.site.policy import PolicyError
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.gmm.math import compute_precision_cholesky
from fedlatent.models.gmm.model import GMMModel
from tolerance import assert_same

DELTA = 1e-5


def _fd(tiny=False, n=40):
    rng = np.random.default_rng(0)
    parts = {f"c{i}": rng.normal(size=(n, 2)) * 3 + i for i in range(3)}
    if tiny:
        parts["tiny"] = np.array([[1.25, -0.5]])
    return fl.FederatedDataset.from_arrays(parts)


def _params():
    cov = np.repeat(np.eye(2)[None] * 2.0, 2, 0)
    return {"weights": np.full(2, 0.5), "means": np.array([[-1.0, 0.0], [2.0, 1.0]]),
            "precisions_cholesky": compute_precision_cholesky(cov, "full"),
            "center": np.zeros(2)}


def _setup(disclosure=None, dp=None, releases=0, run="r1"):
    msg = {"model": "gmm", "model_config": json.dumps(GMMModel(2, "full", 1e-6).get_config()),
           "disclosure": policy_to_json(disclosure or fl.DisclosurePolicy()), "run": run}
    if dp is not None:
        msg["privacy"] = json.dumps(dp.to_config())
        msg["privacy_releases"] = int(releases)
    return msg


def _estep(k):
    return {"seed": 0, "round": k, "mode": "full", **pack("params", _params())}


class BareSites(InProcessRuntime):
    """Sites as a deployment has them: each a ``ClientNode`` built without a policy."""

    sites_relaxed = False  # (they announce the library's default floors)

    def __init__(self, fd, **kw):
        super().__init__(fd, batched=False, **kw)
        for c in fd.client_ids:  # (the runtime's own nodes would hold the simulation policy)
            self._nodes[c] = ClientNode(c, fd[c], source=fd)

    def send(self, method, msg, clients=None):
        ids = list(self.client_ids if clients is None else clients)
        return self.call(ids, method, {c: dict(msg) for c in ids})


def test_a_node_without_a_policy_holds_the_librarys_default_and_a_simulation_relaxes_it():
    node = ClientNode("c0", _fd()["c0"])
    assert node.guard is not None and node.guard.policy == SitePolicy()
    assert node.own_disclosure == fl.DisclosurePolicy() and not node.honour_noise_seed
    held = InProcessRuntime(_fd()).nodes["c0"]  # the runtime holds every site: relaxed
    assert held.guard is None and held.own_disclosure is None and held.honour_noise_seed
    assert SitePolicy.for_simulation().relaxed and not SitePolicy().relaxed


def test_a_moments_query_re_asked_with_a_client_left_out_is_refused():
    from fedlatent.engine.secagg.secure import open_channel

    rng = np.random.default_rng(1)
    fd = fl.FederatedDataset.from_arrays({f"s{i}": rng.normal(size=(20, 2)) for i in range(5)})
    rt = BareSites(fd)
    n_units = setup_clients(rt, GMMModel(2, "full", 1e-6), effective(fl.DisclosurePolicy(), True),
                            run="r1")
    channel = open_channel(rt, fl.Federation(secure_aggregation=True), n_units, 3)
    ids, ask = rt.client_ids, {"query": "moments", "seed": 0}
    assert channel.sum("query", {c: ask for c in ids}, round=0,
                       exchange="moments")["sums"]["n"] == pytest.approx(100.0)
    with pytest.raises(FederatedFitError, match="threshold"):  # the left-out one's totals
        channel.sum("query", {c: ask for c in ids[:-1]}, round=0, exchange="moments#2")
    for c in ids[:-1]:
        (refusal,) = rt.nodes[c].guard.ledger.of("refusal")
        assert refusal["rule"] == "one-answer"


@pytest.mark.parametrize(("second", "rule"), [
    ({"releases": 54}, "plan"), ({"dp": DifferentialPrivacy(1e4, DELTA, clip=5.0)}, "plan")],
    ids=["longer-plan", "epsilon-1e4"])
def test_a_second_setup_of_a_run_with_another_plan_is_refused(second, rule):
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0)
    rt = BareSites(_fd())
    assert all(ERROR_KEY not in r for r in rt.send("setup", _setup(dp=dp, releases=4)).values())
    for k in range(1, 5):
        assert all(ERROR_KEY not in r for r in rt.send("estep", _estep(k)).values())
    again = rt.send("setup", _setup(**{"dp": dp, "releases": 4, **second}))
    assert again["c0"][ERROR_KEY].startswith(f"site 'c0' refused ({rule}): run 'r1' was set up "
                                             "with another plan")
    assert rt.send("estep", _estep(5))["c0"][ERROR_KEY].startswith("site 'c0' refused (setup)")
    assert rt.nodes["c0"].guard.ledger.releases("r1") == 4


def test_a_servers_noise_seed_is_refused():
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0, noise_seed=3)
    replies = BareSites(_fd()).send("setup", _setup(dp=dp, releases=2))
    assert replies["c1"][ERROR_KEY] == (
        "site 'c1' refused (privacy.noise-seed): a noise_seed lets whoever knows it remove the "
        "noise; the site draws its own; fix: drop noise_seed (only a site whose policy says "
        "simulation = true honours it)")


def test_a_setup_turning_disclosure_off_does_not_get_a_one_row_sites_row():
    rt = BareSites(_fd(tiny=True))
    replies = rt.send("setup", _setup(disclosure=fl.DisclosurePolicy.off()))
    assert replies["tiny"][ERROR_KEY].startswith(
        "site 'tiny' refused (disclosure): the server's disclosure policy is looser than the "
        "site's floor: min_records=0 (floor 3), min_records_per_block=0 (floor 3)")
    after = rt.send("estep", _estep(1), ["tiny"])["tiny"]
    assert set(after) == {ERROR_KEY, REFUSED_KEY}  # nothing but the refusal


def test_a_crash_and_restore_neither_rolls_the_release_count_back_nor_gets_fresh_noise():
    dp = DifferentialPrivacy(1.0, DELTA, clip=5.0)
    rt = BareSites(_fd())
    rt.send("setup", _setup(dp=dp, releases=3))
    before = {c: dict(n.state) for c, n in rt.nodes.items()}
    first = rt.send("estep", _estep(1))
    for k in (2, 3):
        rt.send("estep", _estep(k))
    for c, node in rt.nodes.items():  # the server restores every site's state
        node.state = dict(before[c])
    again = rt.send("estep", _estep(1))  # the recorded answer, the same bytes
    for c in again:
        assert_same(unpack(again[c], "delta")["sx"], unpack(first[c], "delta")["sx"])
    fourth = rt.send("estep", _estep(4))
    assert ("refused (privacy.plan): round 4's statistic would be release 4 of run 'r1', whose "
            "plan has 3") in fourth["c2"][ERROR_KEY]
    assert [e["release"] for e in rt.nodes["c2"].guard.ledger.of("release")] == [1, 2, 3]


def test_a_lifetime_budget_without_a_directory_is_warned_about_and_refused_when_deployed(
        tmp_path):
    policy = SitePolicy(lifetime_epsilon=1.0, lifetime_delta=DELTA)
    with pytest.warns(UserWarning, match=r"site 'c0': its policy sets a lifetime budget .* but "
                                         r"no site directory, so its ledger would live in this "
                                         r"process only"):
        ClientNode("c0", _fd()["c0"], policy=policy)
    with warnings.catch_warnings():  # a directory: nothing to warn about
        warnings.simplefilter("error")
        ClientNode("c0", _fd()["c0"], policy=policy, site_dir=tmp_path, deployed=True)
    with pytest.raises(PolicyError, match=r"no site directory.*set \[site\] directory"):
        ClientNode("c0", _fd()["c0"], policy=policy, deployed=True)
