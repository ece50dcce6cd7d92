"""Issue 37: a lie about who dropped is refused by the consistency round.

The attack of the issue, played by a server that drives honest clients: it tells the target
``u`` that half its neighbours (group S) dropped, so that ``u`` reveals its pair masks with
them; it tells the other half (group D) that ``u`` dropped, so that they reveal theirs; and it
tells group S that ``u`` survived, so that they reveal their shares of ``u``'s self-mask seed.
Without the consistency round (clients without a pinned roster, which trust the server) that
unmasks ``u``'s reply; with it, group S holds ``u``'s confirmation of its split, which lists
them as dropped, and refuses."""

import numpy as np
import pytest

pytest.importorskip("cryptography")

from fedlatent.engine.secagg import (  # noqa: E402
    FixedPoint,
    SecAggConfig,
    SecureAggregationError,
    setup,
    shamir,
)
from fedlatent.engine.secagg.protocol import exchange_label, self_mask  # noqa: E402
from fedlatent.engine.site.keys import Roster, SiteIdentity, SiteKeys  # noqa: E402

IDS = [f"c{i:02d}" for i in range(24)]
SCALE, K, T = 2.0**20, 8, 4
RUN = "lie"


@pytest.fixture(autouse=True)
def bounds_k8(monkeypatch):
    """24 clients on a graph of degree 8: the library's bounds say (8, 4) here."""
    import fedlatent.engine.secagg.graph as graph

    monkeypatch.setattr(graph, "plus_parameters", lambda n, p, **kw: (K, T))


def enrolled(rostered: bool):
    cfg = SecAggConfig(13, FixedPoint(scale=SCALE, bound=100.0), slots=2, degree=K,
                       local_threshold=T)
    ident = None
    if rostered:
        keys = {u: SiteKeys.generate() for u in IDS}
        roster = Roster({u: k.public_key for u, k in keys.items()})
        ident = {u: SiteIdentity(keys[u], roster) for u in IDS}
    return setup(IDS, cfg, identities=ident, run=RUN)


def split_lie(graph, u):
    """The server's splits: ``{client: (survivors, dropped)}`` and the two groups."""
    near = list(graph.neighbours(u))
    group_s, group_d = near[:T], near[T:]  # told u survived / told u dropped
    told = {}
    for c in IDS:
        closed = list(graph.closed(c))
        if c == u:
            told[c] = ([v for v in closed if v not in group_s], list(group_s))
        elif c in group_d:
            told[c] = ([v for v in closed if v != u], [u])
        else:
            told[c] = (closed, [])
    return told, group_s, group_d


def masked_exchange(server, clients, stats):
    graph = server.roster.graph
    P = server.announce(1, "e", IDS)
    return {c: clients[c].mask(stats[c], 1, "e", list(graph.closed(c)), slot=server.slot)
            for c in P}


def confirmation(words, graph, owner, holder):
    """``owner``'s confirmation of ``holder``: the word at ``holder``'s place among ``owner``'s
    closed neighbourhood (what an honest server relays)."""
    return words[owner][list(graph.closed(owner)).index(holder)]


def test_without_the_consistency_round_the_lie_unmasks_the_target():
    """The positive control: clients that trust the server (no pinned roster) reveal by the
    split they are told; the server rebuilds the target's self-mask seed from group S's shares
    and removes every pair mask it got from group D and from the target itself."""
    server, clients = enrolled(rostered=False)
    graph = server.roster.graph
    rng = np.random.default_rng(0)
    stats = {c: {"s": rng.normal(0, 10, size=5)} for c in IDS}
    u = IDS[0]
    y = masked_exchange(server, clients, stats)
    told, group_s, group_d = split_lie(graph, u)
    reveal = {c: clients[c].reveal(1, "e", *told[c]) for c in [u, *group_s, *group_d]}
    # u's self-mask seed from group S's shares (each holds one: rows of its owners, sorted)
    xs = np.array([server.roster.index[w] for w in group_s])
    ys = np.stack([reveal[w]["self"][[v for v in graph.closed(w) if v != w].index(u)]
                   .view("<u4") for w in group_s])
    seed = shamir.seed_bytes(shamir.reconstruct_seeds(xs[None, :], ys[None, :, :]))[0]
    x = y[u]["s"] - self_mask(seed, exchange_label(1, "e"), 5)
    for v in group_d:  # their pair masks with u (u dropped, they were told)
        m = reveal[v]["pair"][0].view("<u8")
        x = x - m if u < v else x + m
    for i, w in enumerate(group_s):  # u's pair masks with group S (told they dropped)
        m = reveal[u]["pair"][i].view("<u8")
        x = x - m if u < w else x + m
    assert np.max(np.abs(x.view(np.int64) / SCALE - stats[u]["s"])) <= 1 / SCALE


