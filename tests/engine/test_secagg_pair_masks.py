"""Secure aggregation with pair secrets agreed once per fit (issue 23, item 5): per-exchange pair
seeds recover a dropped client without revealing any per-fit key, the multi-round rule holds
per (client, exchange), and an exchange costs no key agreement."""

from unittest import mock

import numpy as np
import pytest

from fedlatent.engine.secagg import (
    FixedPoint,
    SecAggConfig,
    SecureAggregationError,
    Wire,
    _crypto,
    run_exchange,
    setup,
    shamir,
)
from fedlatent.engine.secagg.protocol import exchange_label, pair_nonce, self_mask

SCALE = 2.0**20
IDS = [f"c{i}" for i in range(5)]


def config(slots=4):
    return SecAggConfig(3, FixedPoint(scale=SCALE, bound=100.0), slots=slots)


def inputs(seed):
    rng = np.random.default_rng(seed)
    return {u: {"s": rng.normal(0, 10, size=6)} for u in IDS}


def test_a_dropped_clients_earlier_exchange_stays_hidden_after_its_recovery():
    """c2 survives exchange 1 (the server rebuilds its self seed of slot 0) and drops in
    exchange 2 (every survivor reveals its pair mask with c2 of slot 1). From all it saw, the
    server cannot unmask c2's exchange-1 reply; the same attempt with slot 0's pair masks (which
    no one revealed) would."""
    wire = Wire(record=True)
    server, clients = setup(IDS, config(), wire=wire)
    s1, s2 = inputs(1), inputs(2)
    run_exchange(server, clients, s1, 1, "estep", IDS, wire=wire)
    run_exchange(server, clients, s2, 2, "estep", IDS, drop=["c2"], wire=wire)
    seen = [(step, u, m) for step, u, _, m in wire.log]
    (y1,) = [m["s"] for step, u, m in seen if step == "masked" and u == "c2"][:1]
    shown = [(u, m) for step, u, m in seen if step == "reveal"]
    first, second = shown[:5], dict(shown[5:])  # exchange 1: all survived; 2: c2 dropped
    index = server.roster.index
    # the server rebuilds c2's self seed of exchange 1 from three rows of "self" (row 2: c2)
    xs = np.array([[index[u] for u, _ in first[:3]]])
    ys = np.frombuffer(b"".join(m["self"][2].tobytes() for _, m in first[:3]),
                       "<u4").reshape(1, 3, shamir.LIMBS)
    (b0,) = shamir.seed_bytes(shamir.reconstruct_seeds(xs, ys))
    assert b0 == clients["c2"]._self_seeds[0]
    label, n = exchange_label(1, "estep"), 6

    def attempt(pair_masks):
        known = self_mask(b0, label, n)
        for v, m in pair_masks.items():
            known = known + m if "c2" < v else known - m
        return (y1 - known).view(np.int64) / SCALE

    revealed = {v: m["pair"][0].view("<u8") for v, m in second.items()}  # exchange 2, with c2
    assert sorted(revealed) == ["c0", "c1", "c3", "c4"]
    assert all(m.shape == (n,) for m in revealed.values())
    assert np.max(np.abs(attempt(revealed) - s1["c2"]["s"])) > 1e6  # still masked
    # the control: exchange 1's pair masks (which no one revealed), s_uv's keystream under
    # exchange 1's nonce, would unmask it
    first_masks = {v: aes_ctr_words(clients[v]._pair_block("c2")[32:], pair_nonce(label), n)
                   for v in revealed}
    assert np.max(np.abs(attempt(first_masks) - s1["c2"]["s"])) <= 1 / SCALE


