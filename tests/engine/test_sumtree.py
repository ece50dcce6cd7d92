"""The projected sum tree (issue 38's transcript): every site checks, from its own leaf and a
path of ceil(log2 n) nodes, that the aggregate it is shown is the committed sum of the
survivors' leaves; a server that changes the aggregate, drops or alters a site's leaf, or lies
about a node of the path is refused by the sites whose paths it touches."""

from __future__ import annotations

import numpy as np
import pytest

from fedlatent.engine.secagg.protocol import SecureAggregationError
from fedlatent.engine.secagg.sumtree import (
    PRIMES,
    PROJECTIONS,
    SumTree,
    challenge,
    project,
    read_paths,
    ring_sum,
    verify_leaf,
    verify_zero,
    zero_fields,
)

LABEL = b"run/round 3/estep"


def _leaves(n, m=7, seed=0):
    return np.random.default_rng(seed).integers(0, 2**64, size=(n, m), dtype=np.uint64)


def _ids(n):
    return [f"s{i:04d}" for i in range(n)]


def _verify_all(tree, leaves, A=None, c=None, root=None):
    n = len(tree.ids)
    return [verify_leaf(LABEL, i, n, tree.ids[i], leaves[i], tree.A if A is None else A,
                        tree.c if c is None else c, tree.root if root is None else root,
                        tree.path(i)) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 13, 100])
def test_every_site_accepts_the_honest_tree_and_gets_one_digest(n):
    leaves = _leaves(n)
    tree = SumTree(LABEL, _ids(n), leaves)
    assert np.array_equal(tree.A, leaves.sum(axis=0, dtype=np.uint64))  # the ring sum
    digests = set(_verify_all(tree, leaves))
    assert digests == {tree.digest()}
    depth = int(np.ceil(np.log2(n))) if n > 1 else 0
    assert all(len(tree.path(i)[0]) <= 32 * depth for i in range(n))


def test_the_carries_make_the_integer_sum():
    leaves = _leaves(50, m=4, seed=1)
    A, c = ring_sum(leaves)
    exact = [sum(int(v) for v in leaves[:, j]) for j in range(4)]
    assert [int(a) + (int(k) << 64) for a, k in zip(A, c)] == exact


def test_projections_are_linear_modulo_p():
    leaves = _leaves(9, m=5, seed=2)
    A, c = ring_sum(leaves)
    r = challenge(LABEL, A, c)
    assert r.shape == (PROJECTIONS, 5) and all(int(r[j].max()) < p for j, p in enumerate(PRIMES))
    total = project(r, leaves).sum(axis=0) % np.array(PRIMES, dtype=np.uint64)
    want = [sum(int(r[j, k]) * ((int(A[k]) + (int(c[k]) << 64)) % p) for k in range(5)) % p
            for j, p in enumerate(PRIMES)]
    assert [int(t) for t in total] == want


class _Lying(SumTree):
    """A server claiming the aggregate ``A`` (carries ``c``) for the true leaves: the tree
    built honestly around the false claim (its challenge is the false claim's)."""

    def __init__(self, label, ids, leaves, A, c):
        self.label, self.ids = bytes(label), list(ids)
        self.A, self.c = A, c
        self._commit(leaves)


@pytest.mark.parametrize("word, bit", [(0, 40), (3, 0), (6, 63)])
def test_a_changed_aggregate_is_refused_by_every_site(word, bit):
    leaves = _leaves(20)
    honest = SumTree(LABEL, _ids(20), leaves)
    A = honest.A.copy()
    step = np.zeros_like(A)
    step[word] = np.uint64(1) << np.uint64(bit)  # bit 40 of a word: a relative change ~1e-7
    A = A + step  # (wrapping in the ring)
    tree = _Lying(LABEL, _ids(20), leaves, A, honest.c)
    for i in range(20):
        with pytest.raises(SecureAggregationError, match="is not the sum the tree commits to"):
            verify_leaf(LABEL, i, 20, tree.ids[i], leaves[i], A, tree.c, tree.root,
                        tree.path(i))
        with pytest.raises(SecureAggregationError, match="refusing it"):  # old tree, new claim
            verify_leaf(LABEL, i, 20, tree.ids[i], leaves[i], A, honest.c, honest.root,
                        honest.path(i))


