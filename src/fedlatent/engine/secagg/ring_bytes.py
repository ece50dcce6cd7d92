"""The bytes of a ring sum as a transcript carries it (:func:`pack_ring`, :func:`unpack_ring`):
each word read as a signed integer in a common width that most of the words fit, the others
whole. A sum of small values takes about 4 to 5 of 8 bytes a word. Shared by the sum tree's
claim (:func:`~fedlatent.engine.secagg.sumtree.shared_fields`) and its NumPy reading of it."""

from __future__ import annotations

import functools
import struct

import numpy as np

__all__ = ["pack_ring", "unpack_ring"]


#: a width of w bytes holds the signed integers of magnitude below 2^(8 w - 1)
_LIMITS = np.array([1 << (8 * w - 1) for w in range(1, 8)], dtype=np.uint64)


@functools.lru_cache(maxsize=64)
def _wide(m: int) -> tuple[int, struct.Struct]:
    """A word too wide for the common width, of ``m``: its index in the fewest bytes of 1, 2
    or 4 that hold ``m - 1``, then all its 8 bytes: ``(bytes, Struct)``."""
    iw = 1 if m <= 1 << 8 else 2 if m <= 1 << 16 else 4
    return iw + 8, struct.Struct(f"<{'xBHxI'[iw]}q")


def pack_ring(A: np.ndarray) -> np.ndarray:
    """``A`` (m,) uint64, each word read as a signed integer, as bytes: each word's lowest
    ``w`` bytes (little-endian), then each word that needs more (its index, :func:`_wide`,
    and its 8 bytes), then the common width ``w`` (one byte), the one giving the fewest
    bytes (:func:`unpack_ring`)."""
    s = np.asarray(A, dtype="<u8").view("<i8")
    mag = np.where(s < 0, ~s, s).view(np.uint64)  # (-1 - s for a negative s)
    need = 1 + (mag[:, None] >= _LIMITS[None, :]).sum(axis=1)
    entry, _ = _wide(s.size)
    iw = entry - 8
    sizes = [s.size * w + entry * int((need > w).sum()) for w in range(1, 9)]
    w = 1 + int(np.argmin(sizes))
    wide = np.flatnonzero(need > w)
    tail = np.empty((wide.size, entry), dtype=np.uint8)
    tail[:, :iw] = wide.astype(f"<u{iw}").view(np.uint8).reshape(-1, iw)
    tail[:, iw:] = s[wide].view(np.uint8).reshape(-1, 8)
    return np.concatenate([s.view(np.uint8).reshape(-1, 8)[:, :w].ravel(), tail.ravel(),
                           np.array([w], np.uint8)])


def unpack_ring(raw: np.ndarray, m: int, w: int | None = None) -> np.ndarray | None:
    """The ``m`` words of :func:`pack_ring`'s bytes ``raw`` (uint64); None when ``raw`` is
    not such bytes for ``m`` words. ``w``: the common width, given apart (``raw`` then
    without its last byte, as in :func:`~.sumtree.shared_fields`' claim)."""
    raw = np.asarray(raw, dtype=np.uint8).tobytes()
    if w is None:
        w, raw = (raw[-1], raw[:-1]) if raw else (0, raw)
    return _ring(raw, len(raw), m, w)


def _ring(buf: bytes, size: int, m: int, w: int) -> np.ndarray | None:
    """:func:`unpack_ring` of the first ``size`` bytes of ``buf`` (the words, then the wide
    ones), the common width ``w`` given: few NumPy calls (what a site reads every round)."""
    end = m * w
    entry, word = _wide(m)
    if not 1 <= w <= 8 or size < end or (size - end) % entry:
        return None
    if w in _INT:  # (a width of a NumPy integer: read as it is, sign-extended)
        A = np.frombuffer(buf, _INT[w], m).astype(np.int64)
    else:  # word k is the low w bytes of the 8 read at byte w k (the body padded by 8 - w
        body = buf[:end] + bytes(8 - w)  # zero bytes): shifted to the top and back down,
        A = (np.ndarray((m,), _LE64, body, 0, (w,)) << _SHIFT[w]).view(np.int64) \
            >> _SHIFT_I[w]  # sign-extended
    if end < size <= end + 8 * entry:  # (a few wide words: read as they are)
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


_INT = {w: np.dtype(f"<i{w}") for w in (1, 2, 4, 8)}  # (dtypes made once, not parsed a call)
_LE64 = np.dtype("<u8")
_SHIFT = [np.uint64(64 - 8 * w) for w in range(9)]
_SHIFT_I = [np.int64(64 - 8 * w) for w in range(9)]
