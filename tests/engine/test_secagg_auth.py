"""Authenticated peers in secure aggregation (issue 21, item 5).

A server that substitutes its own keys for a victim's peers can unmask the victim's reply (it
opens the shares the victim seals to the impostors, then rebuilds its self-mask seed). With a
pinned roster every site verifies its peers' signed keys and aborts naming the peer."""

import json
import re

import numpy as np
import pytest

pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402
from fedlatent.engine.rounds.loop import FederatedFitError  # noqa: E402
from fedlatent.engine.secagg import (  # noqa: E402
    FixedPoint,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    SecureAggregationError,
    run_exchange,
    setup,
)
from fedlatent.engine.secagg.driver import open_keys  # noqa: E402
from fedlatent.engine.site.keys import Roster, SiteIdentity, SiteKeys  # noqa: E402
from fedlatent.engine.transport.inprocess import InProcessRuntime  # noqa: E402

IDS = ["a", "b", "c", "d", "e"]
RUN = "run-1"
CONFIG = SecAggConfig(3, FixedPoint(scale=2.0**30, bound=1e3))
KEYS = {u: SiteKeys.generate() for u in IDS}
ROSTER = Roster({u: k.public_key for u, k in KEYS.items()})


def identities(trust=True):
    return {u: SiteIdentity(KEYS[u], ROSTER if trust else None) for u in IDS}


def substitute(victim_id, config, *, trust=None, copy_signatures=False, run=RUN):
    """The deviating server: the victim's peers are the server's impostors, whose commitments
    and keys it relays in place of the real peers' (consistently: the commitments close on
    them); returns (unmasked victim reply, its true input) or raises the victim's refusal."""
    victim = SecAggClient(victim_id, config, run=run)
    fakes = {v: SecAggClient(v, config, run=run) for v in IDS if v != victim_id}
    honest = {v: SecAggClient(v, config, run=run) for v in IDS if v != victim_id}
    real = open_keys(SecAggServer(config, run=run), honest,  # the real peers' signed keys
                     identities={v: SiteIdentity(KEYS[v]) for v in honest})
    everyone = {victim_id: victim, **fakes}
    server = SecAggServer(config, run=run)
    keys = open_keys(server, everyone, identities={victim_id: SiteIdentity(KEYS[victim_id])})
    if copy_signatures:  # the real peer's signature beside the impostor's keys
        for v in fakes:
            keys[v]["signature"] = real[v]["signature"]
    roster = server.collect_keys(keys)
    victim.receive_peer_keys(roster, trust=trust)  # the only step a roster can refuse
    for f in fakes.values():
        f.receive_peer_keys(roster)
    outgoing = {u: c.share_messages() for u, c in everyone.items()}
    for v, c in everyone.items():
        c.receive_shares({u: out[v] for u, out in outgoing.items() if u != v})
    x = {"s": np.array([1.25, -3.5, 7.0])}
    P = server.announce(1, "estep", IDS)
    masked = {victim_id: victim.mask(x, 1, "estep", P)}
    masked.update({v: f.mask({"s": np.zeros(3)}, 1, "estep", P) for v, f in fakes.items()})
    req = server.aggregate(masked)
    revealed = {v: f.reveal(1, "estep", req["survivors"], req["dropped"])
                for v, f in fakes.items()}
    return server.unmask(revealed)["s"], x["s"]


def test_without_a_roster_substituted_keys_unmask_one_reply():
    # today's behaviour, kept for sites without a roster: the server is trusted to relay keys
    got, want = substitute("c", CONFIG)
    assert np.max(np.abs(got - want)) < 1e-8


def test_with_a_roster_substituted_keys_abort_naming_the_peer():
    with pytest.raises(SecureAggregationError,
                       match=r"client 'c': peer 'a' is not authenticated: .*carries no signature"):
        substitute("c", CONFIG, trust=ROSTER)


def test_a_real_peers_signature_beside_substituted_keys_does_not_verify():
    with pytest.raises(SecureAggregationError,
                       match=r"peer 'a' is not authenticated: .*does not verify against its "
                             r"rostered key"):
        substitute("c", CONFIG, trust=ROSTER, copy_signatures=True)