def test_a_tree_without_a_sites_own_vector_is_refused_by_that_site():
    leaves = _leaves(16)
    forged = leaves.copy()
    forged[5] = 0  # the server leaves site 5's contribution out
    tree = SumTree(LABEL, _ids(16), forged)
    for i in range(16):
        if i == 5:
            with pytest.raises(SecureAggregationError,
                               match=r"site 's0005': its own contribution \(leaf 5\) is not in "
                                     "the committed sum"):
                verify_leaf(LABEL, 5, 16, "s0005", leaves[5], tree.A, tree.c, tree.root,
                            tree.path(5))
        else:
            verify_leaf(LABEL, i, 16, tree.ids[i], leaves[i], tree.A, tree.c, tree.root,
                        tree.path(i))


def test_a_lie_in_a_node_of_the_path_is_refused():
    leaves = _leaves(8)
    tree = SumTree(LABEL, _ids(8), leaves)
    raw, sums = tree.path(0)
    bad = sums.copy()
    bad[1, 0] = (bad[1, 0] + np.uint64(1)) % np.uint64(PRIMES[0])
    with pytest.raises(SecureAggregationError, match="not in the committed sum"):
        verify_leaf(LABEL, 0, 8, "s0000", leaves[0], tree.A, tree.c, tree.root, (raw, bad))
    with pytest.raises(SecureAggregationError, match="too short"):
        verify_leaf(LABEL, 0, 8, "s0000", leaves[0], tree.A, tree.c, tree.root,
                    (raw[:32], sums[:1]))