def test_with_the_consistency_round_the_lie_is_refused_by_those_told_the_target_survived():
    server, clients = enrolled(rostered=True)
    graph = server.roster.graph
    rng = np.random.default_rng(1)
    stats = {c: {"s": rng.normal(0, 10, size=5)} for c in IDS}
    u = IDS[0]
    masked_exchange(server, clients, stats)
    told, group_s, group_d = split_lie(graph, u)
    words = {c: clients[c].consistency(1, "e", *told[c])["confirm"].view("<u8") for c in IDS}
    assert not any(confirmation(words, graph, u, w) for w in group_s)  # u: they dropped
    for w in group_s:  # told u survived: u's own confirmation of them is missing
        owners = [v for v in told[w][0] if v != w]
        relayed = np.array([confirmation(words, graph, o, w) for o in owners], np.uint64)
        with pytest.raises(SecureAggregationError, match=rf"client '{w}': round 1, exchange 'e': "
                           rf"'{u}' did not confirm '{w}' as a survivor of its neighbourhood"):
            clients[w].reveal(1, "e", confirmations=relayed)
    # a forged word (another owner's, or any other) is refused the same way
    w = group_s[0]
    owners = [v for v in told[w][0] if v != w]
    forged = np.array([confirmation(words, graph, o, w) for o in owners], np.uint64)
    forged[owners.index(u)] = confirmation(words, graph, u, group_d[0])
    with pytest.raises(SecureAggregationError, match=rf"'{u}' did not confirm '{w}'"):
        clients[w].reveal(1, "e", confirmations=forged)


def test_a_rostered_client_reveals_only_after_confirming_and_only_by_its_confirmed_split():
    server, clients = enrolled(rostered=True)
    graph = server.roster.graph
    rng = np.random.default_rng(2)
    stats = {c: {"s": rng.normal(0, 10, size=5)} for c in IDS}
    masked_exchange(server, clients, stats)
    c = clients["c05"]
    closed = list(graph.closed("c05"))
    with pytest.raises(SecureAggregationError, match=r"asked to reveal in round 1, exchange 'e' "
                       r"before the consistency round"):
        c.reveal(1, "e", closed, [])
    c.consistency(1, "e", closed, [])
    with pytest.raises(SecureAggregationError, match=r"already confirmed its split"):
        c.consistency(1, "e", closed[1:], closed[:1])
    other = [v for v in closed if v != "c05"][0]
    with pytest.raises(SecureAggregationError, match=r"differs from the one it confirmed"):
        c.reveal(1, "e", [v for v in closed if v != other], [other])


def test_the_pure_lie_yields_no_share_of_the_targets_seed_and_the_target_refuses():
    """Telling every neighbour that ``u`` dropped (and ``u`` that all survived): the neighbours
    give the server their pair masks with ``u`` but not one share of its self-mask seed
    (nobody else thinks it survived; ``u`` never reveals its own share on a sparse graph), so
    the reply stays masked; and ``u`` itself refuses, none of them having confirmed it."""
    server, clients = enrolled(rostered=True)
    graph = server.roster.graph
    rng = np.random.default_rng(3)
    stats = {c: {"s": rng.normal(0, 10, size=5)} for c in IDS}
    u = IDS[0]
    masked_exchange(server, clients, stats)
    told = {c: ([v for v in graph.closed(c) if v != u], [u]) if c in graph.neighbours(u)
            else (list(graph.closed(c)), []) for c in IDS}
    words = {c: clients[c].consistency(1, "e", *told[c])["confirm"].view("<u8") for c in IDS}

    def relayed(c):
        return np.array([confirmation(words, graph, o, c) for o in told[c][0] if o != c],
                        np.uint64)

    for c in graph.neighbours(u):
        got = clients[c].reveal(1, "e", confirmations=relayed(c))
        assert len(got["self"]) == len(told[c][0]) - 1 and u not in told[c][0]
        assert len(got["pair"]) == 1  # its pair mask with u, nothing of u's seed
    with pytest.raises(SecureAggregationError, match=rf"client '{u}': .*did not confirm '{u}' "
                       r"as a survivor"):
        clients[u].reveal(1, "e", confirmations=relayed(u))


def test_a_revealed_exchange_keeps_no_tokens_and_cannot_be_confirmed_or_revealed_again():
    from fedlatent.engine.secagg import run_exchange

    server, clients = enrolled(rostered=True)
    rng = np.random.default_rng(4)
    stats = {c: {"s": rng.normal(0, 10, size=5)} for c in IDS}
    got = run_exchange(server, clients, stats, 1, "e", IDS, drop=["c07"])
    alive = [c for c in IDS if c != "c07"]
    assert np.max(np.abs(got["s"] - sum(stats[c]["s"] for c in alive))) <= len(IDS) / SCALE
    c = clients["c00"]
    assert c._tokens == {} and c._split == {}  # a long fit does not pile them up
    with pytest.raises(SecureAggregationError, match=r"already confirmed its split"):
        c.consistency(1, "e", None, [])
    with pytest.raises(SecureAggregationError, match=r"already revealed shares for round 1"):
        c.reveal(1, "e", confirmations=np.zeros(0, np.uint64))