def test_every_site_accepts_the_honest_relay_and_the_sum_is_exact():
    server, clients = setup(IDS, CONFIG, identities=identities(), run=RUN)
    rng = np.random.default_rng(0)
    stats = {u: {"s": rng.normal(size=4)} for u in IDS}
    got = run_exchange(server, clients, stats, 1, "estep", IDS, )["s"]
    assert np.max(np.abs(got - sum(stats[u]["s"] for u in IDS))) < 5 / 2**30


def test_a_peer_outside_the_roster_is_named():
    small = Roster({u: KEYS[u].public_key for u in IDS if u != "e"})
    ident = identities()
    ident["a"] = SiteIdentity(KEYS["a"], small)
    with pytest.raises(SecureAggregationError,
                       match=r"client 'a': peer 'e' is not authenticated: .*site 'e', which is "
                             r"not in the pinned roster"):
        setup(IDS, CONFIG, identities=ident, run=RUN)


def test_keys_signed_for_another_run_or_round_do_not_verify():
    old = SecAggClient("a", CONFIG, run="run-0")
    old_keys = open_keys(SecAggServer(CONFIG, run="run-0"), {"a": old},
                         identities={"a": SiteIdentity(KEYS["a"])})["a"]
    for run, rnd in (("run-0", 1), ("run-1", 0)):
        cl = {"a": SecAggClient("a", CONFIG, run=run, round=rnd)}  # its keys: old ones replayed
        cl.update({u: SecAggClient(u, CONFIG, run=run, round=rnd) for u in ("b", "c")})
        server = SecAggServer(CONFIG, run=run, round=rnd)
        keys = open_keys(server, cl, identities={u: SiteIdentity(KEYS[u]) for u in cl})
        keys["a"]["signature"] = old_keys["signature"]  # a signature made for run-0, round 0
        roster = server.collect_keys(keys)
        with pytest.raises(SecureAggregationError, match=r"peer 'a' is not authenticated"):
            cl["b"].receive_peer_keys(roster, trust=ROSTER)


def test_signed_state_survives_dump_and_load():
    server, clients = setup(IDS, CONFIG, identities=identities(), run=RUN)
    reborn = {u: SecAggClient.load(c.dump()) for u, c in clients.items()}
    assert {c.run for c in reborn.values()} == {RUN}
    assert all(c._authenticated for c in reborn.values())  # its peers' keys were verified
    stats = {u: {"s": np.full(2, float(i))} for i, u in enumerate(IDS)}
    got = run_exchange(server, reborn, stats, 1, "estep", IDS, )["s"]
    assert np.max(np.abs(got - 10.0)) < 5 / 2**30


# ---- in the engine: a fit, with nodes that hold identities ------------------------------------
def blobs(n_clients=5, seed=0):
    rng = np.random.default_rng(seed)
    return fl.FederatedDataset.from_arrays(
        {IDS[c]: np.vstack([rng.normal(-2, 1, (20, 2)), rng.normal(2, 0.7, (20, 2))])
         for c in range(n_clients)})


def runtime(fd, trust=True):
    rt = InProcessRuntime(fd)
    for u, node in rt.nodes.items():
        node.identity = SiteIdentity(KEYS[u], ROSTER if trust else None)
    return rt


def gmm():
    return fl.FederatedGaussianMixture(2, federation=fl.Federation(secure_aggregation=True),
                                       max_rounds=4, tol=0.0, random_state=3, verbose=False)