def test_another_label_or_another_position_is_refused():
    leaves = _leaves(6)
    tree = SumTree(LABEL, _ids(6), leaves)
    with pytest.raises(SecureAggregationError,
                       match=r"its own contribution \(leaf 2\) is not in the committed sum"):
        verify_leaf(b"run/round 4/estep", 2, 6, "s0002", leaves[2], tree.A, tree.c, tree.root,
                    tree.path(2))
    with pytest.raises(SecureAggregationError,  # its leaf shown at another site's place
                       match=r"its own contribution \(leaf 3\) is not in the committed sum"):
        verify_leaf(LABEL, 3, 6, "s0002", leaves[2], tree.A, tree.c, tree.root, tree.path(3))


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
def test_the_transcript_fields_give_back_the_claim_and_the_path_exactly(n):
    """What a site is sent (the sum in its fewest bytes, the carries as offsets, the path as
    bytes, no root) reads back to the tree's A, c and path: the site reaches the tree's root
    and digest; the carries of n uniform leaves cross as one byte each."""
    from fedlatent.engine.secagg.sumtree import read_transcript, shared_fields, transcript_fields

    leaves = _leaves(n, m=66, seed=n)  # (masked: uniform, but summing to small words, as
    small = np.random.default_rng(n).integers(-2**40, 2**40, size=66)  # an aggregate does)
    leaves[-1] = small.view(np.uint64) - leaves[:-1].sum(axis=0, dtype=np.uint64)
    tree = SumTree(LABEL, _ids(n), leaves)
    shared = shared_fields(tree)
    assert set(shared) == {"verify/A"}  # (the carries: offsets from the least, uint8; the
    assert shared["verify/A"].size == 66 + 2 + 66 * 6 + 1  # least, <u2; 41-bit words: 6 bytes)
    for i in sorted({0, n // 2, n - 1}):
        msg = {**shared, **transcript_fields(tree, i)}
        assert "verify/root" not in msg
        at, size, A, c, path = read_transcript(msg, 66)
        assert (at, size) == (i, n)
        assert np.array_equal(A, tree.A) and np.array_equal(c, tree.c)
        assert verify_leaf(LABEL, at, size, tree.ids[i], leaves[i], A, c, None, path) \
            == tree.digest()
        assert verify_leaf(LABEL, at, size, tree.ids[i], leaves[i], A, c, tree.root, path) \
            == tree.digest()
    if n == 1:
        return
    with pytest.raises(SecureAggregationError, match="do not fit this site's contribution"):
        read_transcript({**msg, "verify/A": msg["verify/A"][1:]}, 66)
    with pytest.raises(SecureAggregationError, match="do not fit this site's contribution"):
        read_transcript({**msg, "verify/path": msg["verify/path"][:-3]}, 66)


def test_the_ring_sum_packs_in_a_common_width_and_back_exactly():
    from fedlatent.engine.secagg.sumtree import pack_ring, unpack_ring

    rng = np.random.default_rng(5)
    edges = np.array([0, 1, -1, 127, -128, 128, -129, 2**31, -2**31 - 1,
                      np.iinfo(np.int64).max, np.iinfo(np.int64).min], dtype=np.int64)
    for _ in range(300):
        m = int(rng.integers(1, 80))
        bits = rng.integers(0, 63, size=m)
        v = (rng.integers(0, 2**62, size=m, dtype=np.int64) >> (62 - bits)) \
            * rng.choice([-1, 1], size=m)
        v[rng.random(m) < 0.1] = rng.choice(edges)
        A = v.view(np.uint64)
        raw = pack_ring(A)
        assert np.array_equal(unpack_ring(raw, m), A)
        assert unpack_ring(raw[1:], m) is None and unpack_ring(raw[:-1], m) is None
    small = (rng.integers(-2**30, 2**30, size=66)).view(np.uint64)
    assert pack_ring(small).size == 66 * 4 + 1  # (31-bit magnitudes: 4 bytes a word)


def test_a_ghost_leaf_passes_each_sites_own_check_so_the_tree_must_be_the_rosters():
    """Why a site checks the tree's size and its own place (node/verify.py: the roster's):
    a leaf that belongs to no site, holding any vector, passes every site's own check."""
    n = 9
    leaves, ids = _leaves(n), _ids(n)
    delta = np.zeros(leaves.shape[1], dtype=np.uint64)
    delta[0] = 12345
    tree = SumTree(LABEL, ids + ["zzzz-ghost"], np.vstack([leaves, delta[None]]))
    assert all(verify_leaf(LABEL, i, n + 1, ids[i], leaves[i], tree.A, tree.c, None,
                           tree.path(i)) for i in range(n))
    assert not np.array_equal(tree.A, ring_sum(leaves)[0])


@pytest.mark.parametrize("n", [2, 6, 13, 100])
def test_zero_leaves_are_shown_by_their_paths_and_a_ghost_in_one_is_not(n):
    """The paths of the absent sites' leaves (zero_fields) read back exactly and climb from a
    zero leaf to the root the survivors reach; a vector in an absent slot does not."""
    leaves, ids = _leaves(n, seed=5), _ids(n)
    absent = sorted({0, n // 2, n - 1})
    leaves[absent] = 0
    tree = SumTree(LABEL, ids, leaves)
    paths = read_paths(zero_fields(tree, absent))
    assert sorted(paths) == absent and all(p[0] == n for p in paths.values())
    for i in absent:
        raw, sums = tree.path(i)
        assert paths[i][1][0] == raw and np.array_equal(np.asarray(paths[i][1][1]).reshape(
            sums.shape), sums)
        assert verify_zero(LABEL, i, n, ids[i], tree.A, tree.c, paths[i][1], tree.digest())
    ghost = leaves.copy()
    ghost[absent[0], 0] = 7
    forged = SumTree(LABEL, ids, ghost)
    path = read_paths(zero_fields(forged, absent[:1]))[absent[0]][1]
    assert not verify_zero(LABEL, absent[0], n, ids[absent[0]], forged.A, forged.c, path,
                           forged.digest())
    assert read_paths({}) == {} and zero_fields(tree, []) == {}


def test_the_challenge_is_read_from_one_shake128_of_the_claim():
    """r: the 64-bit words after the first 32 bytes (the claim's key, which the digest binds)
    of SHAKE-128 of the tag, the label, m and the claim's bytes as sent, one a place, modulo
    each of PRIMES;
    the digest is SHA-256 of the tag, the root and that key; another word of A gives another
    r and another digest."""
    import hashlib
    import struct

    from fedlatent.engine.secagg.sumtree import CHALLENGE_TAG, DIGEST_TAG, shared_fields

    leaves = _leaves(5, m=9, seed=3)
    tree = SumTree(LABEL, _ids(5), leaves)
    A, c = tree.A, tree.c
    claim = shared_fields(tree)["verify/A"].tobytes()  # (the claim as the sites are sent it)
    out = hashlib.shake_128(CHALLENGE_TAG + struct.pack("<Q", len(LABEL)) + LABEL
                            + struct.pack("<Q", 9) + claim).digest(32 + 8 * 9)
    words = np.frombuffer(out[32:], "<u8")
    r = challenge(LABEL, A, c)
    assert [[int(v) for v in row] for row in r] == [[int(w) % p for w in words] for p in PRIMES]
    assert tree.digest() == hashlib.sha256(DIGEST_TAG + tree.root + out[:32]).digest()
    A2 = A.copy()
    A2[4] ^= np.uint64(1)
    assert (challenge(LABEL, A2, c) != r).sum() >= PROJECTIONS * 9 - 2
    assert _Lying(LABEL, _ids(5), leaves, A2, c).digest() != tree.digest()


@pytest.mark.parametrize("n", [5, 1000])
def test_a_path_as_the_transcript_sends_it_is_checked_as_strictly(n):
    """The path's bytes as read_transcript gives them: a flipped bit of a sibling's hash or a
    changed sum, a level missing, a false aggregate or a leaf left out are refused; bytes
    beyond the levels the leaf's place has are not read (as the (hashes, sums) form)."""
    from fedlatent.engine.secagg.sumtree import read_transcript, shared_fields, transcript_fields

    L = 32 + 4 * PROJECTIONS  # (bytes a level: the sibling's hash and its sums)
    leaves, ids = _leaves(n, m=12, seed=n), _ids(n)
    tree = SumTree(LABEL, ids, leaves)
    i = n // 2 + 1
    at, size, A, c, path = read_transcript({**shared_fields(tree), **transcript_fields(tree, i)},
                                           12)
    assert isinstance(path, bytes) and len(path) == L * len(tree.path(i)[1])
    assert verify_leaf(LABEL, at, size, ids[i], leaves[i], A, c, None, path) == tree.digest()
    assert verify_leaf(LABEL, at, size, ids[i], leaves[i], A, c, None, path + bytes(L)) \
        == tree.digest()
    for k in range(len(path) // L):
        bad = bytearray(path)
        bad[L * k + 7] ^= 1  # a sibling's hash: another root, so another digest (its
        bad = bytes(bad)  # neighbours refuse to reveal), refused against the tree's root
        assert verify_leaf(LABEL, at, size, ids[i], leaves[i], A, c, None, bad) \
            != tree.digest()
        with pytest.raises(SecureAggregationError, match="does not reach the root"):
            verify_leaf(LABEL, at, size, ids[i], leaves[i], A, c, tree.root, bad)
        bad = bytearray(path)
        bad[L * k + 33] ^= 1  # a sibling's sum
        with pytest.raises(SecureAggregationError, match="not in the committed sum"):
            verify_leaf(LABEL, at, size, ids[i], leaves[i], A, c, None, bytes(bad))
    with pytest.raises(SecureAggregationError, match="too short"):
        verify_leaf(LABEL, at, size, ids[i], leaves[i], A, c, None, path[:-L])
    false = A.copy()
    false[3] += np.uint64(1 << 20)
    with pytest.raises(SecureAggregationError, match="not in the committed sum"):
        verify_leaf(LABEL, at, size, ids[i], leaves[i], false, c, None, path)
    forged = leaves.copy()
    forged[i] = 0  # the server leaves this site's contribution out
    lying = SumTree(LABEL, ids, forged)
    _, _, A2, c2, path2 = read_transcript({**shared_fields(lying),
                                           **transcript_fields(lying, i)}, 12)
    with pytest.raises(SecureAggregationError, match=r"its own contribution \(leaf \d+\)"):
        verify_leaf(LABEL, at, size, ids[i], leaves[i], A2, c2, None, path2)


def test_the_ring_sum_reads_back_from_strided_bytes_in_every_width():
    """unpack_ring reads each common width (1..8 bytes a word, wide words aside) from a
    strided view of the bytes as from the bytes themselves."""
    from fedlatent.engine.secagg.sumtree import pack_ring, unpack_ring

    rng = np.random.default_rng(8)
    for bits in range(4, 63, 4):
        A = rng.integers(-2**bits, 2**bits, size=40).view(np.uint64)
        A[[3, 17]] = np.array([2**62, -2**62], dtype=np.int64).view(np.uint64)  # (wide)
        raw = pack_ring(A)
        spaced = np.zeros(2 * raw.size, dtype=np.uint8)
        spaced[::2] = raw
        assert np.array_equal(unpack_ring(raw, 40), A)
        assert np.array_equal(unpack_ring(spaced[::2], 40), A)


@pytest.mark.parametrize("how", ["plus p", "carry", "plus p q"])
def test_a_claim_congruent_to_the_sum_modulo_some_primes_is_refused(how):
    """A false aggregate whose integer claim A' + 2^64 c' equals the true sum modulo 2^31 - 1
    (A + p in one word; or another word with one more carry) or modulo two of the primes
    (A + p q), its tree built honestly around it, is refused by every site: the projections
    modulo the other primes tell it apart (with one modulus, every site passed it)."""
    n, p, q = 20, PRIMES[0], PRIMES[1]
    leaves = _leaves(n)
    honest = SumTree(LABEL, _ids(n), leaves)
    A, c = honest.A.copy(), honest.c.copy()
    step = {"plus p": p, "carry": -((1 << 64) % p), "plus p q": p * q}[how]
    a = int(A[3]) + step  # (A' + 2^64 (c + 1) = A + 2^64 c modulo p: A' = A - (2^64 mod p))
    A[3] = np.uint64(a if 0 <= a < 1 << 64 else a - 2 * step if how != "carry" else a + p)
    c[3] += np.uint64(how == "carry")
    S, S1 = (int(v[3]) + (int(w[3]) << 64) for v, w in ((honest.A, honest.c), (A, c)))
    assert S1 != S and (S1 - S) % p == 0 and (how != "plus p q" or (S1 - S) % q == 0)
    assert int(c.max()) < n and not np.array_equal(A, honest.A)
    tree = _Lying(LABEL, _ids(n), leaves, A, c)
    for i in range(n):
        with pytest.raises(SecureAggregationError, match="is not the sum the tree commits to"):
            verify_leaf(LABEL, i, n, tree.ids[i], leaves[i], A, c, tree.root, tree.path(i))
        with pytest.raises(SecureAggregationError, match=r"its own contribution \(leaf \d+\)"):
            verify_leaf(LABEL, i, n, tree.ids[i], leaves[i], A, c, None, tree.path(i))


def test_carries_a_sum_of_n_leaves_cannot_have_and_too_many_leaves_are_refused():
    """Carries of n or more (n words below 2^64 carry at most n - 1; a larger carry could make
    a false claim congruent to the sum) and trees beyond MAX_LEAVES are refused before any
    hash; the largest carries of a sum of n leaves pass."""
    from fedlatent.engine.secagg.sumtree import MAX_LEAVES

    n = 6
    leaves = np.full((n, 3), np.iinfo(np.uint64).max, dtype=np.uint64)
    tree = SumTree(LABEL, _ids(n), leaves)
    assert int(tree.c.max()) == n - 1
    assert verify_leaf(LABEL, 2, n, tree.ids[2], leaves[2], tree.A, tree.c, None,
                       tree.path(2)) == tree.digest()
    c = tree.c.copy()
    c[1] = np.uint64(n)
    with pytest.raises(SecureAggregationError, match="more than a sum of 6 leaves can carry"):
        verify_leaf(LABEL, 2, n, tree.ids[2], leaves[2], tree.A, c, None, tree.path(2))
    from fedlatent.engine.secagg.sumtree import _claim  # (with the bytes they were read from)

    with pytest.raises(SecureAggregationError, match="more than a sum of 6 leaves can carry"):
        verify_leaf(LABEL, 2, n, tree.ids[2], leaves[2], tree.A, c, None, tree.path(2),
                    _claim(tree.A, c))
    with pytest.raises(SecureAggregationError, match=f"at most {MAX_LEAVES}"):
        verify_leaf(LABEL, 2, MAX_LEAVES + 1, tree.ids[2], leaves[2], tree.A, tree.c, None,
                    tree.path(2))


def test_carries_past_2_63_without_the_claims_bytes_are_refused_by_the_carries_rule():
    """A carry no int64 holds (2^64 - 1), the claim's bytes not given: refused by the carries
    rule, with its words (the claim made from A and c only after that rule)."""
    n = 4
    leaves = _leaves(n, m=3, seed=9)
    tree = SumTree(LABEL, _ids(n), leaves)
    c = tree.c.copy()
    c[0] = np.iinfo(np.uint64).max
    with pytest.raises(SecureAggregationError, match="reach 18446744073709551615, more than"):
        verify_leaf(LABEL, 1, n, tree.ids[1], leaves[1], tree.A, c, None, tree.path(1))


@pytest.mark.parametrize("n, span", [(5, 3), (1000, 300), (70_000, 70_000 - 1), (2**28, 2**20)])
def test_the_claim_reads_back_in_every_carry_width_and_index_width(n, span):
    """verify/A holds the carries (offsets from the least in 1, 2 or 4 bytes, as bits 4-5 of
    its last byte say; the least in 2 bytes up to 65,536 leaves, else 4) and the sum (its
    wide words' indices in 1 byte up to 256 words, else 2): each reads back exactly; a
    width code of 3, or a byte more or less, does not parse."""
    from types import SimpleNamespace

    from fedlatent.engine.secagg.sumtree import read_transcript, shared_fields

    rng = np.random.default_rng(n)
    for m in (3, 300):
        c = rng.integers(0, n - span, dtype=np.int64) + rng.integers(0, span + 1, size=m)
        A = rng.integers(-2**20, 2**20, size=m)
        A[rng.random(m) < 0.1] = 2**62 - 1  # (wide words)
        tree = SimpleNamespace(ids=range(n), A=A.view(np.uint64), c=c.astype(np.uint64))
        field = shared_fields(tree)["verify/A"]
        head = np.array([n - 1, n], "<u4").view(np.uint8)
        got = read_transcript({"verify/A": field, "verify/path": head}, m)
        assert np.array_equal(got[2], tree.A) and np.array_equal(got[3], tree.c)
        assert got[:2] == (n - 1, n)
        bad = field.copy()
        bad[-1] |= 3 << 4
        for v in (bad, field[1:], np.concatenate([field[:1], field])):
            with pytest.raises(SecureAggregationError, match="do not fit this site's"):
                read_transcript({"verify/A": v, "verify/path": head}, m)


def test_sibling_sums_made_up_to_fit_a_false_claim_split_the_root():
    """A server showing a false aggregate (its tree honest below the root) and each half of
    the tree the sibling sums that complete the claim: every site's own path then reaches the
    claim, but a node binds its children's sums, so the two halves reach different roots
    (different digests, so neighbours across refuse to reveal); were a node to bind only its
    own sums, all sites would reach one root and pass the false sum."""
    n = 16
    leaves = _leaves(n)
    honest = SumTree(LABEL, _ids(n), leaves)
    A = honest.A.copy()
    A[3] += np.uint64(12345)
    tree = _Lying(LABEL, _ids(n), leaves, A, honest.c)
    from fedlatent.engine.secagg.sumtree import _claim_hash, _projections

    words = _claim_hash(LABEL, tree.claim, A.size)[1]
    _, claimed = _projections(words, np.zeros(A.size, np.uint64), A, tree.c)
    top = tree.levels[-2][1]  # (the root's children's sums)
    primes = np.array(PRIMES, dtype=np.uint64)
    digests = {}
    for i in range(n):
        raw, sums = tree.path(i)
        sums = sums.copy()
        sums[-1] = (np.array(claimed, dtype=np.uint64) + primes - top[i // 8]) % primes
        digests[i] = verify_leaf(LABEL, i, n, tree.ids[i], leaves[i], A, tree.c, None,
                                 (raw, sums))  # (each site alone: its path reaches the claim)
    assert len({digests[i] for i in range(8)}) == 1 and len({digests[i] for i in range(8, 16)}) == 1
    assert digests[0] != digests[8]


def test_the_claim_is_hashed_as_sent_and_another_encoding_of_it_is_another_digest():
    """verify_leaf hashes the claim's bytes as the site read them (claim_bytes): the honest
    bytes give the tree's digest; the same (A, c) sent in another encoding (a word listed
    wide though it fits the common width) reads back to the same A and c but gives another r,
    so the honest tree's path fails it, and another key, so a tree built on those bytes has
    another digest (its neighbours, shown the first bytes, refuse to reveal)."""
    from fedlatent.engine.secagg.sumtree import claim_bytes, read_transcript, transcript_fields

    n, m = 9, 12
    leaves, ids = _leaves(n, m=m, seed=4), _ids(n)
    tree = SumTree(LABEL, ids, leaves)
    msg = {"verify/A": tree.claim, **transcript_fields(tree, 4)}
    at, size, A, c, path = read_transcript(msg, m)
    assert verify_leaf(LABEL, at, size, ids[4], leaves[4], A, c, None, path,
                       claim_bytes(msg)) == tree.digest()
    w = int(tree.claim[-1]) & 15
    k = m * w  # (where the wide words end: none here; one more, word 0 again, 1 + 8 bytes)
    assert tree.claim.size - 1 - 2 - m * (1 << (int(tree.claim[-1]) >> 4 & 3)) == k
    extra = np.concatenate([[0], tree.A[:1].view(np.uint8)]).astype(np.uint8)
    other = np.concatenate([tree.claim[:k], extra, tree.claim[k:]])
    again = read_transcript({**msg, "verify/A": other}, m)
    assert np.array_equal(again[2], A) and np.array_equal(again[3], c)
    with pytest.raises(SecureAggregationError, match="not in the committed sum"):
        verify_leaf(LABEL, at, size, ids[4], leaves[4], A, c, None, path, other)
    from fedlatent.engine.secagg.sumtree import _claim_hash

    assert _claim_hash(LABEL, other, m)[0] != _claim_hash(LABEL, tree.claim, m)[0]


@pytest.mark.parametrize("m", [1, 66, 1000, (1 << 16) - 1, 1 << 16])
def test_a_sites_projections_are_the_servers_exactly(m):
    """verify_leaf's projections (exact integer sums of the challenge's words times its leaf,
    A and c, reduced at the end) equal project()'s of r = the words modulo each prime (the
    server's), exactly: with every word of the leaf, A and the challenge 2^64 - 1 and the
    carries at 2^28 - 1 (the largest limb products and sums, at and past the length from
    which the words are split in quarters) as with random words."""
    from fedlatent.engine.secagg.sumtree import _projections, _reduced

    rng = np.random.default_rng(m)
    primes = np.array(PRIMES, dtype=np.uint64)
    for extreme in (True, False):
        z, A, w = (rng.integers(0, 2**64, m, dtype=np.uint64) for _ in range(3))
        c = rng.integers(0, 2**28, m).astype(np.uint64)
        if extreme:
            z[:], A[:], w[:], c[:] = np.iinfo(np.uint64).max, np.iinfo(np.uint64).max, \
                np.iinfo(np.uint64).max, 2**28 - 1
        words = w.astype("<u8").tobytes()
        r = _reduced(words)
        assert np.array_equal(r, w[None, :] % primes[:, None])
        got = _projections(words, z, A, c)
        two64 = np.array([(1 << 64) % p for p in PRIMES], dtype=object)
        want_z = project(r, z[None])[0]
        want_a = (project(r, A[None])[0].astype(object) + two64 * project(r, c[None])[0]) % \
            primes.astype(object)
        assert got[0] == [int(v) for v in want_z] and got[1] == [int(v) for v in want_a]
        if m <= 66:  # (and the integer sum itself, on Python ints)
            t = [sum(int(a) * int(b) for a, b in zip(w, x)) for x in (z, A, c)]
            assert got[0] == [t[0] % p for p in PRIMES]
            assert got[1] == [(t[1] + (t[2] << 64)) % p for p in PRIMES]


#: a transcript of three sites the server made before its site's check was last tuned (the
#: claim, each site's path, the tree's digest): it must read and verify to the same digest
_STORED = {
    "A": ("180000000000008088a29e017b608d28293144ef64cdd9f363f182e1061c32be37c09b29e667ebd0"
          "0001010101000008"),
    "paths": [("00000000030000000735d97709363ada41b72140d97286d454248caaca213976c0c517aafc235b47"
               "4180287e4df0f961cfcc8b517557843040ca1999f5835ab7c4a389b51ba1dcc7a198a5d96292c2d8"
               "b1e4a7f6f22024738655cb26adcc2006b854f37fb3cb3f35"),
              ("010000000300000093770dbcd4fd8b533b3b31138b5483c68de94853430898a32e1135f2cd0c2e91"
               "a5f8724797139460b8cd713f0110952240ca1999f5835ab7c4a389b51ba1dcc7a198a5d96292c2d8"
               "b1e4a7f6f22024738655cb26adcc2006b854f37fb3cb3f35"),
              ("0200000003000000cd0669a2639c1c372787306b00b18cb1083fccc5fb027af9752b827711ffa8e2"
               "e7789b45f7038e42c49afd1076671953")],
    "digest": "17265bc6700b1af7af34965c0e0145ab0c2a65dc523f963b5255b1468cfba618",
}


def test_a_transcript_made_before_reads_and_verifies_to_its_digest():
    """The sites' side and the server's change together or not at all: the stored
    transcript's bytes are those the server makes today, and each site reading them
    (read_transcript, claim_bytes) reaches the stored digest from its own leaf."""
    from fedlatent.engine.secagg.sumtree import (
        claim_bytes,
        read_transcript,
        shared_fields,
        transcript_fields,
    )

    leaves = np.random.default_rng(38).integers(0, 2**64, size=(3, 5), dtype=np.uint64)
    leaves[:, 0] = [5, 2**63 + 7, 12]  # (a word of all 8 bytes; carries)
    label, ids = b"run/7/estep", ["a", "b", "c"]
    tree = SumTree(label, ids, leaves)
    assert shared_fields(tree)["verify/A"].tobytes().hex() == "".join(_STORED["A"])
    for i, path in enumerate(_STORED["paths"]):
        assert transcript_fields(tree, i)["verify/path"].tobytes().hex() == "".join(path)
        msg = {"verify/A": np.frombuffer(bytes.fromhex("".join(_STORED["A"])), np.uint8),
               "verify/path": np.frombuffer(bytes.fromhex("".join(path)), np.uint8)}
        at, n, A, c, levels = read_transcript(msg, 5)
        assert (at, n) == (i, 3)
        got = verify_leaf(label, at, n, ids[i], leaves[i], A, c, None, levels, claim_bytes(msg))
        assert got.hex() == _STORED["digest"] == tree.digest().hex()
