"""The NumPy/Python code a site ran for its check of the sum tree before the compiled kernels
(``fedlatent.engine.secagg._sumtree_kernel``, issue 38), kept as the reference they must equal
exactly: the claim's decoding (``read_transcript``, ``_ring``, ``unpack_ring``), the
projections (``_projections``) and the whole check of a leaf and its path (``verify_leaf``).
Ported unchanged from ``sumtree.py`` as it was; the hashing helpers it calls are the module's
(unchanged)."""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from fedlatent.engine.secagg.protocol import SecureAggregationError
from fedlatent.engine.secagg.ring_bytes import _wide
from fedlatent.engine.secagg.sumtree import (
    _HEAD,
    _LEVEL,
    _NODE,
    _NODE_BYTES,
    MAX_LEAVES,
    NODE_TAG,
    PRIMES,
    PROJECTIONS,
    _claim,
    _claim_hash,
    _digest,
    _field,
    _leaf_bytes,
    _refuse_root,
    _sides,
)

_WIDE = 1 << 16
_SUMS = struct.Struct(f"<{PROJECTIONS}I")
_U64 = np.dtype(np.uint64)
_INT = {w: np.dtype(f"<i{w}") for w in (1, 2, 4, 8)}
_LE64 = np.dtype("<u8")
_SHIFT = [np.uint64(64 - 8 * w) for w in range(9)]
_SHIFT_I = [np.int64(64 - 8 * w) for w in range(9)]
_CARRY = {w: np.dtype(f"<u{w}") for w in (1, 2, 4)}


def projections(words: bytes, leaf, A, c) -> tuple:
    m = leaf.size
    half = "<u4" if m < _WIDE else "<u2"
    w = np.frombuffer(words, half, -1).reshape(m, -1).T.astype(np.uint64)
    x = np.concatenate((leaf, A, c)).view("<u2").reshape(3, m, 4).astype(np.uint64)
    sz, sa, sc = np.matmul(w, x).tolist()
    tz, t = _joined(sz), _joined(sa) + (_joined(sc) << 64)
    p0, p1, p2, p3 = PRIMES
    return [tz % p0, tz % p1, tz % p2, tz % p3], [t % p0, t % p1, t % p2, t % p3]


def _joined(sums: list) -> int:
    if len(sums) == 2:
        (s00, s01, s02, s03), (s10, s11, s12, s13) = sums
        return (s00 + (s01 << 16) + ((s02 + s10) << 32) + ((s03 + s11) << 48) + (s12 << 64)
                + (s13 << 80))
    return sum(v << (16 * (a + b)) for a, row in enumerate(sums) for b, v in enumerate(row))


def verify_leaf(label, index, n, site, leaf, A, c, root, path, claim=None) -> bytes:
    if not 0 <= index < n <= MAX_LEAVES:
        raise SecureAggregationError(f"site {site!r}: leaf {index} of a tree of {n} leaves "
                                     f"(at most {MAX_LEAVES})")
    A, c, leaf = _words(A), _words(c), _words(leaf)
    claim = None if claim is None else _as_bytes(claim)
    if c.size and _carries_reach(claim) >= n and int(c.max()) >= n:
        raise SecureAggregationError(
            f"site {site!r}: the carries shown reach {int(c.max())}, more than a sum of {n} "
            "leaves can carry: the claimed sum is not a sum of the leaves; refusing it")
    key, words = _claim_hash(label, _claim(A, c) if claim is None else claim, A.size)
    (s0, s1, s2, s3), claimed = projections(words, leaf, A, c)
    sha = hashlib.sha256
    h = sha(_leaf_bytes(label, index, site, _SUMS.pack(s0, s1, s2, s3))).digest()
    sides = _sides(index, n)
    if type(path) is bytes and len(path) == len(sides) * _NODE:
        levels = _LEVEL.iter_unpack(path)
    elif (levels := _path_levels(path, len(sides))) is None:
        raise SecureAggregationError(f"site {site!r}: the path of leaf {index} is too short")
    pack, tag = _NODE_BYTES.pack, NODE_TAG
    p0, p1, p2, p3 = PRIMES
    for (sib, a0, a1, a2, a3), left in zip(levels, sides):
        h = sha(pack(tag, sib, h, a0, a1, a2, a3, s0, s1, s2, s3) if left
                else pack(tag, h, sib, s0, s1, s2, s3, a0, a1, a2, a3)).digest()
        s0, s1, s2, s3 = (s0 + a0) % p0, (s1 + a1) % p1, (s2 + a2) % p2, (s3 + a3) % p3
    differ = [s0, s1, s2, s3] != claimed
    if root is None and not differ:
        return _digest(h, key)
    _refuse_root(site, index, root, h, differ)
    return _digest(h, key)


