"""Secure aggregation end to end in memory: the server gets the sum and only the sum, dropouts are
recovered, and the refusals that keep the multi-round protocol safe."""

import numpy as np
import pytest

from fedlatent.engine.secagg import (
    FixedPoint,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    SecureAggregationError,
    Wire,
    _crypto,
    route_shares,
    run_exchange,
    setup,
    shamir,
)
from fedlatent.engine.secagg.driver import open_keys
from fedlatent.engine.secagg.enrol import share_context

SCALE = 2.0**20
IDS = [f"c{i}" for i in range(5)]


def config(threshold=3, bound=100.0):
    return SecAggConfig(threshold=threshold, encoding=FixedPoint(scale=SCALE, bound=bound))


def inputs(ids, seed=0):
    rng = np.random.default_rng(seed)
    return {u: {"n": rng.uniform(0, 20, size=3), "sx": rng.normal(0, 30, size=(3, 2))}
            for u in ids}


def float_sum(stats, ids):
    return {k: sum(stats[u][k] for u in ids) for k in ("n", "sx")}


def assert_close_to(got, want, n):
    for k in want:
        assert got[k].dtype == np.float64 and got[k].shape == want[k].shape
        assert np.max(np.abs(got[k] - want[k])) <= n / (2 * SCALE)


@pytest.fixture(scope="module")
def fed():
    return setup(IDS, config())


def test_unmasked_sum_equals_the_float_sum_with_partial_participation():
    server, clients = setup(IDS, config())
    stats = inputs(IDS)
    assert_close_to(run_exchange(server, clients, stats, 0, "init", IDS), float_sum(stats, IDS), 5)
    part = ["c0", "c2", "c3", "c4"]
    assert_close_to(run_exchange(server, clients, stats, 1, "stats", part),
                    float_sum(stats, part), 4)


def test_zero_input_is_hidden_and_fresh_keys_give_new_masks_but_the_same_sum():
    stats = inputs(IDS, seed=1)
    stats["c1"] = {"n": np.zeros(3), "sx": np.zeros((3, 2))}
    seen, sums = [], []
    for _ in range(2):
        server, clients = setup(IDS, config())
        wire = Wire(record=True)
        sums.append(run_exchange(server, clients, stats, 1, "stats", IDS, wire=wire))
        (reply,) = [m for step, u, _, m in wire.log if step == "masked" and u == "c1"]
        seen.append(np.concatenate([reply["n"], reply["sx"].ravel()]))
    for y in seen:  # the encoding of zeros is 0; a masked word looks uniform on [0, 2^64)
        assert np.all(y != 0)
        assert np.all(np.minimum(y, -y) > np.uint64(2**40))  # far from 0 both ways in the ring
    assert not np.any(seen[0] == seen[1])
    for k in sums[0]:
        np.testing.assert_array_equal(sums[0][k], sums[1][k])  # exact: same rounded integers


def test_a_dropout_after_setup_is_recovered_and_then_excluded():
    server, clients = setup(IDS, config())
    stats = inputs(IDS, seed=2)
    got = run_exchange(server, clients, stats, 1, "stats", IDS, drop=["c3"])
    assert_close_to(got, float_sum(stats, ["c0", "c1", "c2", "c4"]), 4)
    assert server.excluded == {"c3": "round 1, exchange 'stats'"}
    with pytest.raises(SecureAggregationError, match=r"round 2, exchange 'stats': \['c3'\] were "
                       r"declared dropped in round 1, exchange 'stats' .* must rejoin with new "
                       r"keys"):
        server.announce(2, "stats", IDS)
    with pytest.raises(SecureAggregationError, match=r"client 'c0': participant 'c3' of round 2, "
                       r"exchange 'stats' was declared dropped in round 1, exchange 'stats' and "
                       r"its pair masks revealed; it must rejoin with new keys"):
        clients["c0"].mask(stats["c0"], 2, "stats", IDS)
    # the others go on
    rest = ["c0", "c1", "c2", "c4"]
    assert_close_to(run_exchange(server, clients, stats, 2, "stats", rest),
                    float_sum(stats, rest), 4)


