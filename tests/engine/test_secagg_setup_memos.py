"""The set-up's per-process shortcuts (issue 37, the 10,000-client set-up) answer as the full
checks do: an array nobody can write is relayed uncopied and only such an array is taken for
another; a neighbour's keys pass the openings check at once only when equal byte for byte to
rows hashed to those very openings; a remembered key announcement counts only for the same
signature, rostered key and keys, and anything else is verified by ``cryptography`` (and
refused when it does not verify)."""

import json

import numpy as np
import pytest

pytest.importorskip("cryptography")

from fedlatent.engine.protocol.messages import frozen, same_frozen  # noqa: E402
from fedlatent.engine.secagg import commitments  # noqa: E402
from fedlatent.engine.secagg.enrol import _Verified  # noqa: E402
from fedlatent.engine.site.keys import Roster, SiteKeys  # noqa: E402
from fedlatent.engine.transport.inprocess import _freeze  # noqa: E402


def test_only_memory_nobody_can_write_is_frozen_and_relayed_uncopied():
    raw = bytes(range(64))
    a = np.frombuffer(raw, dtype=np.uint8).reshape(2, 32)
    assert frozen(a) and frozen(a[1:]) and frozen(a.view(np.uint64))
    with pytest.raises(ValueError):
        a.flags.writeable = True  # NumPy refuses: the memory is immutable bytes
    w = np.zeros((2, 32), dtype=np.uint8)
    ro = w.view()
    ro.flags.writeable = False  # read-only view of writeable memory: not frozen
    assert not frozen(w) and not frozen(ro) and not frozen(np.frombuffer(bytearray(raw)))
    assert same_frozen(a, a.reshape(2, 32)) and not same_frozen(a, a[:1])
    b = np.frombuffer(raw[:32] + raw[32:], dtype=np.uint8).reshape(2, 32)  # other memory
    assert np.array_equal(a, b) and frozen(b) and not same_frozen(a, b)
    assert not same_frozen(w, w)  # the same writeable memory is never taken as unchanged
    assert _freeze({"openings": a})["openings"] is not a  # other methods: copied
    sent = _freeze({"openings": a, "keys": w, "ro": ro, "n": 3}, share=True)
    assert sent["openings"] is a  # the set-up's: relayed as is, as a copy would be
    assert sent["keys"] is not w and np.array_equal(sent["keys"], w)
    assert sent["ro"] is not ro and not np.shares_memory(sent["ro"], w)
    w[0, 0] = 7
    assert sent["keys"][0, 0] == 0 and sent["ro"][0, 0] == 0


def _table(n=6, seed=0):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (n, 64), dtype=np.uint8)
    return rows, commitments.opened_table(rows)


def test_the_openings_check_at_once_is_the_hashing_check():
    rows, opened = _table()
    assert frozen(opened)
    for r, o in zip(rows, opened):  # the table is each row's opening
        assert o.tobytes() == commitments.opening(r[:32].tobytes(), r[32:].tobytes())
    at = np.array([4, 1, 5])
    assert commitments.openings_hold(opened, rows[at], at)  # found at once
    copied = opened.copy()  # the same values, not the hashed table: every row hashed
    assert not same_frozen(copied, opened)
    assert commitments.openings_hold(copied, rows[at], at)
    for o in (opened, copied):
        bad = rows[at].copy()
        bad[2, 40] ^= 1  # one bit of one neighbour's key
        assert not commitments.openings_hold(o, bad, at)
        assert not commitments.openings_hold(o, rows[at], np.array([4, 1, 3]))  # another place


def test_a_remembered_key_announcement_counts_only_for_the_same_bytes(monkeypatch):
    import fedlatent.engine.site.keys as site_keys

    head, ids = b"head\x00", ["a", "b", "c"]
    keys = {u: SiteKeys.generate() for u in ids}
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 256, (3, 96), dtype=np.uint8)

    def sign(u, row):
        return np.frombuffer(keys[u].sign_bytes(head + json.dumps(u).encode() + b"\x00"
                                                + row.tobytes()), dtype=np.uint8)

    sigs = np.stack([sign(u, r) for u, r in zip(ids, rows)])
    trust = Roster({u: k.public_key for u, k in keys.items()})
    table, at = _Verified(head, 3, 96), np.arange(3)
    table.ids = tuple(ids)
    calls = []
    real = site_keys.verify_bytes
    monkeypatch.setattr(site_keys, "verify_bytes", lambda *a: calls.append(a) or real(*a))
    assert table.check(ids, at, rows, sigs, trust) == 3 and len(calls) == 3
    assert table.check(ids, at, rows, sigs, trust) == 3 and len(calls) == 3  # found at once
    assert table.check(ids[1:], at[1:], rows[1:], sigs[1:], trust) == 2 and len(calls) == 3
    other = rows.copy()
    other[1, 50] ^= 1  # b's keys substituted: verified again, and refused
    assert table.check(ids, at, other, sigs, trust) == 1 and len(calls) == 4
    worse = sigs.copy()
    worse[2] = 0  # c unsigned
    assert table.check(ids, at, rows, worse, trust) == 2
    stranger = SiteKeys.generate()  # a's announcement under another rostered key
    moved = Roster({"a": stranger.public_key, "b": keys["b"].public_key,
                    "c": keys["c"].public_key})
    assert table.check(ids, at, rows, sigs, moved) == 0
    assert table.check(ids, at, rows, sigs, Roster({"b": keys["b"].public_key})) == 0  # a not
    assert table.check(ids, at, rows, sigs, trust) == 3  # the verified ones still found