def _words(x):
    return x if type(x) is np.ndarray and x.dtype == _U64 else np.asarray(x, dtype=_U64)


def _as_bytes(claim) -> bytes:
    return claim if type(claim) is bytes else np.asarray(claim, dtype=np.uint8).tobytes()


def _carries_reach(claim):
    if claim is None or not len(claim):
        return float("inf")
    t = claim[-1]
    bw = 4 if t & 64 else 2
    return int.from_bytes(claim[-1 - bw:-1], "little") + (1 << (8 << (t >> 4 & 3))) - 1


def _path_levels(path, need: int):
    if isinstance(path, bytes | bytearray | memoryview):
        size = need * _NODE
        if len(path) < size:
            return None
        return _LEVEL.iter_unpack(path if len(path) == size else memoryview(path)[:size])
    raw, sums = path
    raw = bytes(raw)
    if isinstance(sums, np.ndarray):
        sums = sums.astype(np.uint64).reshape(-1, PROJECTIONS).tolist()
    if 32 * need > len(raw) or need > len(sums):
        return None
    return [(raw[32 * k: 32 * (k + 1)], *sums[k]) for k in range(need)]


def unpack_ring(raw, m: int, w: int | None = None):
    raw = np.asarray(raw, dtype=np.uint8).tobytes()
    if w is None:
        w, raw = (raw[-1], raw[:-1]) if raw else (0, raw)
    return _ring(raw, len(raw), m, w)


def _ring(buf: bytes, size: int, m: int, w: int):
    end = m * w
    entry, word = _wide(m)
    if not 1 <= w <= 8 or size < end or (size - end) % entry:
        return None
    if w in _INT:
        A = np.frombuffer(buf, _INT[w], m).astype(np.int64)
    else:
        body = buf[:end] + bytes(8 - w)
        A = (np.ndarray((m,), _LE64, body, 0, (w,)) << _SHIFT[w]).view(np.int64) \
            >> _SHIFT_I[w]
    if end < size <= end + 8 * entry:
        for at, value in word.iter_unpack(buf[end:size]):
            if at >= m:
                return None
            A[at] = value
    elif size > end:
        tail = np.frombuffer(buf, np.uint8, size - end, end).reshape(-1, entry)
        at = tail[:, :entry - 8].copy().view(f"<u{entry - 8}").reshape(-1)
        if int(at.max()) >= m:
            return None
        A[at] = tail[:, entry - 8:].copy().view("<i8").reshape(-1)
    return A.view(np.uint64)


def read_transcript(msg, m: int):
    raw, path = _field(msg, "A"), _field(msg, "path")
    A = None
    t = raw[-1] if raw else 0xFF
    if t >> 4 & 3 < 3 and t < 128 and len(path) >= 8 and not (len(path) - 8) % _NODE:
        index, n = _HEAD.unpack_from(path)
        cw, bw = 1 << (t >> 4 & 3), 4 if t & 64 else 2
        k = len(raw) - 1 - bw - m * cw
        A = _ring(raw, k, m, t & 15) if k >= 0 else None
    if A is None:
        raise SecureAggregationError(
            f"its transcript's sum and carries ({len(raw)} bytes) or path ({len(path)}) do not "
            f"fit this site's contribution of {m} words")
    c = np.add(np.frombuffer(raw, _CARRY[cw], m, k), int.from_bytes(raw[-1 - bw:-1], "little"),
               dtype=np.uint64)
    return index, n, A, c, path[8:]
