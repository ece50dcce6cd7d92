"""The compiled form of :func:`~fedlatent.engine.protocol.psd_screen.bordered_certified`'s
certificate: one pass over the matrices, each factored in a small local array.

The NumPy screen (:mod:`.psd_screen`) factors a chunk of matrices entry by entry; at 100,000
clients a round screens 400,000 9 x 9 moment matrices and the NumPy screen costs about half a
second there, most of it moving the matrices into the entry-major layout. This kernel reads
each matrix from its parts and factors it in place of a (p, p) scratch array, in the same
order of operations (the same test, the same pivots), in a few hundredths of a second.

It is used only when numba's compiler is already running in the process
(:func:`~.psd_screen._kernel_ready`):
numba's first compiled call costs about 0.7 CPU seconds (its type registries), which a fit
that compiled nothing else (a start without the hard-assignment kernels, a deployed server)
should not pay for a screen NumPy does in well under a second. The kernel is cached on disk
(``cache=True``); on an empty cache it compiles in about a second, once per machine.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["bordered_kernel"]

_TINY = float(np.finfo(np.float64).tiny)


@njit(cache=True)
def bordered_kernel(c, b, A, ec, eb, eA, slack, rtol):
    """Which of the matrices ``[[c, b^T], [b, A]]`` (``c`` (m,), ``b`` (m, q), ``A``
    (m, q, q)) are certified, with their entries' slack in ``ec, eb, eA`` (same shapes)
    when ``slack``: the test of :func:`~.psd_screen._certify_entries`, the same operations
    in the same order, one matrix at a time (one function: numba compiles it in a second)."""
    m, q = b.shape
    p = q + 1
    h = 0.5 * rtol * p
    ok = np.empty(m, dtype=np.bool_)
    W, E, sq = np.empty((p, p)), np.zeros((p, p)), np.empty(p)
    for i in range(m):
        W[0, 0] = c[i]
        for a in range(q):
            W[0, a + 1] = W[a + 1, 0] = b[i, a]
            for e in range(q):
                W[a + 1, e + 1] = A[i, a, e]
        good, err = True, 0.0
        for a in range(p):
            good = good and W[a, a] >= 0.0
            for e in range(p):
                good = good and math.isfinite(W[a, e])
        if slack:
            E[0, 0] = ec[i]
            for a in range(q):
                E[0, a + 1] = E[a + 1, 0] = eb[i, a]
                for e in range(q):
                    E[a + 1, e + 1] = eA[i, a, e]
            for a in range(p):
                sq[a] = math.sqrt(W[a, a] + abs(E[a, a]) + _TINY)
            for a in range(p):  # (the terms summed in NumPy's order: row-major)
                for e in range(p):
                    r = abs(E[a, e]) / (sq[a] * sq[e])
                    err += r * r
            err = math.sqrt(err)
            good = good and math.isfinite(err)
        if not good:
            ok[i] = False
            continue
        for a in range(p):  # the shifted symmetric part, lower triangle
            W[a, a] += (W[a, a] + abs(E[a, a]) + _TINY) * (h + err) if slack else \
                h * (W[a, a] + _TINY)
            for e in range(a):
                W[a, e] = 0.5 * (W[a, e] + W[e, a])
        for j in range(p):  # right-looking Cholesky: every pivot positive and finite
            t = W[j, j]
            if not (t > 0.0 and t < np.inf):  # (NaN too): refused, the rest unneeded
                good = False
                break
            s = math.sqrt(t)
            for r in range(j + 1, p):
                W[r, j] /= s
            for r in range(j + 1, p):
                for e in range(j + 1, r + 1):
                    W[r, e] -= W[r, j] * W[e, j]
        ok[i] = good
    return ok
