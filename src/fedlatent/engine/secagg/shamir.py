"""Shamir secret sharing of 256-bit secrets over the prime field GF(2^256 + 297).

A secret s is the constant term of a random polynomial f of degree t - 1 (coefficients drawn with
``secrets``); holder i gets f(i). Any t shares give s back by Lagrange interpolation at 0; t - 1
shares are uniformly distributed whatever s is. Field arithmetic is Python's exact integers.

Many seeds at once (what the protocol deals: one self-mask seed per planned exchange, to every
neighbour): :func:`draw_seeds`, :func:`share_seeds` and :func:`reconstruct_seeds` work limb-wise
in NumPy over the prime field GF(2^31 - 1). A seed is :data:`LIMBS` uniform field elements (248
bits of entropy; its 32 bytes are the limbs as little-endian uint32), each limb shared with its
own random polynomial of degree t - 1: t - 1 shares of every limb are uniform and independent of
the seed (the same perfect secrecy, limb by limb), and the Horner steps and Lagrange weights are
array operations over every seed, limb and holder at once (products of two field elements stay
below 2^62: exact in int64).

References
----------
Shamir, "How to share a secret", Communications of the ACM 22(11), 1979.
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["LIMBS", "P31", "PRIME", "SEED_SHARE_BYTES", "SHARE_BYTES", "draw_seeds",
           "int_from_share", "reconstruct", "reconstruct_many", "reconstruct_seeds", "seed_bytes",
           "share", "share_blobs", "share_many", "share_seeds", "share_to_bytes"]

PRIME = 2**256 + 297  # the smallest prime above 2^256: every 32-byte secret is a field element
SHARE_BYTES = 33


def share(secret: bytes, holders: Sequence[int], threshold: int) -> dict[int, int]:
    """Shares of ``secret`` (at most 32 bytes, read big-endian) for the holders' x-coordinates.

    Parameters
    ----------
    secret : bytes
        The secret, at most 32 bytes.
    holders : sequence of int
        Distinct x-coordinates in [1, PRIME).
    threshold : int
        Number of shares needed to reconstruct (the polynomial has degree threshold - 1).

    Returns
    -------
    dict of int to int
        ``{x: f(x)}`` for every holder.
    """
    if len(secret) > 32:
        raise ValueError(f"a secret has at most 32 bytes, got {len(secret)}")
    if not 1 <= threshold <= len(holders):
        raise ValueError(f"threshold must be in [1, {len(holders)}] (the number of holders), "
                         f"got {threshold}")
    if len(set(holders)) != len(holders) or not all(0 < x < PRIME for x in holders):
        raise ValueError("holders' x-coordinates must be distinct integers in [1, PRIME)")
    coefs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME)
                                                for _ in range(threshold - 1)]
    out = {}
    for x in holders:
        y = 0
        for a in reversed(coefs):  # Horner
            y = (y * x + a) % PRIME
        out[int(x)] = y
    return out


def lagrange_at_zero(xs: Sequence[int]) -> list[int]:
    """Weights w_i with f(0) = sum_i w_i f(x_i) for every polynomial of degree < len(xs)."""
    return list(_lagrange(tuple(int(x) for x in xs)))


@functools.lru_cache(maxsize=32)
def _lagrange(xs: tuple[int, ...]) -> tuple[int, ...]:  # one holder set per exchange: cached
    if len(set(xs)) != len(xs):
        raise ValueError("shares' x-coordinates must be distinct")
    weights = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        weights.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(weights)


def reconstruct(shares: Mapping[int, int], threshold: int) -> bytes:
    """The 32-byte secret from at least ``threshold`` shares ``{x: f(x)}`` (the first
    ``threshold`` by x are used)."""
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} shares cannot reconstruct a secret shared with "
                         f"threshold {threshold}")
    return reconstruct_many([shares], threshold)[0]


def share_to_bytes(y: int) -> bytes:
    """A field element as 33 big-endian bytes."""
    return int(y).to_bytes(SHARE_BYTES, "big")


def int_from_share(b: bytes) -> int:
    """Inverse of :func:`share_to_bytes`, refusing anything that is not a field element."""
    if len(b) != SHARE_BYTES:
        raise ValueError(f"a share has {SHARE_BYTES} bytes, got {len(b)}")
    y = int.from_bytes(b, "big")
    if y >= PRIME:
        raise ValueError("share value is not a field element (>= the prime)")
    return y


def share_blobs(secrets_: Sequence[bytes], holders: Sequence[int], threshold: int
                ) -> dict[int, bytes]:
    """:func:`share` of several secrets for the same holders, at once: ``{x: bytes}``, holder
    x's shares of every secret in order, :data:`SHARE_BYTES` each.

    The polynomials are evaluated side by side: lane s of one big integer holds polynomial s,
    each lane wide enough that Horner's rule without reduction (every coefficient and x
    non-negative) never carries into the next; one big-integer step serves every secret, and
    each lane is reduced modulo the prime at the end. Each coefficient is 48 bytes from
    ``secrets`` reduced modulo the prime (a bias below 2^-120).
    """
    if not secrets_:
        return {int(x): b"" for x in holders}
    if any(len(s) > 32 for s in secrets_):
        raise ValueError(f"a secret has at most 32 bytes, got {max(len(s) for s in secrets_)}")
    if not 1 <= threshold <= len(holders):
        raise ValueError(f"threshold must be in [1, {len(holders)}] (the number of holders), "
                         f"got {threshold}")
    xs = [int(x) for x in holders]
    if len(set(xs)) != len(xs) or not all(0 < x < PRIME for x in xs):
        raise ValueError("holders' x-coordinates must be distinct integers in [1, PRIME)")
    m = len(secrets_)
    width = -(-(PRIME.bit_length() + threshold * max(xs).bit_length() + 8) // 8) * 8  # bytes
    w, out = width // 8, {}
    pool = secrets.token_bytes(48 * m * (threshold - 1))
    rows = [[int.from_bytes(s, "big") for s in secrets_]] + [
        [int.from_bytes(pool[48 * (j * m + s):48 * (j * m + s + 1)], "big") % PRIME
         for s in range(m)] for j in range(threshold - 1)]
    # lanes[j]: the j-th coefficient of every polynomial, lane s (bytes [w s, w (s + 1))) secret s
    lanes = [int.from_bytes(b"".join(v.to_bytes(w, "little") for v in row), "little")
             for row in rows]
    for x in xs:
        y = 0
        for a in reversed(lanes):  # Horner on every lane at once
            y = y * x + a
        raw = y.to_bytes(w * m, "little")  # lane s: bytes [w s, w (s + 1))
        out[x] = b"".join((int.from_bytes(raw[w * s:w * s + w], "little") % PRIME)
                          .to_bytes(SHARE_BYTES, "big") for s in range(m))
    return out


def share_many(secrets_: Sequence[bytes], holders: Sequence[int], threshold: int
               ) -> list[dict[int, int]]:
    """:func:`share` of several secrets for the same holders (:func:`share_blobs`, parsed)."""
    blobs = share_blobs(secrets_, holders, threshold)
    n = SHARE_BYTES
    return [{x: int.from_bytes(b[s * n:(s + 1) * n], "big") for x, b in blobs.items()}
            for s in range(len(secrets_))]


def reconstruct_many(shares: Sequence[Mapping[int, int]], threshold: int) -> list[bytes]:
    """:func:`reconstruct` of several secrets, each from its own holders: the Lagrange weights
    of one holder set are computed once, with one modular inversion (Montgomery's trick)."""
    out = []
    for sh in shares:
        if len(sh) < threshold:
            raise ValueError(f"{len(sh)} shares cannot reconstruct a secret shared with "
                             f"threshold {threshold}")
        xs = tuple(sorted(sh)[:threshold])
        s = sum(w * sh[x] for w, x in zip(_weights(xs), xs)) % PRIME
        if s >= 2**256:
            raise ValueError("the shares do not interpolate to a 32-byte secret: a share is wrong")
        out.append(s.to_bytes(32, "big"))
    return out


@functools.lru_cache(maxsize=4096)
def _weights(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange weights at 0 of distinct x-coordinates, with a single modular inversion."""
    if len(set(xs)) != len(xs):
        raise ValueError("shares' x-coordinates must be distinct")
    num = math.prod(xs) % PRIME
    # d_i = x_i prod_{j != i} (x_j - x_i): exact integers of small factors, reduced once
    dens = [xi * math.prod(xj - xi for xj in xs if xj != xi) % PRIME for xi in xs]
    prefix = [1]
    for d in dens:
        prefix.append(prefix[-1] * d % PRIME)
    inv = pow(prefix[-1], -1, PRIME)
    weights = [0] * len(xs)
    for i in range(len(xs) - 1, -1, -1):  # inv(d_i) = prefix_i * inv(d_0 ... d_i)
        weights[i] = num * prefix[i] * inv % PRIME
        inv = inv * dens[i] % PRIME
    return tuple(weights)


# ---- many seeds at once, limb-wise over GF(2^31 - 1), in NumPy --------------------------------
P31 = 2**31 - 1  # a Mersenne prime: x-coordinates (roster indices) up to 2^31 - 2
LIMBS = 8  # field elements per seed: 32 bytes as little-endian uint32
SEED_SHARE_BYTES = 4 * LIMBS


def _uniform31(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform elements of GF(P31) (int64): 31 random bits, the one value P31 rejected and
    drawn again."""
    size = int(np.prod(shape))
    out = _random_words(size) & P31
    bad = np.flatnonzero(out == P31)
    while bad.size:
        out[bad] = _random_words(bad.size) & P31
        bad = bad[out[bad] == P31]
    return out.reshape(shape)


def _random_words(n: int) -> np.ndarray:
    """``n`` uniform 32-bit words (int64): the ChaCha20 keystream of a fresh 32-byte key from
    the OS (a CSPRNG; the OS's own randomness is slow in bulk)."""
    from fedlatent.engine.secagg._crypto import prg_uint64

    words = prg_uint64(secrets.token_bytes(32), (n + 1) // 2)
    return words.view("<u4")[:n].astype(np.int64)


def draw_seeds(m: int) -> np.ndarray:
    """``m`` fresh seeds, an (m, LIMBS) int64 array of uniform field elements."""
    return _uniform31((int(m), LIMBS))


def seed_bytes(seeds: np.ndarray) -> list[bytes]:
    """Each seed's 32 bytes (its limbs as little-endian uint32): what keys its mask."""
    raw = np.ascontiguousarray(seeds, dtype="<u4").tobytes()
    return [raw[i:i + SEED_SHARE_BYTES] for i in range(0, len(raw), SEED_SHARE_BYTES)]


def share_seeds(seeds: np.ndarray, holders: Sequence[int], threshold: int) -> np.ndarray:
    """Shares of every seed for every holder: an (h, m, LIMBS) uint32 array, row i holder
    ``holders[i]``'s share of each seed (limb l of seed s: f_{s,l}(x), f_{s,l} of degree
    ``threshold - 1`` with constant term the limb)."""
    seeds = np.asarray(seeds, dtype=np.int64)
    xs = np.asarray([int(x) for x in holders], dtype=np.int64)
    if not 1 <= threshold <= xs.size:
        raise ValueError(f"threshold must be in [1, {xs.size}] (the number of holders), "
                         f"got {threshold}")
    srt = np.sort(xs)
    if np.any(srt[1:] == srt[:-1]) or not (xs.size == 0 or 0 < srt[0] and srt[-1] < P31):
        raise ValueError("holders' x-coordinates must be distinct integers in [1, 2^31 - 1)")
    if seeds.ndim != 2 or np.any((seeds < 0) | (seeds >= P31)):
        raise ValueError("seeds must be an (m, limbs) array of elements of GF(2^31 - 1)")
    coefs = np.concatenate([seeds[None], _uniform31((threshold - 1,) + seeds.shape)])
    return _evaluate(coefs.reshape(threshold, -1), xs).reshape((xs.size,) + seeds.shape)


def _evaluate(coefs: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Every polynomial (column j of ``coefs``, constant term first) at every x, mod P31: the
    (holders, polynomials) uint32 array ``V @ coefs`` mod P31, V the Vandermonde matrix of the
    x's mod P31.

    The product runs in float64 BLAS and is exact: each coefficient is split into two 16-bit
    halves, ``c = lo + 2^16 hi``, and ``V @ c = [V, V'] @ [lo; hi]`` with ``V' = 2^16 V`` mod
    P31, so one term is below 2^31 * 2^16 = 2^47 and a block of :data:`_TERMS` terms below 2^53
    (float64's exact integers); each block's sums are folded mod P31 in int64. The same values
    as Horner's rule (tests compare it with Python's integers). Holders go by groups of rows
    whose temporaries stay under :data:`_CHUNK` numbers (32 KB): larger ones were handed back
    to the operating system and faulted in again at every call, and a larger product ran on
    every BLAS thread (OpenBLAS splits a product above about 2^18 multiply-adds): on 2 busy
    cores, 11.6 ms a client instead of 0.7 ms when nothing limits the BLAS threads.
    """
    c = np.asarray(coefs, dtype=np.int64)
    t, m = c.shape
    V = _vandermonde(np.asarray(xs, dtype=np.int64), t)
    W = np.empty((len(V), 2 * t), dtype=np.float64)  # [V, 2^16 V mod P31]
    W[:, :t] = V
    W[:, t:] = _fold(V << 16)  # <= P31 (2^31 - 1) < 2^31: the bound of one term holds
    halves = np.empty((2 * t, m), dtype=np.float64)  # [lo; hi]
    np.bitwise_and(c, 0xFFFF, out=halves[:t], casting="unsafe")
    np.right_shift(c, 16, out=halves[t:], casting="unsafe")
    out = np.empty((len(V), m), dtype=np.uint32)
    step = max(1, _CHUNK // m)
    for r in range(0, len(V), step):
        acc = None
        for at in range(0, 2 * t, _TERMS):  # one block while t <= 32
            part = (W[r:r + step, at:at + _TERMS] @ halves[at:at + _TERMS]).astype(np.int64)
            part = (part & P31) + (part >> 31)  # < 2^31 + 2^22, from < 2^53
            acc = part if acc is None else acc + part
        acc = _fold(acc) if 2 * t > _TERMS else (acc & P31) + (acc >> 31)  # <= P31
        acc[acc == P31] = 0
        out[r:r + step] = acc
    return out


#: numbers in one of :func:`_evaluate`'s temporaries at most (4,096 int64: 32 KB; with 25
#: slots of 8 limbs, 20 holders a group: a product of 20 * 56 * 200 = 224,000 multiply-adds)
_CHUNK = 4_096


#: terms of one exact float64 block: 64 * (2^31 - 2) * (2^16 - 1) < 2^53
_TERMS = 64


def _vandermonde(xs: np.ndarray, t: int) -> np.ndarray:
    """(len(xs), t) int64: x_i^j mod P31 for j < t (rows of a table of every x up to the
    largest, built once per size, when the x's are small: roster indices)."""
    size = max(64, 1 << (int(xs.max()) if xs.size else 0).bit_length())  # > every x
    if size * t <= 2**22:  # at most 32 MB
        return _power_table(size, t)[xs]
    return _powers(xs, t)


@functools.lru_cache(maxsize=8)
def _power_table(size: int, t: int) -> np.ndarray:
    """x^j mod P31 for x < ``size`` and j < t, read-only (a public table, no secret)."""
    out = _powers(np.arange(size, dtype=np.int64), t)
    out.flags.writeable = False
    return out


def _powers(xs: np.ndarray, t: int) -> np.ndarray:
    V = np.empty((t, xs.size), dtype=np.int64)  # a power per row: contiguous steps
    if t:
        V[0] = 1
    for j in range(1, t):
        np.multiply(V[j - 1], xs, out=V[j])  # <= P31 (2^31 - 2) < 2^62: exact in int64
        V[j] = _fold(V[j])
    V[V == P31] = 0
    return np.ascontiguousarray(V.T)


def _fold(a: np.ndarray) -> np.ndarray:
    """a mod P31 up to one P31, for 0 <= a < 2^62: twice (a & P31) + (a >> 31), as
    2^31 = 1 modulo the Mersenne prime (result <= P31)."""
    a = (a & P31) + (a >> 31)
    return (a & P31) + (a >> 31)


def reconstruct_seeds(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Seeds from shares: ``xs`` (m, t) holders' x-coordinates (distinct in each row), ``ys``
    (m, t, LIMBS) their shares; returns the (m, LIMBS) int64 constant terms, every seed
    interpolated at once (:func:`_weights31`: the Lagrange weights of each row)."""
    X = np.asarray(xs, dtype=np.int64)
    Y = np.asarray(ys, dtype=np.int64)
    if X.ndim != 2 or Y.shape[:2] != X.shape:
        raise ValueError(f"shares of shape {Y.shape} do not match x-coordinates {X.shape}")
    srt = np.sort(X, axis=1)
    if np.any(srt[:, 1:] == srt[:, :-1]):
        raise ValueError("shares' x-coordinates must be distinct")
    w = _weights31(X % P31)
    return _fold(w[:, :, None] * (Y % P31)).sum(axis=1) % P31


def _weights31(Xp: np.ndarray) -> np.ndarray:
    """The Lagrange weights at 0 of each row of x-coordinates ``Xp`` (in [0, P31)),
    ``w_i = prod_{j != i} x_j / (x_j - x_i)`` mod P31 (entries <= P31): the numerators from
    prefix and suffix products along each row, the denominators one product per ``j`` over
    the whole array (the factor ``x_i - x_i`` set to 1), their inverses by one Fermat
    inversion per row (Montgomery's trick: the inverse of the row's product, multiplied back
    along the row). Every product is of two entries <= P31 < 2^31, folded (:func:`_fold`)."""
    m, t = Xp.shape
    pre, suf = np.ones((m, t + 1), np.int64), np.ones((m, t + 1), np.int64)
    for j in range(t):  # pre[:, j] = x_0 ... x_{j-1}; suf[:, j] = x_j ... x_{t-1}
        pre[:, j + 1] = _fold(pre[:, j] * Xp[:, j])
        suf[:, t - 1 - j] = _fold(suf[:, t - j] * Xp[:, t - 1 - j])
    num = _fold(pre[:, :t] * suf[:, 1:])
    den = np.ones_like(Xp)
    for j in range(t):
        diff = _fold(Xp[:, j:j + 1] - Xp + P31)  # x_j - x_i, <= P31
        diff[:, j] = 1
        den = _fold(den * diff)
    run = np.ones((m, t + 1), np.int64)  # run[:, i] = den_0 ... den_{i-1}
    for i in range(t):
        run[:, i + 1] = _fold(run[:, i] * den[:, i])
    acc, inv = _inverse31(run[:, t]), np.empty_like(den)
    for i in range(t - 1, -1, -1):  # acc = 1 / (den_0 ... den_i) at step i
        inv[:, i] = _fold(acc * run[:, i])
        acc = _fold(acc * den[:, i])
    return _fold(num * inv)


def _inverse31(a: np.ndarray) -> np.ndarray:
    """a^(P31 - 2) mod P31 elementwise (the inverse of nonzero a), by square and multiply, each
    product folded (:func:`_fold`); entries in [0, P31)."""
    out, base, e = np.ones_like(a), _fold(a % P31), P31 - 2
    while e:
        if e & 1:
            out = _fold(out * base)
        base = _fold(base * base)
        e >>= 1
    return out % P31
