"""SEC with authenticated models (issue 21, item 5): a server that sends a learner crafted
stumps rebuilds the learner's rows from the losses; a learner whose site pins a roster
evaluates only models rostered sites signed for the run, within a per-run quota."""

import functools
import json

import numpy as np
import pytest
from sklearn.tree import DecisionTreeRegressor

pytest.importorskip("cryptography")

from fedlatent.data.dataset import FederatedDataset  # noqa: E402
from fedlatent.data.sec_data import make_sec_simulation1  # noqa: E402
from fedlatent.engine import InProcessRuntime  # noqa: E402
from fedlatent.engine.node.client import ClientNode  # noqa: E402
from fedlatent.engine.protocol.messages import ERROR_KEY  # noqa: E402
from fedlatent.engine.site import SitePolicy  # noqa: E402
from fedlatent.engine.site.keys import Roster, SiteIdentity, SiteKeys  # noqa: E402
from fedlatent.models.sec import SEC, dumps_model  # noqa: E402
from fedlatent.models.sec.signed import model_signature  # noqa: E402

N, GRID, BATCH = 50, 100, 5
KEYS = {s: SiteKeys.generate() for s in ("victim", "mallory", "other")}
ROSTER = Roster({s: k.public_key for s, k in KEYS.items()})


def victim_node(identity=None, policy=SitePolicy.for_simulation()):
    """The victim learner (its site policy relaxed: these tests are about its identity; the
    library's default policy is tested below)."""
    rng = np.random.default_rng(7)
    # every row in its own 1/50 cell, at least 0.012 from the next: a 1/100 grid isolates each
    x = (rng.permutation(N) + rng.uniform(0.3, 0.7, N)) / N
    y = rng.normal(3.0, 2.0, N)
    fd = FederatedDataset.from_arrays({"victim": (x[:, None], y)})
    node = ClientNode("victim", fd["victim"], source=fd, identity=identity, policy=policy)
    node.handle("setup", {"model": "sec", "model_config": json.dumps({"standardize": False})})
    return node, x, y


def stump(t, low, high):
    """A depth-1 tree predicting ``low`` where x <= t and ``high`` above (an allowed type)."""
    return dumps_model(DecisionTreeRegressor(max_depth=1).fit([[t - 1e-7], [t + 1e-7]],
                                                              [low, high]))


@functools.cache
def crafted():
    zero = dumps_model(DecisionTreeRegressor(max_depth=1).fit([[0.0], [1.0]], [0.0, 0.0]))
    ts = np.arange(GRID + 1) / GRID
    return [zero] + [stump(t, 0.0, v) for t in ts for v in (1.0, 2.0)], ts


