"""A site's numbers of the sum tree (:mod:`.sumtree`), compiled: what it reads of the claim's
bytes and what it computes of its leaf and path every verified round (issue 38), each in one
call, so that a site makes a few calls a round instead of some twenty NumPy ones.

Integers only, exact: uint64 arithmetic (every constant ``np.uint64``), the same numbers as
:mod:`.sumtree`'s NumPy side, which one deployed site's process runs (the tests compare both
on many claims, exactly). The hashes stay :mod:`hashlib`'s, in :mod:`.sumtree`: these kernels
only lay out the bytes each level of the path hashes.

The arguments are typed before the call (``bytes``, C-contiguous uint64 arrays, ints), so the
kernels are compiled once (``cache=True``: later processes load them) and a server's message
cannot make a site compile another specialization.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit

if sys.byteorder != "little":  # (projections reads the challenge's <u8 words natively)
    raise ImportError("the sum tree's kernels read little-endian words natively: this host "
                      "is big-endian, so a site cannot check a verified round here")

#: :data:`.sumtree.PRIMES` and :data:`.sumtree.NODE_TAG`, restated (this module imports nothing
#: of :mod:`.sumtree`, which imports it; :func:`.sumtree._kernels` refuses to use these kernels
#: unless they are the same)
PRIMES = (2147483647, 2147483629, 2147483587, 2147483579)
NODE_TAG = b"fedlatent/sumtree/node\x00"
_U = np.uint64
_M16 = _U(0xFFFF)
_S16, _S32, _S48 = _U(16), _U(32), _U(48)
_ONE, _ZERO = _U(1), _U(0)
P0, P1, P2, P3 = (_U(p) for p in PRIMES)  # (each its own constant: reductions by a constant)
#: ``2^(16 e) mod p_j`` (row ``j``) for ``e = 0..5``: the offsets of the limb products' sums
#: (a challenge word's 32-bit half ``a`` times a word's 16-bit limb ``b``: ``e = 2 a + b``);
#: ``e = 4`` is also ``2^64``, the carries' weight
_POW = np.array([[pow(2, 16 * e, p) for e in range(6)] for p in PRIMES], dtype=np.uint64)
_TAG = np.frombuffer(NODE_TAG, dtype=np.uint8).copy()
_P = np.array(PRIMES, dtype=np.uint64)
_EXP = np.array([0, 1, 2, 3, 2, 3, 4, 5])  # (e of the eight limb sums, s00 .. s13)
#: products below ``2^48``: sums of up to ``2^16`` of them stay below ``2^64``
_BLOCK = 1 << 16
#: bytes a level of a transcript's path takes (a sibling's hash, its four ``<u4`` sums), and a
#: level's record here (the node tag, the sibling's hash, both children's sums, left first)
_LEVEL, _RECORD = 32 + 4 * len(PRIMES), len(NODE_TAG) + 32 + 8 * len(PRIMES)


@njit(cache=True)
def _le(buf, at, width):
    """The unsigned little-endian integer of ``width`` bytes of ``buf`` at ``at`` (uint64)."""
    v = _ZERO
    for b in range(width):
        v |= _U(buf[at + b]) << _U(8 * b)
    return v


@njit(cache=True)
def decode_claim(raw, m):
    """``(2, m)`` uint64: ``A`` (row 0) and the carries ``c`` (row 1) of the claim's bytes
    ``raw`` (:func:`.sumtree._claim`) for ``m`` words; a ``(0, m)`` array when ``raw`` is no
    such encoding (no bytes, a width code of 3 or past bit 6, too few bytes, or the sum's
    bytes not :func:`.ring_bytes.pack_ring`'s)."""
    size = len(raw)
    t = np.int64(raw[size - 1]) if size else np.int64(0xFF)
    cw, bw = np.int64(1) << (t >> 4 & 3), 4 if t & 64 else 2
    k = size - 1 - bw - m * cw  # (where the carries start; the sum's bytes before)
    out = np.empty((2, m), dtype=np.uint64)
    if t >> 4 & 3 == 3 or t >= 128 or k < 0 or not _ring(raw, k, m, t & 15, out[0]):
        return np.empty((0, m), dtype=np.uint64)
    base = _le(raw, size - 1 - bw, bw)
    for j in range(m):
        out[1, j] = _le(raw, k + j * cw, cw) + base
    return out


@njit(cache=True)
def _ring(raw, size, m, w, out):
    """The ``m`` words of :func:`.ring_bytes.pack_ring`'s first ``size`` bytes of ``raw`` (its
    words, then its wide ones), the common width ``w`` given, into ``out`` (m,); False when
    the bytes are no such encoding (a width not in 1..8, fewer bytes than ``m w``, wide
    entries that do not divide the bytes left or name a word past ``m``). Each word the low
    ``w`` bytes, sign-extended; a wide word: its index (1, 2 or 4 bytes:
    :func:`.ring_bytes._wide`), then all 8 bytes, the last given winning."""
    end = m * w
    entry = 8 + (1 if m <= 1 << 8 else 2 if m <= 1 << 16 else 4)
    if not 1 <= w <= 8 or size < end or (size - end) % entry:
        return False
    top = _U(8 * w - 1)
    high = ~((_ONE << _U(8 * w)) - _ONE) if w < 8 else _ZERO  # (bits a negative word fills)
    for j in range(m):
        v = _le(raw, j * w, w)
        out[j] = v | high if (v >> top) & _ONE else v
    for e in range(end, size, entry):
        at = _le(raw, e, entry - 8)
        if at >= _U(m):
            return False
        out[np.int64(at)] = _le(raw, e + entry - 8, 8)
    return True


@njit(cache=True)
def projections(words, x):
    """(8,) uint64: ``r z`` then ``r (A + 2^64 c)``, projection ``j`` modulo ``p_j``, of
    ``x`` (``z``, ``A`` and ``c``: ``3 m`` words) for the challenge's ``words`` (``8 m``
    bytes, one ``<u8`` word ``w_k`` a place: ``r_jk = w_k mod p_j``, so ``r_j x = (sum_k w_k
    x_k) mod p_j``), exact: each ``w_k`` in two 32-bit halves times each word's four 16-bit
    limbs, eight sums of products below ``2^48`` a vector, reduced by each prime every
    :data:`_BLOCK` words (so below ``2^64``) and joined by their offsets (:data:`_POW`; each
    term below ``2^62``, reduced as it is added). (One function, no helpers: it compiles in
    about a second.)"""
    m = len(x) // 3
    half = np.frombuffer(words, dtype=np.uint32)  # (w_k = half[2k] + 2^32 half[2k + 1])
    out, acc = np.zeros(12, dtype=np.uint64), np.empty(8, dtype=np.uint64)
    for v in range(3):
        for start in range(0, m, _BLOCK):
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = _ZERO
            for k in range(start, min(start + _BLOCK, m)):
                w0, w1 = _U(half[2 * k]), _U(half[2 * k + 1])
                z = x[v * m + k]
                l0, l1, l2, l3 = z & _M16, (z >> _S16) & _M16, (z >> _S32) & _M16, z >> _S48
                s00 += w0 * l0
                s01 += w0 * l1
                s02 += w0 * l2
                s03 += w0 * l3
                s10 += w1 * l0
                s11 += w1 * l1
                s12 += w1 * l2
                s13 += w1 * l3
            acc[0], acc[1], acc[2], acc[3] = s00, s01, s02, s03
            acc[4], acc[5], acc[6], acc[7] = s10, s11, s12, s13
            o = 4 * v
            for b in range(8):
                t, e = acc[b], _EXP[b]
                out[o] = (out[o] + (t % P0) * _POW[0, e]) % P0
                out[o + 1] = (out[o + 1] + (t % P1) * _POW[1, e]) % P1
                out[o + 2] = (out[o + 2] + (t % P2) * _POW[2, e]) % P2
                out[o + 3] = (out[o + 3] + (t % P3) * _POW[3, e]) % P3
    out[4] = (out[4] + out[8] * _POW[0, 4]) % P0  # (the claim: r A + 2^64 r c)
    out[5] = (out[5] + out[9] * _POW[1, 4]) % P1
    out[6] = (out[6] + out[10] * _POW[2, 4]) % P2
    out[7] = (out[7] + out[11] * _POW[3, 4]) % P3
    return out[:8]


@njit(cache=True)
def climb(words, x, path, index, n):
    """A site's numbers of its check (:func:`.sumtree.verify_leaf`): leaf ``index`` of ``n``,
    ``x`` its leaf, ``A`` and ``c`` (``3 m`` words), ``words`` the challenge's ``8 m`` bytes,
    ``path`` the levels as a transcript sends them. uint8: the leaf's projections (four
    ``<u4``), then one record a level of its path that has a sibling (the node tag, the
    sibling's hash, the left child's sums, the right's: what the level hashes, less the
    climbing node's hash, which goes after the sibling's hash when the sibling is the left
    child, else after the tag), then a flags byte: 1 a carry of ``n`` or more, 4 the sums the
    path reaches are not ``r (A + 2^64 c)``. Only the flags byte, with 2 set, when the path
    is shorter than the levels the leaf's place has."""
    m = len(x) // 3
    flags = 0
    for k in range(2 * m, 3 * m):
        if x[k] >= _U(n):
            flags = 1
    levels, i, width = 0, index, n
    while width > 1:
        levels += 1 if (i ^ 1) < width else 0
        i, width = i // 2, (width + 1) // 2
    if len(path) < levels * _LEVEL:
        out = np.empty(1, dtype=np.uint8)
        out[0] = flags | 2
        return out
    both = projections(words, x)
    s, tag = both[:4].copy(), len(_TAG)
    out = np.empty(16 + levels * _RECORD + 1, dtype=np.uint8)
    for b in range(16):  # (the leaf's sums, <u4)
        out[b] = (s[b // 4] >> _U(8 * (b % 4))) & _U(0xFF)
    k, i, width = 0, index, n
    while width > 1:
        if (i ^ 1) < width:
            o, at = 16 + k * _RECORD, k * _LEVEL
            mine, theirs = o + tag + (48 if i % 2 else 32), o + tag + (32 if i % 2 else 48)
            for b in range(tag):
                out[o + b] = _TAG[b]
            for b in range(32):  # (the sibling's hash)
                out[o + tag + b] = path[at + b]
            for b in range(16):  # (the two children's sums: the sibling's as sent)
                out[theirs + b] = path[at + 32 + b]
                out[mine + b] = (s[b // 4] >> _U(8 * (b % 4))) & _U(0xFF)
            for j in range(4):
                sib = _ZERO
                for b in range(4):
                    sib |= _U(path[at + 32 + 4 * j + b]) << _U(8 * b)
                s[j] = (s[j] + sib) % _P[j]
            k += 1
        i, width = i // 2, (width + 1) // 2
    differ = s[0] != both[4] or s[1] != both[5] or s[2] != both[6] or s[3] != both[7]
    out[len(out) - 1] = flags | (4 if differ else 0)
    return out