class Substituting:
    """A runtime wrapper playing a server that substitutes peer ``peer``'s key (share
    encryption and masks) by an impostor's: in every message it relays after the peer's
    commitment (``late``: only in the roster relayed to ``victim``), or from the commitment on
    (the impostor's commitment and keys in place of the peer's, consistently)."""

    def __init__(self, rt, victim, peer, late=False):
        self.rt, self.victim, self.peer, self.late = rt, victim, peer, late
        self.client_ids = rt.client_ids
        self.fake = None

    def __getattr__(self, name):
        return getattr(self.rt, name)

    def call(self, ids, method, msgs):
        step = next(iter(msgs.values()), {}).get("step") if method == "secagg" else None
        if step == "roster" and self.late:
            msgs = dict(msgs)
            m = dict(msgs[self.victim])
            i = json.loads(m["ids"]).index(self.peer)
            fake = SecAggClient(self.peer, SecAggConfig(3, FixedPoint(1.0, 1.0), slots=int(
                m["self_commit"].shape[1] // 32)))
            fake.commitment()
            mk = np.array(m["enc_key"], copy=True)
            mk[i] = fake.open(bytes(32), 5)["enc_key"]
            m["enc_key"] = mk
            msgs[self.victim] = m
        replies = self.rt.call(ids, method, msgs)
        if step == "keys" and not self.late:  # the impostor commits in the peer's place
            self.fake = SecAggClient(self.peer, self.rt.nodes[self.peer].secagg.config,
                                     run=msgs[self.peer]["run"])
            replies[self.peer] = self.fake.commitment()
        if step == "open" and not self.late:
            keys = self.fake.open(bytes(msgs[self.peer]["closed"]), int(msgs[self.peer]["n"]))
            keys["signature"] = replies[self.peer]["signature"]  # the real peer's signature
            replies[self.peer] = keys
        return replies


@pytest.mark.filterwarnings("ignore::fedlatent.engine.errors.ConvergenceWarning")
def test_a_secure_fit_with_rostered_sites_equals_the_fit_without_keys():
    fd = blobs()
    signed = gmm().fit(fd, runtime=runtime(fd))
    plain = gmm().fit(fd, runtime=runtime(fd, trust=False))
    np.testing.assert_allclose(signed.means_, plain.means_, rtol=1e-9, atol=1e-9)


def test_a_server_substituting_a_peers_key_in_a_fit_is_stopped_naming_both():
    fd = blobs()
    with pytest.raises(FederatedFitError,
                       match=re.compile(r"clients \['a', 'b', 'c', 'd', 'e'\] refused the "
                                        r"relayed keys; client 'a': .*lacks or alters this "
                                        r"client's own public keys; client 'b': .*peer 'a' is "
                                        r"not authenticated.*does not verify", re.S)):
        gmm().fit(fd, runtime=Substituting(runtime(fd), "c", "a"))


def test_a_key_substituted_after_the_commitments_closed_is_refused_even_without_a_roster():
    fd = blobs()
    with pytest.raises(FederatedFitError,
                       match=re.compile(r"clients \['c'\] refused the relayed keys.*the "
                                        r"roster's openings do not give the list of commitments "
                                        r"that closed before this client opened its keys", re.S)):
        gmm().fit(fd, runtime=Substituting(runtime(fd, trust=False), "c", "a", late=True))


def test_a_rostered_site_refuses_an_unnamed_or_repeated_run():
    fd = blobs()
    node = runtime(fd).nodes["a"]
    base = {"step": "keys", "threshold": 3, "scale": 2.0**20, "bound": 10.0, "slots": 2,
            "participation": 1.0}
    with pytest.raises(ValueError, match=r"client 'a': .*names no run"):
        node.handle("secagg", base)
    node.handle("secagg", {**base, "run": "r9"})
    with pytest.raises(ValueError, match=r"site 'a': .*run 'r9' was already done once"):
        node.handle("secagg", {**base, "run": "r9"})


def test_a_remembered_signature_verifies_only_its_own_key_and_message():
    """verify_bytes remembers valid (key, message, signature) triples per process (the sites
    one process holds share the answer): a remembered triple changes nothing for another
    message, another key or another signature."""
    from fedlatent.engine.site.keys import _VERIFIED, statement, statement_head, verify_bytes

    key, msg = KEYS["a"], statement_head("t", {"run": "m"}) + b"payload"
    assert msg == statement("t", {"run": "m"}, b"payload")
    sig = key.sign_bytes(msg)
    assert verify_bytes(key.public_key, sig, msg)
    assert (key.public_key, msg, sig) in _VERIFIED
    assert verify_bytes(key.public_key, sig, msg)  # remembered
    assert not verify_bytes(key.public_key, sig, msg + b"x")
    assert not verify_bytes(KEYS["b"].public_key, sig, msg)
    assert not verify_bytes(key.public_key, bytes(64), msg)
    assert not verify_bytes(key.public_key, sig[:-1] + bytes([sig[-1] ^ 1]), msg)