def test_two_dropouts_in_one_exchange_are_recovered():
    ids = [f"c{i}" for i in range(7)]
    server, clients = setup(ids, config(threshold=4))
    stats = inputs(ids, seed=3)
    got = run_exchange(server, clients, stats, 1, "stats", ids, drop=["c0", "c5"])
    assert_close_to(got, float_sum(stats, ["c1", "c2", "c3", "c4", "c6"]), 5)


def test_survivors_silent_at_the_reveal_are_not_needed_while_threshold_others_reveal():
    """Without a dropout, a silent survivor's reply still counts; a survivor silent when one of
    its neighbours dropped is needed (only it can give its pair mask with the dropped client)."""
    server, clients = setup(IDS, config())
    stats = inputs(IDS, seed=10)
    got = run_exchange(server, clients, stats, 1, "stats", IDS, silent=["c4"])
    assert_close_to(got, float_sum(stats, IDS), 5)  # c4's reply counts
    with pytest.raises(SecureAggregationError, match=r"round 3, exchange 'stats': survivors "
                       r"\['c4'\] masked with dropped 'c0' but revealed no pair mask of it"):
        run_exchange(*setup(IDS, config()), stats, 3, "stats", IDS, drop=["c0"], silent=["c4"])
    with pytest.raises(SecureAggregationError, match=r"round 2, exchange 'stats': 2 survivors "
                       r"revealed shares, fewer than the threshold 3; the sum stays masked"):
        run_exchange(server, clients, stats, 2, "stats", IDS[1:], silent=["c1", "c2"])


def test_integer_levels_sum_exactly_in_the_ring_with_scale_one():
    """What a quantizer with a shared scale sends: integer levels, summed exactly."""
    cfg = SecAggConfig(threshold=3, encoding=FixedPoint(scale=1.0, bound=2.0**40))
    server, clients = setup(IDS, cfg)
    rng = np.random.default_rng(11)
    levels = {u: {"q": rng.integers(-(2**40), 2**40, size=50).astype(np.float64)} for u in IDS}
    got = run_exchange(server, clients, levels, 1, "q", IDS)
    want = np.sum([levels[u]["q"].astype(np.int64) for u in IDS], axis=0)
    np.testing.assert_array_equal(got["q"], want.astype(np.float64))


def test_fewer_survivors_than_the_threshold_stops_the_exchange(fed):
    server, clients = fed
    stats = inputs(IDS, seed=4)
    with pytest.raises(SecureAggregationError, match=r"^round 7, exchange 'stats': 2 of 5 "
                       r"participants replied, fewer than the threshold 3; the sum cannot be "
                       r"unmasked"):
        run_exchange(server, clients, stats, 7, "stats", IDS, drop=["c0", "c1", "c2"])
    # an honest client refuses on its own too
    with pytest.raises(SecureAggregationError, match=r"^round 7, exchange 'stats': 2 survivors, "
                       r"fewer than the threshold 3; refusing to reveal"):
        clients["c3"].reveal(7, "stats", ["c3", "c4"], ["c0", "c1", "c2"])
    with pytest.raises(SecureAggregationError, match=r"round 8, exchange 'x': 2 participants, "
                       r"fewer than the threshold 3"):
        server.announce(8, "x", ["c0", "c1"])


def test_a_peer_never_reveals_both_secrets_of_the_same_client():
    server, clients = setup(IDS, config())
    stats = inputs(IDS, seed=5)
    run_exchange(server, clients, stats, 1, "stats", IDS)  # every b_u is revealed
    with pytest.raises(SecureAggregationError, match=r"client 'c0': refusing to reveal the pair "
                       r"mask of 'c3' \(declared dropped in round 2, exchange 'stats'\): its "
                       r"self-mask seed was revealed in round 1, exchange 'stats'"):
        run_exchange(server, clients, stats, 2, "stats", IDS, drop=["c3"])