def exchange(node, blobs, run="r", signer=None):
    """The server's exchange messages, ``BATCH`` models each; returns the losses (or the first
    error reply) and the number of exchanges."""
    losses = []
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
            return reply, s // BATCH + 1
        losses.append(np.asarray(reply["loss"]))
    return np.concatenate(losses), -(-len(blobs) // BATCH)


def rebuild(losses, ts):
    """Each row's y, in the order of x, from the losses (n public, as the select step sends)."""
    L0, L1, L2 = losses[0], losses[1::2], losses[2::2]
    n_right = np.rint(N * ((L2 - L0) - 2 * (L1 - L0)) / 2)     # rows with x > t
    s_right = (n_right - N * (L1 - L0)) / 2                      # their sum of y
    one = np.flatnonzero(np.diff(n_right) == -1)                 # a cell holding one row
    return s_right[one] - s_right[one + 1]


def test_without_a_roster_crafted_stumps_rebuild_every_row():
    node, x, y = victim_node()
    blobs, ts = crafted()
    losses, calls = exchange(node, blobs)
    got = rebuild(losses, ts)
    assert calls == 41 and got.size == N
    assert np.max(np.abs(got - y[np.argsort(x)])) < 1e-9


def test_a_node_without_a_policy_file_refuses_the_crafted_stumps_at_the_first_exchange():
    """Issue 39: the library's default site policy (no roster: SEC models are not scored)."""
    node, _, _ = victim_node(policy=None)
    blobs, _ = crafted()
    reply, calls = exchange(node, blobs)
    assert calls == 1 and "loss" not in reply
    assert reply[ERROR_KEY].startswith("client 'victim': site 'victim' refused "
                                       "(sec.roster): it pins no roster")
    assert [e["rule"] for e in node.guard.ledger.of("refusal")] == ["sec.roster"]


def test_with_a_roster_unsigned_models_are_refused_before_any_loss():
    node, _, _ = victim_node(SiteIdentity(KEYS["victim"], ROSTER))
    blobs, _ = crafted()
    reply, calls = exchange(node, blobs)
    assert calls == 1
    assert ("model 0 of the exchange claims to come from site '', which is not in the pinned "
            "roster (3 sites)") in reply[ERROR_KEY]
    assert "a server cannot have a learner evaluate models of its own" in reply[ERROR_KEY]


def test_models_signed_by_the_server_itself_or_for_another_run_do_not_verify():
    node, _, _ = victim_node(SiteIdentity(KEYS["victim"], ROSTER))
    blobs, _ = crafted()
    msg = {"query": "exchange", "seed": 0, "offset": 0, "run": "r2", "model/0": blobs[1],
           "signer/0": "other",
           "signature/0": model_signature(SiteIdentity(KEYS["other"], site="other"),
                                          blobs[1], "r1")}
    reply = node.handle("query", msg)
    assert "model 0 of the exchange from site 'other' does not verify" in reply[ERROR_KEY]
    msg["signature/0"] = model_signature(SiteIdentity(SiteKeys.generate(), site="other"),
                                         blobs[1], "r2")
    assert "does not verify" in node.handle("query", msg)[ERROR_KEY]


def test_a_colluding_rostered_signer_is_bounded_by_the_quota():
    node, _, _ = victim_node(SiteIdentity(KEYS["victim"], ROSTER))  # quota: 3 sites
    blobs, _ = crafted()
    losses, _ = exchange(node, blobs[:3], signer="mallory")
    assert losses.shape == (3,)
    again, _ = exchange(node, blobs[:3], signer="mallory")  # the same models: not recounted
    np.testing.assert_array_equal(again, losses)
    reply, _ = exchange(node, blobs[3:4], signer="mallory")
    assert ("asks for 1 more distinct models in run 'r', beyond the site's quota of 3 per run "
            "(3 evaluated already)") in reply[ERROR_KEY]
    node2, _, _ = victim_node(SiteIdentity(KEYS["victim"], ROSTER, sec_quota=10))
    with_quota, _ = exchange(node2, blobs[:10], signer="mallory")
    assert with_quota.shape == (10,)


def test_a_fit_of_rostered_learners_signs_and_verifies_every_model():
    fd, _ = make_sec_simulation1(n_learners=4, n_samples=30, snr=64.0, random_state=1)
    keys = {c: SiteKeys.generate() for c in fd.client_ids}
    roster = Roster({c: k.public_key for c, k in keys.items()})

    def fit(identities):
        rt = InProcessRuntime(fd, record=True)
        for c, node in rt.nodes.items():
            node.identity = identities.get(c)
        return SEC(candidates="linear", n_clusters=2, random_state=0).fit(fd, runtime=rt), rt

    signed, rt = fit({c: SiteIdentity(keys[c], roster) for c in fd.client_ids})
    plain, _ = fit({})
    np.testing.assert_allclose(signed.exchange_losses_, plain.exchange_losses_, rtol=1e-12)
    sent = [m for d, _, meth, m in rt.log if d == "down" and m.get("query") == "exchange"]
    assert sent and all(f"signature/{k}" in m for m in sent for k in range(4))
    # one learner without a key: its model is unsigned, the others refuse it, naming it
    ids = {c: SiteIdentity(keys[c], roster) for c in fd.client_ids}
    ids[fd.client_ids[0]] = SiteIdentity(None, roster)
    with pytest.raises(Exception, match=rf"site {fd.client_ids[0]!r} carries no signature"):
        fit(ids)
