"""SecAgg+ set-up at scale (issue 23, item 5): the batched paths of the key set-up (Shamir shares
as one exact BLAS product, agreements, key derivations, seals and opens in one pass, one share
message per client, the roster parsed in C) give the same values as the one-at-a-time ones, and
the protocol's sums stay exact through the engine's set-up."""

import json

import numpy as np
import pytest

from tolerance import assert_same

pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402
from fedlatent.engine.faults import FederatedFitError  # noqa: E402
from fedlatent.engine.secagg import (  # noqa: E402
    FixedPoint,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    SecureAggregationError,
    _crypto,
    run_exchange,
    shamir,
)
from fedlatent.engine.secagg.driver import open_keys  # noqa: E402
from fedlatent.engine.secagg.graph import MaskingGraph, graph_digest  # noqa: E402
from fedlatent.engine.secagg.protocol import PAIR_TAG, pair_keys  # noqa: E402
from fedlatent.engine.secagg.secure import SecureChannel  # noqa: E402

P = shamir.P31
SCALE = 2.0**20


def horner(coefs, xs):
    """Every polynomial at every x with Python's integers (the reference)."""
    t, m = coefs.shape
    return np.array([[sum(int(coefs[j, q]) * pow(int(x), j, P) for j in range(t)) % P
                      for q in range(m)] for x in xs])


@pytest.mark.parametrize("t, h, m, big", [(1, 3, 4, False), (28, 20, 6, False),
                                          (100, 9, 3, True), (130, 5, 2, False)])
def test_shares_by_blas_equal_pythons_integers(t, h, m, big):
    rng = np.random.default_rng(t)
    coefs = rng.integers(0, P, (t, m))
    coefs[:, 0] = P - 1  # the largest field element in every term
    top = P if big else 5000  # big x's: the direct powers, else the cached table
    xs = rng.choice(np.arange(1, top, dtype=np.int64) if not big else
                    np.arange(P - 5000, P, dtype=np.int64), h, replace=False)
    assert_same(shamir._evaluate(coefs, xs), horner(coefs, xs))  # field integers


def test_dealt_shares_rebuild_the_seeds():
    seeds = shamir.draw_seeds(21)
    xs = np.arange(1, 88)
    shares = shamir.share_seeds(seeds, xs, 28)  # (holders, seeds, limbs)
    pick = np.array([3, 9, 11, 20, 30, 41, 42, 50, 51, 52, 53, 54, 55, 56, 60, 61, 62, 63, 64,
                     65, 66, 70, 71, 72, 80, 84, 85, 86])
    X = np.broadcast_to(xs[pick], (21, 28))
    got = shamir.reconstruct_seeds(X, shares[pick].transpose(1, 0, 2))
    assert_same(got, seeds)  # field integers
    wrong = shamir.reconstruct_seeds(X[:, :27], shares[pick[:27]].transpose(1, 0, 2))
    assert np.any(wrong != seeds)  # 27 of threshold 28 shares: not the seeds


def test_pair_keys_in_one_pass_are_the_one_step_kdf_of_the_sorted_pair():
    """NIST SP 800-56C's one-step KDF with SHA-512, written out: SHA-512 of the 32-bit counter
    1, the shared secret and the fixed info (the tag, the set-up's closed digest, the pair's
    x-coordinates smaller first, 4 bytes big-endian each); each pair its own block, both
    halves different keys."""
    from cryptography.hazmat.primitives import hashes

    from fedlatent.engine.secagg.protocol import pair_keys_many

    shared = [bytes([i]) * 32 for i in range(1, 4)]
    closed, xs = bytes(range(32)), [1, 9, 70_000]
    got = pair_keys_many(shared, closed, 5, xs)
    for s, x, key in zip(shared, xs, got):
        info = PAIR_TAG + closed + min(x, 5).to_bytes(4, "big") + max(x, 5).to_bytes(4, "big")
        h = hashes.Hash(hashes.SHA512())
        h.update((1).to_bytes(4, "big") + s + info)
        want = h.finalize()
        assert key == want == pair_keys(s, closed, x, 5)  # either side of the pair
        assert len(key) == 64 and key[:32] != key[32:]
    assert len(set(got)) == 3
    assert pair_keys(shared[0], bytes(32), 5, 1) != got[0]  # bound to the set-up
    assert pair_keys(shared[0], closed, 5, 2) != got[0]  # and to the pair


