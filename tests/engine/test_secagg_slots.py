"""Per-exchange secrets (``SecAggConfig(slots=E)``): a client that survived earlier exchanges
and drops later is recovered, and what the server rebuilds for one exchange unmasks no other."""

import numpy as np
import pytest

from fedlatent.engine.secagg import (
    FixedPoint,
    SecAggConfig,
    SecureAggregationError,
    run_exchange,
    setup,
    shamir,
)
from fedlatent.engine.secagg.protocol import exchange_label, self_mask

SCALE = 2.0**20
IDS = [f"c{i}" for i in range(5)]


def config(slots=4, threshold=3):
    return SecAggConfig(threshold, FixedPoint(scale=SCALE, bound=100.0), slots=slots)


def inputs(seed):
    rng = np.random.default_rng(seed)
    return {u: {"s": rng.normal(0, 10, size=6)} for u in IDS}


def test_a_survivor_of_two_exchanges_dropping_in_the_third_is_recovered():
    server, clients = setup(IDS, config())
    for k in (1, 2):
        stats = inputs(k)
        got = run_exchange(server, clients, stats, k, "estep", IDS)
        assert np.max(np.abs(got["s"] - sum(stats[u]["s"] for u in IDS))) <= 5 / (2 * SCALE)
    stats = inputs(3)
    got = run_exchange(server, clients, stats, 3, "estep", IDS, drop=["c2"])
    alive = [u for u in IDS if u != "c2"]
    assert np.max(np.abs(got["s"] - sum(stats[u]["s"] for u in alive))) <= 4 / (2 * SCALE)
    assert server.excluded == {"c2": "round 3, exchange 'estep'"}
    with pytest.raises(SecureAggregationError, match=r"round 4, exchange 'estep': \['c2'\] were "
                       r"declared dropped in round 3, exchange 'estep'"):
        server.announce(4, "estep", IDS)


def test_secrets_rebuilt_for_one_exchange_do_not_unmask_another():
    """c2's self-mask seed of exchange 1 (rebuilt by the server) and its pair masks of exchange
    3 (revealed when it dropped there) leave its exchange-1 reply masked by the pair masks of
    slot 0."""
    server, clients = setup(IDS, config())
    stats = inputs(1)
    c = clients["c2"]
    y1 = c.mask(stats["c2"], 1, "estep", IDS, slot=0)
    label = exchange_label(1, "estep")
    n = 6
    seed0 = c._self_seeds[0]  # what survivors' shares of slot 0 rebuild
    known = self_mask(seed0, label, n)
    for v in IDS:
        if v == "c2":
            continue
        m = clients[v]._pair_masks(["c2"], exchange_label(3, "estep"), n, 2)[0]  # revealed
        known = known + m if "c2" < v else known - m
    guess = (y1["s"] - known).view(np.int64) / SCALE
    assert np.max(np.abs(guess - stats["c2"]["s"])) > 1e6  # still masked
    # the shares held for slot 0 and slot 2 are of different secrets, each a field element
    held = np.frombuffer(clients["c0"]._blobs["c2"], "<u4").reshape(4, shamir.LIMBS)
    assert np.any(held[0] != held[2]) and np.all(held < shamir.P31)


def test_slots_are_announced_once_each_and_run_out_with_a_clear_message():
    server, clients = setup(IDS, config(slots=2))
    stats = inputs(4)
    run_exchange(server, clients, stats, 1, "a", IDS)
    with pytest.raises(SecureAggregationError, match=r"client 'c0': slot 0 announced for round 2, "
                       r"exchange 'b' was already used by another exchange"):
        clients["c0"].mask(stats["c0"], 2, "b", IDS, slot=0)
    run_exchange(server, clients, stats, 2, "b", IDS)
    with pytest.raises(SecureAggregationError, match=r"round 3, exchange 'c': the 2 exchanges "
                       r"planned at set-up are used up; set up again with more slots"):
        server.announce(3, "c", IDS)


def test_a_client_rebuilt_from_its_dump_every_message_gives_the_same_protocol():
    """What a Flower node does: its client is rebuilt from JSON before each message."""
    from fedlatent.engine.secagg import SecAggClient

    server, clients = setup(IDS, config())
    stats = inputs(5)
    for k in (1, 2):
        clients = {u: SecAggClient.load(c.dump()) for u, c in clients.items()}
        drop = ["c4"] if k == 2 else []
        got = run_exchange(server, clients, stats, k, "estep", IDS, drop=drop)
        alive = [u for u in IDS if u not in drop]
        assert np.max(np.abs(got["s"] - sum(stats[u]["s"] for u in alive))) <= 5 / (2 * SCALE)
    again = SecAggClient.load(clients["c0"].dump())
    assert again.dump() == clients["c0"].dump()
    with pytest.raises(SecureAggregationError, match=r"client 'c0': already revealed shares for "
                       r"round 2, exchange 'estep'"):
        again.reveal(2, "estep", [u for u in IDS if u != "c4"], ["c4"])
