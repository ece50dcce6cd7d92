"""Counter-based random streams keyed by (seed, client, round, purpose), for one client or for
many at once, and the quantizer written on them.

A client's draws must not depend on the runtime: a client on Flower draws exactly what its slice
of the in-process batched computation draws. A NumPy ``Generator`` per client and round costs
about 15 microseconds to build, too much for 100,000 clients a round; these streams are a hash of
the key and a counter (SplitMix64, Steele, Lea and Flood 2014: ``mix(key + (j + 1) * golden)``),
so the ``j``-th uniform of every client is computed for all clients in one vectorized pass, and
the per-client path calls the same function with one client.

References
----------
Steele, Lea, Flood. "Fast splittable pseudorandom number generators", OOPSLA 2014 (SplitMix64).
Alistarh et al. "QSGD: communication-efficient SGD via gradient quantization", NeurIPS 2017.
"""

from __future__ import annotations

import numpy as np

__all__ = ["quantize_flat", "stream_keys", "stream_uniforms", "batch_rows"]

_U = np.uint64
_GOLDEN = np.array([0x9E3779B97F4A7C15], dtype=_U)
_M1 = np.array([0xBF58476D1CE4E5B9], dtype=_U)
_M2 = np.array([0x94D049BB133111EB], dtype=_U)
_S30, _S27, _S31, _S11 = (np.array([s], dtype=_U) for s in (30, 27, 31, 11))
#: uniforms are drawn in chunks of at most this many numbers (bounds the temporaries)
_CHUNK = 1 << 22


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on an array of uint64 (wrapping arithmetic, in place)."""
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def stream_keys(seed: int, client_keys, round_: int, purpose: int) -> np.ndarray:
    """The 64-bit key of each client's stream for ``(seed, round_, purpose)``.

    Parameters
    ----------
    seed : int
    client_keys : array_like of int, shape (n_clients,)
        :func:`fedlatent.engine.contract.model.client_key` of each client id.
    round_, purpose : int

    Returns
    -------
    ndarray of uint64, shape (n_clients,)
    """
    ck = np.asarray(client_keys, dtype=np.int64).astype(_U)
    head = np.array([int(seed) % (1 << 64)], dtype=_U)
    for part in (int(round_) % (1 << 64), int(purpose) % (1 << 64)):
        head = _mix(head + _GOLDEN) ^ np.array([part], dtype=_U)
    head = _mix(head + _GOLDEN)
    return _mix((ck * _GOLDEN) ^ head)


def _uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """``u = (mix(key + (j + 1) * golden) >> 11) / 2**53`` for paired ``keys``, ``counters``."""
    z = keys + (counters.astype(_U) + _U(1)) * _GOLDEN
    return (_mix(z) >> _S11).astype(np.float64) * (1.0 / (1 << 53))


def stream_uniforms(keys: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` uniforms in [0, 1) of each stream: shape (len(keys), n)."""
    keys = np.asarray(keys, dtype=_U)
    out = np.empty((keys.size, int(n)))
    if out.size == 0:
        return out
    step = max(1, _CHUNK // max(int(n), 1))
    j = np.arange(int(n), dtype=_U)[None, :]
    for lo in range(0, keys.size, step):
        out[lo:lo + step] = _uniforms(keys[lo:lo + step, None], j)
    return out


def quantize_flat(x: np.ndarray, sizes: list[int], levels: int, u: np.ndarray) -> np.ndarray:
    """Unbiased random dithering (:class:`~fedlatent.engine.fedem.federation.Quantizer`) of many
    flattened statistics at once, each named block quantized on its own scale.

    Parameters
    ----------
    x : ndarray of shape (n_clients, F)
        Each row a statistic flattened block by block.
    sizes : list of int
        Sizes of the blocks, in order (summing to F).
    levels : int
        ``s``: a value is sent as ``||block|| sign(x_i) l_i / s`` with ``l_i`` in ``0..s``.
    u : ndarray of shape (n_clients, F)
        The uniforms that decide the rounding up (``l_i = floor(s |x_i| / ||block||) + 1{u <
        frac}``).

    Returns
    -------
    ndarray of shape (n_clients, F). A block of norm 0 is sent as zeros, a non-finite one as is.
    """
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    s = float(levels)
    lo = 0
    for size in sizes:
        blk = slice(lo, lo + size)
        lo += size
        xb = x[:, blk]
        norm = np.sqrt(np.einsum("ij,ij->i", xb, xb))[:, None]
        ok = np.isfinite(norm) & (norm > 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.abs(xb) * (s / norm)
            low = np.floor(scaled)
            level = low + (u[:, blk] < (scaled - low))
            q = np.sign(xb) * level * (norm / s)
        out[:, blk] = np.where(ok, q, np.where(norm == 0.0, 0.0, xb))
    return out


def batch_rows(keys: np.ndarray, n_units: np.ndarray, batch_size: int) -> np.ndarray:
    """The mini-batch of each client: ``min(batch_size, n_c)`` of its ``n_c`` rows, without
    replacement, as a boolean mask of shape (n_clients, max n_c) (rows past ``n_c`` False).

    Row ``i`` of client ``c`` gets the ``i``-th uniform of the client's stream; the batch is
    the rows with the smallest uniforms (a uniformly random subset).
    """
    n_units = np.asarray(n_units, dtype=np.int64)
    width = int(n_units.max()) if n_units.size else 0
    u = stream_uniforms(keys, width)
    u[np.arange(width)[None, :] >= n_units[:, None]] = 2.0  # past the client's rows: last
    rank = np.empty_like(u, dtype=np.int64)
    order = np.argsort(u, axis=1, kind="stable")
    np.put_along_axis(rank, order, np.arange(width)[None, :], axis=1)
    b = np.minimum(int(batch_size), n_units)
    return rank < b[:, None]
