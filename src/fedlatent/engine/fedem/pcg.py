"""Many clients' generators at once: the uniforms each client's own generator gives.

A client's step draws from ``client_rng(seed, client, round, purpose)`` (:mod:`.seeds`): NumPy's
``SeedSequence(seed, spawn_key=(client_key(client), round, purpose))`` seeding a ``PCG64``.
Building that generator costs tens of microseconds of Python per client and round, more than a
small client's whole step in a batched round. :func:`client_uniforms` computes the same numbers
for many clients in one compiled pass: the seed sequence's entropy mixing (O'Neill's
``seed_seq`` alternative as NumPy implements it, 32-bit words, pool of 4), the ``PCG64`` state it
seeds (128-bit LCG, XSL-RR output) and ``Generator.random``'s doubles (the top 53 bits). The
numbers are NumPy's, bit for bit (``tests/engine/test_pcg.py`` compares them).

References
----------
O'Neill, "PCG: A Family of Simple Fast Space-Efficient Statistically Good Algorithms for
Random Number Generation" (2014); NumPy's ``numpy/random/bit_generator.pyx`` (SeedSequence)
and ``numpy/random/src/pcg64`` (PCG64).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from fedlatent.engine.fedem.seeds import client_key

__all__ = ["client_uniforms"]

_U = np.uint64
_M32 = _U(0xFFFFFFFF)
_S16, _S32, _S58, _S63, _S11 = _U(16), _U(32), _U(58), _U(63), _U(11)
_ONE, _63 = _U(1), _U(63)
_INIT_A, _MULT_A = _U(0x43B0D7E5), _U(0x931E8875)
_INIT_B, _MULT_B = _U(0x8B51F9DD), _U(0x58F38DED)
_MIX_L, _MIX_R = _U(0xCA01F9DD), _U(0x4973F715)
# PCG64's 128-bit multiplier (high, low words)
_MUL_HI, _MUL_LO = _U(2549297995355413924), _U(4865540595714422341)
_POOL = 4


def _words(n: int) -> list[int]:
    """A non-negative integer as NumPy's seed sequence reads it: 32-bit words, least
    significant first, at least one."""
    if n < 0:
        raise ValueError(f"seeds are non-negative integers, got {n}")
    out = [n & 0xFFFFFFFF]
    n >>= 32
    while n:
        out.append(n & 0xFFFFFFFF)
        n >>= 32
    return out


@njit(cache=True)
def _hashmix(value, hc):
    value = value ^ hc
    hc = (hc * _MULT_A) & _M32
    value = (value * hc) & _M32
    return value ^ (value >> _S16), hc


@njit(cache=True)
def _mix(x, y):
    r = (_MIX_L * x - _MIX_R * y) & _M32
    return r ^ (r >> _S16)


@njit(cache=True)
def _mul_hi(a, b):
    """The high 64 bits of the 128-bit product of two 64-bit words."""
    a0, a1, b0, b1 = a & _M32, a >> _S32, b & _M32, b >> _S32
    p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
    mid = (p00 >> _S32) + (p01 & _M32) + (p10 & _M32)
    return a1 * b1 + (p01 >> _S32) + (p10 >> _S32) + (mid >> _S32)


@njit(cache=True)
def _step(hi, lo, inc_hi, inc_lo):
    """``state * multiplier + inc`` modulo 2^128."""
    nhi = _mul_hi(lo, _MUL_LO) + hi * _MUL_LO + lo * _MUL_HI
    nlo = lo * _MUL_LO
    lo2 = nlo + inc_lo
    carry = _ONE if lo2 < nlo else _U(0)
    return nhi + inc_hi + carry, lo2


@njit(cache=True)
def _seed_state(entropy):
    """The PCG64 state and increment a seed sequence over ``entropy`` (32-bit words) seeds."""
    mixer = np.zeros(_POOL, dtype=np.uint64)
    hc = _INIT_A
    for i in range(_POOL):
        v = entropy[i] if i < entropy.shape[0] else _U(0)
        mixer[i], hc = _hashmix(v, hc)
    for i_src in range(_POOL):
        for i_dst in range(_POOL):
            if i_src != i_dst:
                h, hc = _hashmix(mixer[i_src], hc)
                mixer[i_dst] = _mix(mixer[i_dst], h)
    for i_src in range(_POOL, entropy.shape[0]):
        for i_dst in range(_POOL):
            h, hc = _hashmix(entropy[i_src], hc)
            mixer[i_dst] = _mix(mixer[i_dst], h)
    words = np.empty(8, dtype=np.uint64)  # generate_state(4, uint64) as 8 words of 32 bits
    hb = _INIT_B
    for i in range(8):
        v = mixer[i % _POOL] ^ hb
        hb = (hb * _MULT_B) & _M32
        v = (v * hb) & _M32
        words[i] = v ^ (v >> _S16)
    s = np.empty(4, dtype=np.uint64)
    for j in range(4):
        s[j] = words[2 * j] | (words[2 * j + 1] << _S32)
    inc_hi = (s[2] << _ONE) | (s[3] >> _S63)
    inc_lo = (s[3] << _ONE) | _ONE
    hi, lo = _step(_U(0), _U(0), inc_hi, inc_lo)
    lo2 = lo + s[1]
    hi = hi + s[0] + (_ONE if lo2 < lo else _U(0))
    hi, lo = _step(hi, lo2, inc_hi, inc_lo)
    return hi, lo, inc_hi, inc_lo


@njit(cache=True)
def _uniforms_kernel(entropy, counts, out):
    """Row ``i`` of ``entropy`` seeds the generator of ``counts[i]`` doubles, written one
    client after the other into ``out``."""
    pos = 0
    for i in range(entropy.shape[0]):
        hi, lo, inc_hi, inc_lo = _seed_state(entropy[i])
        for _ in range(counts[i]):
            hi, lo = _step(hi, lo, inc_hi, inc_lo)
            v = hi ^ lo
            rot = hi >> _S58
            x = (v >> rot) | (v << ((_U(64) - rot) & _63))
            out[pos] = np.float64(x >> _S11) * (1.0 / 9007199254740992.0)
            pos += 1
    return out


def client_uniforms(seed: int, keys, round_: int, purpose: int, counts) -> np.ndarray:
    """``client_rng(seed, c, round_, purpose).random(m)`` of every client ``c``, concatenated.

    Parameters
    ----------
    seed, round_, purpose : int
    keys : sequence of int or str
        The clients' :func:`~fedlatent.engine.fedem.seeds.client_key` (or their ids).
    counts : sequence of int
        How many uniforms each client draws (its generator's first ``m``).

    Returns
    -------
    ndarray of shape (sum(counts),)
    """
    keys = np.array([client_key(k) if isinstance(k, str) else int(k) for k in keys]
                    if len(keys) and isinstance(keys[0], str) else keys, dtype=np.uint64)
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    run = _words(int(seed))
    run += [0] * max(_POOL - len(run), 0)  # a spawn key follows: the pool is filled first
    tail = _words(int(round_)) + _words(int(purpose))
    entropy = np.empty((keys.size, len(run) + 1 + len(tail)), dtype=np.uint64)
    entropy[:, :len(run)] = run
    entropy[:, len(run)] = keys  # a client key is a CRC-32: one word
    entropy[:, len(run) + 1:] = tail
    if np.any(keys > 0xFFFFFFFF):
        raise ValueError("client keys are 32-bit (fedlatent.engine.fedem.seeds.client_key)")
    return _uniforms_kernel(entropy, counts, np.empty(int(counts.sum())))
