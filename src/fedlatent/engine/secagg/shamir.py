"""Shamir secret sharing of 256-bit secrets over the prime field GF(2^256 + 297).

A secret s is the constant term of a random polynomial f of degree t - 1 (coefficients drawn with
``secrets``); holder i gets f(i). Any t shares give s back by Lagrange interpolation at 0; t - 1
shares are uniformly distributed whatever s is. Field arithmetic is Python's exact integers.

References
----------
Shamir, "How to share a secret", Communications of the ACM 22(11), 1979.
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Mapping, Sequence

__all__ = ["PRIME", "SHARE_BYTES", "int_from_share", "reconstruct", "reconstruct_many", "share",
           "share_blobs", "share_many", "share_to_bytes"]

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