def test_a_client_whose_pair_seed_was_revealed_gets_no_self_seed_reveal_later():
    """Two exchanges open at once: c3 is declared dropped in one, then a survivor of the other."""
    _, clients = setup(IDS, config())
    stats = inputs(IDS, seed=6)
    for u in IDS:
        for e in ("a", "b"):
            clients[u].mask(stats[u], 40, e, IDS)
    survivors = ["c0", "c1", "c2", "c4"]
    shares = clients["c0"].reveal(40, "b", survivors, ["c3"])
    # a row per survivor (c0, c1, c2, c4) of c0's share of its seed; c3's pair mask with c0
    assert sorted(shares) == ["pair", "self"]
    assert shares["self"].dtype == np.uint8 and shares["self"].shape == (4, 32)
    n = sum(np.size(v) for v in stats["c0"].values())  # c3's pair mask with c0: n words
    assert shares["pair"].dtype == np.uint8 and shares["pair"].shape == (1, 8 * n)
    with pytest.raises(SecureAggregationError, match=r"client 'c0': refusing to reveal the "
                       r"self-mask seed of 'c3' in round 40, exchange 'a': its pair mask was "
                       r"revealed in round 40, exchange 'b'"):
        clients["c0"].reveal(40, "a", IDS, [])


def test_one_mask_and_one_reveal_per_exchange_and_a_consistent_split(fed):
    server, clients = fed
    stats = inputs(IDS, seed=7)
    c = clients["c1"]
    c.mask(stats["c1"], 20, "stats", IDS)
    with pytest.raises(SecureAggregationError, match=r"client 'c1': already masked a reply in "
                       r"round 20, exchange 'stats'"):
        c.mask(stats["c1"], 20, "stats", IDS)
    with pytest.raises(SecureAggregationError, match=r"must split its participants"):
        c.reveal(20, "stats", ["c1", "c2", "c3"], ["c0"])  # c4 missing
    with pytest.raises(SecureAggregationError, match=r"declared dropped in round 20, exchange "
                       r"'stats', yet asked to reveal"):
        c.reveal(20, "stats", ["c0", "c2", "c3", "c4"], ["c1"])
    c.reveal(20, "stats", IDS, [])
    with pytest.raises(SecureAggregationError, match=r"already revealed shares for round 20"):
        c.reveal(20, "stats", IDS, [])
    with pytest.raises(SecureAggregationError, match=r"sent no masked reply in round 21"):
        c.reveal(21, "stats", IDS, [])


def test_the_server_sees_only_ciphertexts_of_shares():
    wire = Wire(record=True)
    server, clients = setup(IDS, config(), wire=wire)
    relayed = [(u, v, m) for step, u, v, m in wire.log if step == "shares" and v == "<server>"]
    assert len(relayed) == 5
    n_checked = 0
    for sender, _, msgs in relayed:
        for recipient, ct in msgs.items():
            ct = ct.tobytes()
            share = clients[recipient]._blobs[sender]  # its share of the sender's seed
            assert len(share) == shamir.SEED_SHARE_BYTES
            assert share not in ct and share[-8:] not in ct
            # opens only with the (sender, recipient) key; a third client's key fails
            third = next(w for w in IDS if w not in (sender, recipient))
            wrong = clients[third]._share_key(sender, third)
            with pytest.raises(ValueError, match="authentication failed"):
                _crypto.aead_open(wrong, ct, share_context(sender, recipient))
            n_checked += 1
    assert n_checked == 20
    # nothing the server saw holds a private key or a self-mask seed
    blob = b"".join(np.asarray(a).tobytes() for _, _, v, m in wire.log if v == "<server>"
                    for a in m.values() if not isinstance(a, str))
    for c in clients.values():
        for secret in (_crypto.private_raw(c._private), *c._self_seeds,
                       *(p[32:] for p in c._pair.values())):  # key, seeds, pair secrets
            assert secret not in blob


