"""SecAgg+ set-up at 1,000 clients (issue 23, done-when 4): the faster set-up keeps what the
protocol sends and checks. Shamir shares dealt by groups of holders in one exact product equal
Horner's rule on Python's integers; a relayed roster read as rows gives every member the keys
and signature the server's roster holds, and one listing a member twice is refused; the shares
sealed in one pass open one by one, under each pair's key, to the dealt shares."""

import json

import numpy as np
import pytest

from tolerance import assert_same

pytest.importorskip("cryptography")

from fedlatent.engine.secagg import (  # noqa: E402
    FixedPoint,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    SecureAggregationError,
    _crypto,
    setup,
    shamir,
)
from fedlatent.engine.secagg.driver import open_keys  # noqa: E402
from fedlatent.engine.secagg.enrol import share_context  # noqa: E402

P = shamir.P31
IDS = [f"c{i:02d}" for i in range(24)]


@pytest.fixture(autouse=True)
def small_graphs(monkeypatch):
    """Graphs of degree 6 among 24 clients, which the library's bounds never choose: here the
    bounds say (6, 4), so that the clients, which recompute them, accept the graph."""
    import fedlatent.engine.secagg.graph as graph

    monkeypatch.setattr(graph, "plus_parameters", lambda n, p, **kw: (6, 4))


def config():
    return SecAggConfig(13, FixedPoint(scale=2.0**20, bound=100.0), slots=3, degree=6,
                        local_threshold=4)


def horner(coefs, xs):
    t, m = coefs.shape
    return np.array([[sum(int(coefs[j, q]) * pow(int(x), j, P) for j in range(t)) % P
                      for q in range(m)] for x in xs])


@pytest.mark.parametrize("t, chunk", [(28, 7), (28, 10_000), (40, 13), (70, 5)])
def test_shares_dealt_by_groups_of_holders_equal_pythons_integers(monkeypatch, t, chunk):
    """Groups of one holder or of all, one exact block (t <= 32) or several (two 64-term
    blocks from t = 33): the same field elements."""
    monkeypatch.setattr(shamir, "_CHUNK", chunk)
    rng = np.random.default_rng(t)
    coefs = rng.integers(0, P, (t, 6))
    coefs[:, 0] = P - 1  # the largest element in every term: the exactness bound's edge
    xs = np.sort(rng.choice(np.arange(1, 1001), 11, replace=False))
    got = shamir._evaluate(coefs, xs)
    assert got.dtype == np.uint32 and got.shape == (11, 6)
    assert_same(got, horner(coefs, xs))  # field integers


def test_a_relayed_roster_gives_each_member_the_servers_keys_and_signature():
    server, clients = setup(IDS, config())
    for u, c in clients.items():
        mine = c._roster
        assert sorted(mine.keys) == list(server.roster.graph.closed(u))
        for v in mine.keys:
            assert dict(mine.keys[v]) == server.roster.keys[v]
            assert mine.signatures[v] == server.roster.signatures[v] == bytes(64)
        near = [v for v in mine.keys if v != u]
        assert mine.enc_keys(near) == [server.roster.keys[v]["enc_key"] for v in near]


def test_a_relayed_roster_listing_a_member_twice_is_refused():
    """A second row for a neighbour (here with another client's key) would otherwise stand
    for it: the last row read won, the neighbourhood's ids still matched."""
    server = SecAggServer(config())
    clients = {u: SecAggClient(u, config(), graph_commit=server.graph_commit) for u in IDS}
    server.collect_keys(open_keys(server, clients))
    msg = server.roster_for("c00")
    members = json.loads(msg["members"])
    other = [u for u in IDS if u not in members][0]
    row = server.roster.ids.index(other)
    msg["members"] = json.dumps(members + [members[-1]])
    for f in ("enc_key", "self_commit", "nonce"):  # the extra row: a non-neighbour's keys
        msg[f] = np.concatenate([msg[f], server.roster._tables[f][row:row + 1]])
    with pytest.raises(SecureAggregationError, match="client ids must be distinct strings"):
        clients["c00"].receive_peer_keys(msg)


def test_shares_sealed_in_one_pass_open_one_by_one_to_the_dealt_shares():
    server = SecAggServer(config())
    clients = {u: SecAggClient(u, config(), graph_commit=server.graph_commit) for u in IDS}
    server.collect_keys(open_keys(server, clients))
    for u, c in clients.items():
        c.receive_peer_keys(server.roster_for(u))
    sender, c = "c05", clients["c05"]
    peers, rows = c.sealed_shares()
    near = list(server.roster.graph.closed(sender))
    assert rows.dtype == np.uint8 and rows.shape == (6, 12 + 32 * 3 + 16)
    for v, row in zip(peers, rows):
        key = clients[v]._share_key(sender, v)  # the recipient's own agreement
        opened = _crypto.aead_open(key, row.tobytes(), share_context(sender, v))
        share = np.frombuffer(opened, dtype="<u4").reshape(3, shamir.LIMBS)
        assert np.all(share < P)
        x = server.roster.index[v]
        assert near.index(v) >= 0 and x == server.roster.x_of([v])[0]
    # any 4 holders' shares rebuild the 3 seeds; the client's own share is kept, not sent
    holders = [v for v in near if v != sender][:3]
    shares = [np.frombuffer(_crypto.aead_open(clients[v]._share_key(sender, v),
                                              rows[peers.index(v)].tobytes(),
                                              share_context(sender, v)), "<u4")
              for v in holders] + [np.frombuffer(c._blobs[sender], "<u4")]
    X = np.array([server.roster.index[v] for v in holders + [sender]])
    Y = np.stack(shares).reshape(4, 3, shamir.LIMBS).transpose(1, 0, 2)
    assert_same(shamir.reconstruct_seeds(np.broadcast_to(X, (3, 4)), Y), c._seeds)  # integers