def aes_ctr_words(key: bytes, nonce: bytes, n: int) -> np.ndarray:
    """``n`` little-endian words of AES-256-CTR's keystream from counter block ``nonce || 2``
    (AES-GCM's first keystream block), from ``cryptography``'s CTR mode directly."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    enc = Cipher(algorithms.AES(key), modes.CTR(nonce + (2).to_bytes(4, "big"))).encryptor()
    return np.frombuffer(enc.update(bytes(8 * n)), "<u8")


def test_a_pair_mask_is_the_aes_ctr_keystream_of_the_pair_secret_under_the_exchange_nonce():
    """Both ends of a pair compute the same mask: AES-256-CTR of s_uv (bytes 32..64 of the
    pair's HKDF block) under SHA-256(tag, label, slot)[:12]; another exchange's, or the same
    exchange's under another slot, differs entirely."""
    _, clients = setup(IDS, config())
    a, b = exchange_label(1, "estep"), exchange_label(2, "estep")
    got = clients["c0"]._pair_masks(["c1", "c3"], a, 7, 0)
    assert got.dtype == np.uint64 and got.shape == (2, 7)
    for row, v in zip(got, ["c1", "c3"]):
        secret = clients["c0"]._pair_block(v)[32:]
        assert secret == clients[v]._pair_block("c0")[32:]
        assert np.array_equal(row, aes_ctr_words(secret, pair_nonce(a, 0), 7))
        assert np.array_equal(clients[v]._pair_masks(["c0"], a, 7, 0)[0], row)
    for other in (clients["c0"]._pair_masks(["c1"], b, 7, 0)[0],
                  clients["c0"]._pair_masks(["c1"], a, 7, 1)[0]):
        assert not np.any(other == got[0])


def test_a_server_asking_one_neighbour_for_both_secrets_of_a_client_in_one_exchange_is_refused():
    _, clients = setup(IDS, config())
    stats = inputs(3)
    for u in IDS:
        clients[u].mask(stats[u], 5, "estep", IDS, slot=0)
    c0 = clients["c0"]
    with pytest.raises(SecureAggregationError, match=r"client 'c0': survivors \['c0', 'c1', "
                       r"'c2', 'c3', 'c4'\] and dropped \['c3'\] of round 5, exchange 'estep' "
                       r"must split its participants"):
        c0.reveal(5, "estep", IDS, ["c3"])  # c3 both survived and dropped
    got = c0.reveal(5, "estep", IDS, [])  # c3's self-seed share ...
    assert set(got) == {"self"} and got["self"].shape == (5, 32)
    with pytest.raises(SecureAggregationError, match=r"client 'c0': already revealed shares for "
                       r"round 5, exchange 'estep'; it reveals once per exchange"):
        c0.reveal(5, "estep", ["c0", "c1", "c2", "c4"], ["c3"])  # ... then its pair mask
    # the record is per (client, slot): a slot-0 pair mask of c3 is refused after its share
    c0._masked[exchange_label(5, "again")] = tuple(IDS)
    c0._slot_of[exchange_label(5, "again")] = 0
    with pytest.raises(SecureAggregationError, match=r"client 'c0': refusing to reveal the pair "
                       r"mask of 'c3' \(declared dropped in round 5, exchange 'again'\): its "
                       r"self-mask seed was revealed in round 5, exchange 'estep'"):
        c0.reveal(5, "again", ["c0", "c1", "c2", "c4"], ["c3"])


def test_secrets_of_different_exchanges_may_be_revealed_for_the_same_client():
    """Two exchanges open at once: c3 dropped in b (its pair masks of slot 1 revealed), then
    survived in a (its self seed of slot 0): independent secrets, so both are given."""
    server, clients = setup(IDS, config())
    stats = inputs(4)
    for u in IDS:
        clients[u].mask(stats[u], 9, "a", IDS, slot=0)
        clients[u].mask(stats[u], 9, "b", IDS, slot=1)
    got_b = clients["c0"].reveal(9, "b", ["c0", "c1", "c2", "c4"], ["c3"])
    got_a = clients["c0"].reveal(9, "a", IDS, [])
    assert got_b["pair"].shape == (1, 8 * 6) and got_a["self"].shape == (5, 32)
    assert clients["c0"]._revealed_pair["c3"] == {"1": "round 9, exchange 'b'"}
    assert clients["c0"]._revealed_self["c3"] == {"0": "round 9, exchange 'a'"}


def test_an_exchange_does_no_key_agreement_and_the_setup_one_per_neighbour():
    calls = []
    real = _crypto.agree

    def counting(key, peer):
        calls.append(peer)
        return real(key, peer)

    with mock.patch.object(_crypto, "agree", counting):
        server, clients = setup(IDS, config())
        assert len(calls) == 5 * 4  # one per (client, neighbour) on the complete graph
        stats = inputs(5)
        run_exchange(server, clients, stats, 1, "estep", IDS)
        run_exchange(server, clients, stats, 2, "estep", IDS, drop=["c1"])
    assert len(calls) == 20
    # the public keys: one X25519 key per client, one commitment per slot, the set-up's nonce
    keys = clients["c0"].public_keys()
    assert sorted(keys) == ["enc_key", "nonce", "self_commit"]
    assert keys["enc_key"].shape == keys["nonce"].shape == (32,)
    assert keys["self_commit"].shape == (4 * 32,)


def test_a_survivor_silent_at_the_reveal_next_to_a_dropped_client_is_named():
    server, clients = setup(IDS, config())
    stats = inputs(6)
    with pytest.raises(SecureAggregationError, match=r"round 1, exchange 'estep': survivors "
                       r"\['c1'\] masked with dropped 'c4' but revealed no pair mask of it"):
        run_exchange(server, clients, stats, 1, "estep", IDS, drop=["c4"], silent=["c1"])


def test_seeds_are_shared_and_rebuilt_limb_wise_over_the_mersenne_field():
    seeds = shamir.draw_seeds(3)
    assert seeds.shape == (3, shamir.LIMBS) and np.all((seeds >= 0) & (seeds < shamir.P31))
    holders = [4, 9, 17, 30, 2**31 - 2]
    shares = shamir.share_seeds(seeds, holders, 3)
    assert shares.shape == (5, 3, shamir.LIMBS) and shares.dtype == np.uint32
    for pick in ([0, 1, 2], [4, 2, 0], [1, 3, 4]):
        xs = np.array([[holders[i] for i in pick]] * 3)
        ys = np.stack([shares[pick, s] for s in range(3)])
        np.testing.assert_array_equal(shamir.reconstruct_seeds(xs, ys), seeds)
    # two shares of a threshold-3 sharing interpolate to another secret
    xs = np.array([holders[:2]] * 3)
    wrong = shamir.reconstruct_seeds(xs, np.stack([shares[:2, s] for s in range(3)]))
    assert not np.any(np.all(wrong == seeds, axis=1))
    assert np.any(shamir.share_seeds(seeds, holders, 3) != shares)  # fresh coefficients
    with pytest.raises(ValueError, match=r"distinct integers in \[1, 2\^31 - 1\)"):
        shamir.share_seeds(seeds, [1, 1, 2], 2)
    with pytest.raises(ValueError, match="x-coordinates must be distinct"):
        shamir.reconstruct_seeds(np.array([[1, 1]]), np.zeros((1, 2, shamir.LIMBS)))


def test_the_flat_encoding_is_encode_then_flatten_with_the_same_errors():
    from fedlatent.engine.secagg import Layout

    rng = np.random.default_rng(7)
    stats = {"b": rng.normal(size=(2, 3)), "a": rng.normal(size=4), "n": np.array(3.0)}
    for fp in (FixedPoint(scale=2.0**20, bound=10.0),
               FixedPoint(scale=2.0**20, bound={"a": 5.0, "b": 5.0, "n": 4.0})):
        layout, y = fp.encode_flat(stats, client="c7")
        enc = fp.encode(stats, client="c7")
        assert layout == Layout.of(enc)
        np.testing.assert_array_equal(y, layout.flatten(enc, np.uint64))
    with pytest.raises(ValueError, match=r"client 'c7': field 'n' has \|value\| 3 beyond the "
                       r"declared bound 2"):
        FixedPoint(scale=2.0**20, bound={"a": 5.0, "b": 5.0, "n": 2.0}).encode_flat(
            stats, client="c7")
    with pytest.raises(ValueError, match=r"client 'c7': field 'a' has 1 non-finite values"):
        FixedPoint(scale=2.0**20, bound=10.0).encode_flat(dict(stats, a=np.array([np.nan])),
                                                          client="c7")