def test_a_tampered_or_misrouted_share_is_named_and_a_wrong_revealed_share_is_caught():
    cfg = config()
    clients = {u: SecAggClient(u, cfg) for u in IDS}
    server = SecAggServer(cfg)
    roster = server.collect_keys(open_keys(server, clients))
    for c in clients.values():
        c.receive_peer_keys(roster)
    inbox = route_shares({u: c.share_messages() for u, c in clients.items()})
    tampered = inbox["c0"]["c1"].copy()
    tampered[20] ^= 1
    for bad in (tampered, inbox["c0"]["c2"]):  # altered bytes; c2's share posing as c1's
        with pytest.raises(SecureAggregationError, match=r"client 'c0': the share from 'c1' does "
                           r"not open \(authentication failed"):
            clients["c0"].receive_shares({"c1": bad})
    for v, msgs in inbox.items():
        clients[v].receive_shares(msgs)
    stats = inputs(IDS, seed=8)
    P = server.announce(1, "stats", IDS)
    request = server.aggregate({u: clients[u].mask(stats[u], 1, "stats", P) for u in P})
    revealed = {u: clients[u].reveal(1, "stats", request["survivors"], request["dropped"])
                for u in request["survivors"]}
    revealed["c0"]["self"] = revealed["c0"]["self"].copy()
    revealed["c0"]["self"][2, -1] ^= 1  # c0's share of c2's seed (rows: c0 .. c4)
    with pytest.raises(SecureAggregationError, match=r"the self-mask seed of 'c2' rebuilt from the "
                       r"revealed shares does not match its commitment"):
        server.unmask(revealed)


def test_malformed_masked_reply_names_client_and_field(fed):
    server, clients = fed
    stats = inputs(IDS, seed=9)
    P = server.announce(30, "stats", IDS)
    masked = {u: clients[u].mask(stats[u], 30, "stats", P) for u in P}
    masked["c2"]["sx"] = masked["c2"]["sx"].astype(np.float64)
    with pytest.raises(SecureAggregationError, match=r"round 30, exchange 'stats': client 'c2', "
                       r"field 'sx': dtype float64, expected uint64"):
        server.aggregate(masked)
    masked["c2"] = {"n": masked["c2"]["n"]}
    with pytest.raises(SecureAggregationError, match=r"client 'c2' sent fields \{'n': \(3,\)\}"):
        server.aggregate(masked)


def test_a_roster_that_alters_a_clients_own_key_is_refused():
    cfg = config()
    clients = {u: SecAggClient(u, cfg) for u in IDS}
    server = SecAggServer(cfg)
    roster = server.collect_keys(open_keys(server, clients))
    assert roster["ids"] == '["c0", "c1", "c2", "c3", "c4"]'
    assert roster["enc_key"].shape == (5, 32) and roster["enc_key"].dtype == np.uint8
    swapped = dict(roster, enc_key=roster["enc_key"][[1, 0, 2, 3, 4]])
    with pytest.raises(SecureAggregationError, match=r"client 'c0': the relayed roster lacks or "
                       r"alters this client's own public keys"):
        clients["c0"].receive_peer_keys(swapped)
    with pytest.raises(SecureAggregationError, match=r"the roster's 'enc_key' must be a \(5, 32\) "
                       r"uint8 array, got uint8 \(4, 32\)"):
        clients["c0"].receive_peer_keys(dict(roster, enc_key=roster["enc_key"][:4]))


def test_threshold_must_exceed_half_the_clients():
    with pytest.raises(ValueError, match=r"threshold 2 for 5 clients: it must be an integer in "
                       r"\[3, 5\]"):
        setup(IDS, config(threshold=2))


def test_overflow_risk_is_refused_at_setup_naming_the_field():
    cfg = SecAggConfig(threshold=3, encoding=FixedPoint(scale=SCALE, bound={"n": 1.0,
                                                                           "sxx": 2e12}))
    with pytest.raises(ValueError, match=r"field 'sxx': bound 2e\+12 .* 5 clients"):
        setup(IDS, cfg)
