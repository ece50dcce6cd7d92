"""Sums over rows of replies (one row per client) with the bits of a client-by-client sum.

The screen of a round's replies (:mod:`fedlatent.engine.rounds.screen`) and the collectors
(:mod:`fedlatent.engine.rounds.collectors`) work on replies as rows of an array of shape
(n_clients, F), whether they came one by one or from the batched client step; this module holds
the row arithmetic they share, a chunk of rows at a time (:data:`_CHUNK`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["weighted_rows"]

#: rows of a reply screened or summed at once (a few MiB of rebuilt statistics, in cache)
_CHUNK = 512


def weighted_rows(Q: np.ndarray, w: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``sum_c w_c Q_c`` over the rows in ``mask``, as one row (1, F) (none: (0, F)).

    The products are added row after row in client order, as the per-client path adds them
    (``update._weighted_sum``: a reduction over the leading axis accumulates row after row),
    so the sum has the same bits; a chunk at a time, the running sum carried as the first row
    of the next chunk's buffer, so no array of the size of ``Q`` is made.
    """
    rows = np.flatnonzero(mask)
    F = Q.shape[1]
    if rows.size == 0:
        return np.zeros((0, F))
    every = rows.size == len(w)
    buf = np.empty((min(rows.size, _CHUNK) + 1, F))
    acc = None
    for lo, hi in _chunks(rows.size):
        Qc, wc = (Q[lo:hi], w[lo:hi]) if every else (Q[rows[lo:hi]], w[rows[lo:hi]])
        if acc is None:
            np.multiply(Qc, wc[:, None], out=buf[1:hi - lo + 1])
            acc = np.add.reduce(buf[1:hi - lo + 1], axis=0)
        else:
            buf[0] = acc
            np.multiply(Qc, wc[:, None], out=buf[1:hi - lo + 1])
            acc = np.add.reduce(buf[:hi - lo + 1], axis=0)
    return acc[None, :]


def _chunks(n: int):
    """``(lo, hi)`` bounds of consecutive chunks of ``range(n)`` (``_CHUNK`` long)."""
    return ((lo, min(lo + _CHUNK, n)) for lo in range(0, n, _CHUNK))