def test_seal_and_open_many_round_trip_and_a_tampered_row_does_not_open():
    keys = [bytes([i]) * 32 for i in range(3)]
    plain = np.arange(3 * 40, dtype=np.uint8).reshape(3, 40)
    ads = [b"a", b"b", b"c"]
    rows = _crypto.aead_seal_rows(keys, plain, ads)
    assert rows.shape == (3, 12 + 40 + 16) and rows.dtype == np.uint8
    sealed = [r.tobytes() for r in rows]
    assert _crypto.aead_open_rows(keys, sealed, ads) == [p.tobytes() for p in plain]
    assert _crypto.aead_open(keys[1], sealed[1], b"b") == plain[1].tobytes()
    sealed[2] = sealed[2][:-1] + bytes([sealed[2][-1] ^ 1])
    assert _crypto.aead_open_rows(keys, sealed, ads) is None
    assert len(set(r[:12].tobytes() for r in rows)) == 3  # a fresh nonce per message


def config(threshold=3, slots=2, degree=None, local=None):
    return SecAggConfig(threshold, FixedPoint(scale=SCALE, bound=100.0), slots=slots,
                        degree=degree, local_threshold=local)


def test_a_clients_shares_in_one_array_open_by_row_and_a_bad_row_is_named():
    ids = [f"c{i}" for i in range(5)]
    cfg = config()
    cl = {u: SecAggClient(u, cfg) for u in ids}
    server = SecAggServer(cfg)
    roster = server.collect_keys(open_keys(server, cl))
    for c in cl.values():
        c.receive_peer_keys(roster)
    peers, rows = cl["c1"].sealed_shares()
    assert peers == ["c0", "c2", "c3", "c4"]
    assert rows.shape == (4, 12 + shamir.SEED_SHARE_BYTES * 2 + 16)
    bad = rows.copy()
    bad[0, 30] ^= 1  # the row to c0
    with pytest.raises(SecureAggregationError, match=r"client 'c0': the share from 'c1' does not "
                       r"open \(authentication failed"):
        cl["c0"].receive_sealed(["c1"], bad[:1])
    cl["c0"].receive_sealed(["c1"], rows[:1])
    assert len(cl["c0"]._blobs["c1"]) == shamir.SEED_SHARE_BYTES * 2
    with pytest.raises(SecureAggregationError, match=r"client 'c0': a second share from 'c1'"):
        cl["c0"].receive_sealed(["c1"], rows[:1])
    with pytest.raises(SecureAggregationError, match=r"a share from 'zz', which is not another "
                       r"enrolled client"):
        cl["c2"].receive_sealed(["zz"], rows[:1])


def test_the_graph_of_the_same_public_inputs_is_derived_once_per_process():
    ids = [f"c{i:02d}" for i in range(30)]
    enc = np.arange(30 * 32, dtype=np.uint32).astype(np.uint8).reshape(30, 32)
    digest = graph_digest(b"s" * 32, json.dumps(ids), enc)
    g = MaskingGraph.of(ids, 6, digest)
    assert MaskingGraph.of(list(ids), 6, digest) is g
    assert MaskingGraph.of(ids, 6, graph_digest(b"t" * 32, json.dumps(ids), enc)) is not g
    fresh = MaskingGraph(ids, 6, digest)
    assert all(fresh.closed(u) == g.closed(u) for u in ids)


