"""SEC under a site's own policy (issue 21, items 2, 3 and 5).

The "Why" attack: a server hands a SEC learner crafted stumps (an allowed type) and rebuilds
all 50 of its rows from the losses in 41 exchanges of 5 models (``test_sec_signed.py`` plays it
without a policy). A learner whose site holds a policy evaluates only models a rostered site
signed, of the types its policy trusts, within a per-run quota counted on its ledger (a fresh
process, as Flower starts for every message, or a new label in the exchange message does not
reset it); ``[sec] evaluate-others = false`` evaluates none. Every refusal names the site and
its rule and is on the site's ledger; the server gets no loss.
"""

import json

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression
from sklearn.tree import DecisionTreeRegressor

pytest.importorskip("cryptography")

from test_sec_signed import crafted as _crafted  # noqa: E402  (the attack's models, cached)

from fedlatent.data.dataset import FederatedDataset  # noqa: E402
from fedlatent.engine.node.client import ClientNode  # noqa: E402
from fedlatent.engine.protocol.messages import ERROR_KEY  # noqa: E402
from fedlatent.engine.site import SitePolicy  # noqa: E402
from fedlatent.engine.site.keys import Roster, SiteIdentity, SiteKeys  # noqa: E402
from fedlatent.models.sec import dumps_model  # noqa: E402
from fedlatent.models.sec.signed import model_signature  # noqa: E402

N, BATCH = 50, 5
KEYS = {s: SiteKeys.generate() for s in ("victim", "mallory", "other")}
ROSTER = Roster({s: k.public_key for s, k in KEYS.items()})
TREE = "sklearn.tree._classes.DecisionTreeRegressor"
LINEAR = "sklearn.linear_model._base.LinearRegression"


def victim(site_dir, policy=None, roster=ROSTER):
    """The victim's node as a process builds it (policy, key, roster, site directory)."""
    rng = np.random.default_rng(7)
    x = (rng.permutation(N) + rng.uniform(0.3, 0.7, N)) / N
    y = rng.normal(3.0, 2.0, N)
    fd = FederatedDataset.from_arrays({"victim": (x[:, None], y)})
    node = ClientNode("victim", fd["victim"], source=fd, site_dir=site_dir,
                      policy=SitePolicy() if policy is None else policy,
                      identity=SiteIdentity(KEYS["victim"], roster))
    reply = node.handle("setup", {"model": "sec", "run": "fit-1",
                                  "model_config": json.dumps({"standardize": False})})
    assert ERROR_KEY not in reply
    return node


def crafted():
    """The attack's 203 stumps (a zero model, then two leaf values per threshold of a 1/100
    grid), shared with ``test_sec_signed.py`` (dumping them costs seconds)."""
    return _crafted()[0]


def exchange(node, blobs, run="sec-1", signer=None):
    """Every exchange message the server sends, ``BATCH`` models each, whatever the replies;
    returns (losses received, error replies)."""
    losses, errors = [], []
    for s in range(0, len(blobs), BATCH):
        msg = {"query": "exchange", "seed": 0, "offset": s, "run": run}
        for k, b in enumerate(blobs[s:s + BATCH]):
            msg[f"model/{k}"] = b
            if signer is not None:
                msg[f"signer/{k}"] = signer
                msg[f"signature/{k}"] = model_signature(
                    SiteIdentity(KEYS[signer], site=signer), b, run)
        reply = node.handle("query", msg)
        if ERROR_KEY in reply:
            errors.append(reply[ERROR_KEY])
        else:
            losses.extend(np.asarray(reply["loss"]).tolist())
    return losses, errors


def rules(node):
    return [e["rule"] for e in node.guard.ledger.of("refusal")]


def test_the_crafted_stump_attack_is_refused_recorded_and_learns_nothing(tmp_path):
    node = victim(tmp_path)
    losses, errors = exchange(node, crafted())
    assert losses == [] and len(errors) == 41  # every exchange of the attack, none answered
    assert errors[0] == (
        "client 'victim': site 'victim' refused (sec.signature): model 0 of the exchange claims "
        "to come from site '', which is not in the pinned roster (3 sites); a site not in the "
        "roster is not trusted; fix: a learner evaluates only models rostered sites signed; a "
        "server cannot have it evaluate models of its own")
    assert rules(node) == ["sec.signature"] * 41
    assert node.guard.ledger.of("sec-model") == []


