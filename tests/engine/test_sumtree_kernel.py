"""The compiled site side of the sum tree (issue 38) equals its NumPy and Python side (what a
deployed site's process runs, and ran before) exactly: the claim's decoding
(``read_transcript``), the projections and the whole check of a leaf and its path (the
digest, or the same refusal word for word) on many random claims and trees, honest and
malformed; and a server's message cannot make a site compile another specialization of a
kernel."""

from __future__ import annotations

import functools
import struct

import numpy as np
import pytest

from fedlatent.engine.secagg import sumtree as st
from fedlatent.engine.secagg.protocol import SecureAggregationError

LABEL = b"run/round 4/estep"


def _outcome(f, *args):
    """What ``f(*args)`` gives: ``("ok", value)`` or the error's type and words."""
    try:
        return "ok", f(*args)
    except (SecureAggregationError, ValueError, struct.error) as err:
        return type(err).__name__, str(err)


def _same(a, b) -> bool:
    """Exact equality of outcomes: arrays by dtype and value, tuples entry by entry."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _claim_of(rng, m: int, n: int, span: int, bits: int, wide: float):
    """A claim ``(A, c)`` of ``m`` words: A's words signed below ``2^bits``, a share ``wide``
    of them full 64-bit words; carries within ``span`` of a least value below ``n``."""
    A = rng.integers(-(1 << bits), 1 << bits, size=m, dtype=np.int64)
    at = rng.random(m) < wide
    A[at] = rng.integers(-(1 << 63), (1 << 63) - 1, size=int(at.sum()), dtype=np.int64)
    base = int(rng.integers(0, max(1, n - span)))
    c = base + rng.integers(0, span + 1, size=m)
    return A.view(np.uint64), c.astype(np.uint64)


def _claims(seed: int, count: int):
    """``count`` random claims over every encoding: m from 1 to 5,000 (the index widths of
    wide words: 1 and 2 bytes), narrow to full words, none to most of them wide (a few: read
    one by one; more: at once), carries in 1, 2 and 4 bytes, their least in 2 or 4 bytes."""
    rng = np.random.default_rng(seed)
    sizes = [1, 2, 3, 255, 256, 257, 5000]
    for k in range(count):
        m = sizes[k] if k < len(sizes) else int(rng.integers(1, 5001))
        n, span = [(5, 3), (1000, 200), (70_000, 40_000), (2**28, 2**20), (2**20, 2**17)][k % 5]
        bits = int(rng.integers(0, 64))
        wide = float(rng.choice([0.0, 0.002, 0.05, 0.5]))
        yield m, n, _claim_of(rng, m, n, span, bits, wide)


def _msg(claim: np.ndarray, n: int, levels: int, index: int = 0) -> dict:
    head = np.array([index, n], "<u4").view(np.uint8)
    return {"verify/A": claim, "verify/path": np.concatenate(
        [head, np.arange(levels * (32 + 4 * st.PROJECTIONS), dtype=np.uint8)])}


def test_the_claim_reads_back_as_numpy_reads_it_every_encoding():
    """read_transcript's compiled decoding gives the NumPy one's (index, n, A, c, path)
    exactly, on 60 random claims of every width and size; and each claim's own A and c."""
    for m, n, (A, c) in _claims(1, 60):
        claim = st._claim(A, c)
        msg = _msg(claim, n, 3, index=n - 1)
        got, want = st.read_transcript(msg, m, True), st.read_transcript(msg, m, False)
        assert _same(got, want)
        assert np.array_equal(got[2], A) and np.array_equal(got[3], c)


def test_malformed_claims_are_refused_or_read_as_numpy_does():
    """Claims cut short or lengthened by 1 to 9 bytes, every value of the last byte (the
    widths' code), bytes flipped in the sum, the wide words and the carries, another number
    of words, a path of no whole level: read_transcript compiled gives the NumPy one's result
    or its refusal, word for word."""
    read = functools.partial(st.read_transcript, compiled=True)
    numpy = functools.partial(st.read_transcript, compiled=False)
    rng = np.random.default_rng(2)
    cases = 0
    for m, n, (A, c) in _claims(3, 25):
        claim = st._claim(A, c)
        variants = [claim[:-k] for k in range(1, 10)] + [claim[k:] for k in range(1, 10)]
        variants += [np.concatenate([claim[:-1], rng.integers(0, 256, k, dtype=np.uint8),
                                     claim[-1:]]) for k in range(1, 10)]
        for t in range(256):
            v = claim.copy()
            v[-1] = t
            variants.append(v)
        for _ in range(30):
            v = claim.copy()
            v[rng.integers(0, v.size - 1)] ^= np.uint8(1 << int(rng.integers(0, 8)))
            variants.append(v)
        variants.append(np.zeros(0, dtype=np.uint8))
        for v in variants:
            for words in (m, m - 1, m + 1, 2 * m):
                msg = _msg(v, n, 2)
                assert _same(_outcome(read, msg, words),
                             _outcome(numpy, msg, words))
                cases += 1
        bad = _msg(claim, n, 2)
        bad["verify/path"] = bad["verify/path"][:-1]
        assert _same(_outcome(read, bad, m), _outcome(numpy, bad, m))
    assert cases > 25 * 4 * 300


@pytest.mark.parametrize("m", [1, 2, 7, 64, 1000, 5000, (1 << 16) - 1, 1 << 16, (1 << 16) + 3,
                               (1 << 17) + 1])