@pytest.fixture
def engine_setup(monkeypatch):
    """The engine's set-up (SecureChannel over the in-process runtime) on a sparse graph of
    24 clients: degree 6, neighbourhood threshold 4."""
    import fedlatent.engine.secagg.graph as graph

    monkeypatch.setattr(graph, "plus_parameters", lambda n, p, **kw: (6, 4))
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({f"c{i:02d}": rng.normal(size=(5, 2))
                                          for i in range(24)})
    rt = fl.InProcessRuntime(fd, batched=False)
    rt._to_nodes()
    ch = SecureChannel(rt, {c: 5 for c in rt.client_ids}, threshold=13, bound=100.0, slots=4)
    return ch.setup(), rt


def test_the_engines_set_up_deals_each_client_its_neighbourhoods_shares_and_sums_exactly(
        engine_setup):
    ch, rt = engine_setup
    assert ch.config.degree == 6 and ch.config.local_threshold == 4
    clients = {c: rt._nodes[c].secagg for c in rt.client_ids}
    graph = ch.server.roster.graph
    for c, cl in clients.items():
        assert sorted(cl._blobs) == list(graph.closed(c))  # its neighbours' shares, no other
    rng = np.random.default_rng(3)
    stats = {c: {"s": rng.normal(0, 10, size=4)} for c in clients}
    ids = sorted(clients)
    got = run_exchange(ch.server, clients, stats, 1, "estep", ids, drop=["c05"])
    alive = [c for c in ids if c != "c05"]
    want = sum(stats[c]["s"] for c in alive)
    assert np.max(np.abs(got["s"] - want)) <= len(alive) / (2 * SCALE)


def test_a_malformed_share_message_is_named_at_the_set_up(engine_setup):
    ch, _ = engine_setup
    good = {"to": json.dumps(["c01"]), "sealed": np.zeros((1, 60), np.uint8)}
    for bad in ({"to": "not json", "sealed": good["sealed"]},
                {"to": json.dumps(["c01", "c02"]), "sealed": good["sealed"]},
                {"to": good["to"], "sealed": np.zeros((1, 60), np.int64)}):
        with pytest.raises(FederatedFitError, match=r"set-up: client 'c03' sent a malformed "
                           r"share message"):
            ch._route({"c00": good, "c03": bad})
    inbox = ch._route({"c00": good, "c03": {"to": json.dumps(["c01", "nobody"]),
                                            "sealed": np.ones((2, 60), np.uint8)}})
    assert json.loads(inbox["c01"]["from"]) == ["c00", "c03"]  # sorted by recipient
    assert inbox["c01"]["sealed"].shape == (2, 60) and inbox["c02"]["sealed"].shape == (0, 60)
    assert inbox["c01"]["sealed"][1].tolist() == [1] * 60  # the row to 'nobody' dropped


def test_the_units_a_sum_claims_are_checked_to_within_the_fixed_point_rounding():
    from types import SimpleNamespace

    from fedlatent.engine.rounds.secure_round import _units
    from fedlatent.engine.secagg.secure import fixed_point

    enc = fixed_point(2.0**20, 10_000)  # the engine's scale at 10,000 clients: 2^28
    assert enc.scale == 2.0**28
    channel = SimpleNamespace(n_total=2e6, config=SimpleNamespace(encoding=enc))
    slack = SecureChannel.units_slack(channel, 10_000)
    assert slack == pytest.approx(0.5 + 10_000 * 2e6 / 2**29)  # 37.8 units
    ids = [f"c{i:05d}" for i in range(10_000)]
    rounds = SimpleNamespace(screen=SimpleNamespace(n_units=dict.fromkeys(ids, 200)),
                             secure=SimpleNamespace(units_slack=lambda n: slack))
    assert _units(rounds, ids, {"n": np.float64(2e6 + 30.0)}) == 2_000_000  # rounding: exact
    assert _units(rounds, ids, {"n": np.float64(2e6 - 40.0)}) == 1_999_960  # beyond: as sent
    assert _units(rounds, ids[:10], {"n": np.float64(1_000.4)}) == 1_000  # a mini-batch