def test_a_colluding_signer_is_bounded_by_the_quota_on_the_ledger_across_processes(tmp_path):
    node = victim(tmp_path)  # quota: one model per rostered site, 3
    losses, _ = exchange(node, crafted()[:3], signer="mallory")
    assert len(losses) == 3
    again = victim(tmp_path)  # a fresh process: the count is read from the ledger
    losses, errors = exchange(again, crafted()[3:4], signer="mallory", run="sec-2")
    assert losses == []
    assert errors == [
        "client 'victim': site 'victim' refused (sec.quota): the exchange asks for 1 more "
        "distinct models in run 'fit-1', beyond its quota of 3 per run (3 evaluated already, "
        "counted on its ledger); fix: raise [sec] quota in the site policy if the consortium "
        "is larger"]
    assert [e["signer"] for e in again.guard.ledger.of("sec-model")] == ["mallory"] * 3
    bigger = victim(tmp_path / "other", SitePolicy(sec_quota=10))
    assert len(exchange(bigger, crafted()[:10], signer="mallory")[0]) == 10


def test_a_site_that_evaluates_no_others_models_refuses_even_signed_ones(tmp_path):
    node = victim(tmp_path, SitePolicy(sec_evaluate_others=False))
    losses, errors = exchange(node, crafted()[:1], signer="other")
    assert losses == [] and errors == [
        "client 'victim': site 'victim' refused (sec.evaluate-others): its policy says it "
        "evaluates no other party's models; fix: leave this site out of SEC's exchange step"]
    assert rules(node) == ["sec.evaluate-others"]


def test_without_a_roster_a_policy_site_evaluates_only_if_its_policy_says_so(tmp_path):
    node = victim(tmp_path / "a", roster=None)
    losses, errors = exchange(node, crafted()[:1])
    assert losses == [] and "refused (sec.roster): it pins no roster" in errors[0]
    trusting = victim(tmp_path / "b", SitePolicy(sec_evaluate_others=True), roster=None)
    assert len(exchange(trusting, crafted()[:2])[0]) == 2


def test_only_the_policys_trusted_types_are_evaluated_or_selected(tmp_path):
    node = victim(tmp_path, SitePolicy(sec_trusted_types=("linear",)))  # a candidate's name
    losses, errors = exchange(node, crafted()[:1], signer="other")
    assert losses == [] and errors == [
        "client 'victim': site 'victim' refused (sec.trusted-types): model 0 of the message "
        "contains ['sklearn.tree._classes.DecisionTreeRegressor', 'sklearn.tree._tree.Tree'], "
        "outside its trusted types; fix: send models of the types ['linear'] only"]
    linear = dumps_model(LinearRegression().fit([[0.0], [1.0]], [0.0, 1.0]))
    assert len(exchange(node, [linear], signer="other")[0]) == 1
    select = node.handle("query", {"query": "select", "seed": 0, "run": "sec-1",
                                   "candidate_names": json.dumps(["tree"]),
                                   "candidate/0": dumps_model(DecisionTreeRegressor())})
    assert "refused (sec.trusted-types): model 0 of the message contains " \
           f"['{TREE}']" in select[ERROR_KEY]
    assert rules(node) == ["sec.trusted-types", "sec.trusted-types"]
    for trusted, ok in (((LINEAR,), linear), (("sklearn.tree",), crafted()[0])):
        other = victim(tmp_path / trusted[0], SitePolicy(sec_trusted_types=trusted))
        assert len(exchange(other, [ok], signer="other")[0]) == 1  # a full name, a prefix
        wrong = crafted()[0] if ok is linear else linear
        assert "refused (sec.trusted-types)" in exchange(other, [wrong], signer="other")[1][0]