def test_the_compiled_projections_are_numpys_exactly(m):
    """The compiled projections (limb sums reduced every 2^16 words) equal NumPy's (one
    matmul, halves or quarters of the words) exactly: random words, the largest words
    (every limb sum at its bound), zeros, and carries of every size."""
    rng = np.random.default_rng(m)
    top = np.iinfo(np.uint64).max
    for how in ("random", "largest", "zero", "mixed"):
        z, A, c, w = (rng.integers(0, top, m, dtype=np.uint64, endpoint=True) for _ in range(4))
        if how == "largest":
            z[:], A[:], c[:], w[:] = top, top, top, top
        elif how == "zero":
            z[:], A[:] = 0, 0
        elif how == "mixed":
            z[::2], c[1::3], w[::5] = top, 0, top
        words = w.astype("<u8").tobytes()
        x = np.concatenate((z, A, c))
        assert st._kernels().projections(words, x).tolist() == sum(
            st._projections(words, z, A, c), [])


def _verdicts(n: int, m: int, seed: int, sites) -> int:
    """Compare verify_leaf compiled with its NumPy side on an honest tree of ``n`` leaves of
    ``m`` words and many changes of it, at each of ``sites``; the number of cases compared."""
    verify = functools.partial(st.verify_leaf, compiled=True)
    numpy = functools.partial(st.verify_leaf, compiled=False)
    rng = np.random.default_rng(seed)
    leaves = rng.integers(0, 2**64, size=(n, m), dtype=np.uint64)
    ids = [f"site-{i}" for i in range(n)]
    tree = st.SumTree(LABEL, ids, leaves)
    cases = 0
    for i in sites:
        msg = {**st.shared_fields(tree), **st.transcript_fields(tree, i)}
        at, size, A, c, path = st.read_transcript(msg, m, False)
        claim = st.claim_bytes(msg)
        level = 32 + 4 * st.PROJECTIONS
        paths = [path, path + bytes(level), path[:-1], path[:-level] if path else path, b"",
                 bytearray(path), tree.path(i)]
        for _ in range(12):
            bad = bytearray(path or b"\0")
            bad[rng.integers(0, len(bad))] ^= 1 << int(rng.integers(0, 8))
            paths.append(bytes(bad))
        if path:  # (a sibling's sum at 2^32 - 1, past its prime)
            paths.append(path[:32] + b"\xff" * 4 + path[36:])
        false = A.copy()
        false[rng.integers(0, m)] += np.uint64(1)
        big = c.copy()
        big[rng.integers(0, m)] = np.uint64(n)
        wrong_root = bytes(32)
        runs = [(leaves[i], A, c, None, p, claim) for p in paths]
        runs += [(leaves[i], A, c, tree.root, path, claim), (leaves[i], A, c, wrong_root, path,
                                                             claim),
                 (leaves[i], A, c, None, path, None), (leaves[i], false, c, None, path, claim),
                 (leaves[i], false, c, tree.root, path, None), (leaves[i], A, big, None, path,
                                                                None),
                 (leaves[i], A, big, None, path, st._claim(A, big)),
                 (np.zeros(m, np.uint64), A, c, None, path, claim),
                 (leaves[i].view(np.int64), A[::-1][::-1], c, None, path, claim),
                 (leaves[i].tolist(), A, c.astype(np.int64), None, path, claim)]
        for leaf, a, carries, root, p, cl in runs:
            args = (LABEL, at, size, ids[i], leaf, a, carries, root, p, cl)
            assert _same(_outcome(verify, *args), _outcome(numpy, *args))
            cases += 1
        for where in (-1, size):  # (a leaf outside the tree)
            args = (LABEL, where, size, ids[i], leaves[i], A, c, None, path, claim)
            assert _same(_outcome(verify, *args), _outcome(numpy, *args))
    return cases


@pytest.mark.parametrize("n, m", [(1, 3), (2, 1), (3, 5), (13, 66), (64, 300), (1000, 64)])
def test_a_sites_check_gives_the_numpy_digest_or_refusal(n, m):
    """verify_leaf (one kernel for the numbers, hashlib for the hashes) gives its NumPy and
    Python ints side's
    digest, or its refusal word for word, at every place of small trees and some of a large
    one: honest paths (as sent, longer, as SumTree.path gives them), cut, emptied or flipped
    paths, a sibling's sum past its prime, the right and a wrong root, a false sum, carries
    of n (with and without the claim's bytes), another leaf, a leaf passed as int64 ints."""
    sites = range(n) if n <= 64 else np.random.default_rng(n).choice(n, 12, replace=False)
    assert _verdicts(n, m, seed=n + m, sites=[int(i) for i in sites]) >= 25 * min(n, 12)


def test_a_servers_message_compiles_no_second_specialization():
    """Whatever a site is passed (ints or int64 leaves, reversed views, bytearray or
    (hashes, sums) paths, claims as arrays, numpy ints), each kernel runs one compiled
    specialization: a server cannot make a site compile mid-fit."""
    _verdicts(9, 4, seed=9, sites=range(9))
    leaves = np.arange(12, dtype=np.uint64).reshape(3, 4)
    tree = st.SumTree(LABEL, ["a", "b", "c"], leaves)
    st.verify_leaf(LABEL, np.int32(1), np.int64(3), "b", leaves[1][::-1][::-1].copy(order="F"),
                   tree.A.astype(">u8"), tree.c, None, memoryview(st.transcript_fields(
                       tree, 1)["verify/path"].tobytes()[8:]), tree.claim, compiled=True)
    st.read_transcript({**st.shared_fields(tree), **st.transcript_fields(tree, 2)}, np.uint8(4),
                       compiled=True)
    kernels = st._kernels()
    for name in ("decode_claim", "climb"):
        assert len(getattr(kernels, name).signatures) == 1, name
    assert len(kernels.projections.signatures) <= 1  # (none when only climb called it, from
    # its cached code)
