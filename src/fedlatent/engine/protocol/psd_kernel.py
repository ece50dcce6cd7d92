"""The compiled forms of :func:`~fedlatent.engine.protocol.psd_screen.bordered_certified`'s
certificate: the matrices factored a few at a time, side by side.

The NumPy screen (:mod:`.psd_screen`) factors a chunk of matrices entry by entry; at 100,000
clients a round screens 400,000 9 x 9 moment matrices and costs about a second there, most of
it moving the matrices into the entry-major layout and the round's statistics rebuilt and
scaled (``(Q_c + S_hat + V_c) n_c``) before the screen reads them. These kernels read each
matrix where it is and factor :data:`LANES` matrices side by side in a small entry-major
scratch array (each operation acts on one entry of every lane: SIMD), in the same order of
operations as the NumPy screen (the same test, the same pivots):

- :func:`bordered_kernel` reads the matrices ``[[c, b^T], [b, A]]`` from their parts;
- :func:`reply_bordered_kernel` reads them from rows of a round's replies, each entry rebuilt
  as the server rebuilds it (:class:`~fedlatent.engine.protocol.reply_rows.ReplyRows`) with its
  rounding slack, so that nothing of the size of the round's statistics is allocated.

They are used only where numba pays (:mod:`.compiled`): numba's set-up in a process costs about
half a CPU second, more than a small fit's NumPy screen. The kernels are cached on disk
(``cache=True``); on an empty cache they compile in a few seconds, once per machine, and say so
(:func:`~.compiled.announce`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .reply_rows import MAX_SUM

__all__ = ["LANES", "bordered_kernel", "reply_bordered_kernel"]

_TINY = float(np.finfo(np.float64).tiny)
#: matrices factored side by side: every loop over the lanes is long enough for the compiler
#: to vectorize it (at 8 lanes it stayed scalar: 400,000 9 x 9 certificates 0.23 -> 0.15 s)
LANES = 64
#: cached on disk; a division by zero gives inf or NaN as in NumPy (the test then fails: not
#: certified) instead of a branch that raises, which kept the lanes' loops scalar
_JIT = {"cache": True, "error_model": "numpy"}


@njit(**_JIT)
def _certify_lanes(W, E, ok, L, p, h, slack):
    """The certificate of the ``L`` matrices in the lanes of ``W`` (p, p, LANES), their
    slack in ``E`` (read when ``slack``): ``ok[l]`` is True when matrix ``l`` has finite
    entries, a diagonal >= 0 (and a finite scaled slack) and the Cholesky factorization of
    its symmetric part plus the shift of :func:`~.psd_screen._certify_entries` has every
    pivot positive and finite. ``W`` is overwritten. The operations of each lane are those
    of the NumPy screen, in its order; the lanes' flags are numbers (1: still good), so
    that every loop over the lanes is one SIMD operation. The entries' finiteness, which the
    NumPy screen tests apart, is the pivots' here: every entry enters the symmetric part's
    lower triangle, and a non-finite one there makes a later pivot NaN or infinite (column
    ``j``'s entry of row ``r`` is squared into pivot ``r``)."""
    fin = np.zeros(LANES)  # (x * 0 is 0 exactly when x is finite: the slack's norm)
    good = np.ones(LANES)
    for a in range(p):
        for lane in range(LANES):
            good[lane] = good[lane] if W[a, a, lane] >= 0.0 else 0.0
    if slack:
        err = np.zeros(LANES)
        sq = np.empty((p, LANES))
        for a in range(p):
            for lane in range(LANES):
                sq[a, lane] = math.sqrt(W[a, a, lane] + abs(E[a, a, lane]) + _TINY)
        for a in range(p):  # (the terms summed in NumPy's order: row-major)
            for e in range(p):
                for lane in range(LANES):
                    r = abs(E[a, e, lane]) / (sq[a, lane] * sq[e, lane])
                    err[lane] += r * r
        for lane in range(LANES):
            err[lane] = math.sqrt(err[lane])
            fin[lane] += err[lane] * 0.0
        for a in range(p):  # the shift
            for lane in range(LANES):
                W[a, a, lane] += (W[a, a, lane] + abs(E[a, a, lane]) + _TINY) * (h + err[lane])
    else:
        for a in range(p):
            for lane in range(LANES):
                W[a, a, lane] += h * (W[a, a, lane] + _TINY)
    for a in range(p):  # the symmetric part, lower triangle
        for e in range(a):
            for lane in range(LANES):
                W[a, e, lane] = 0.5 * (W[a, e, lane] + W[e, a, lane])
    piv = np.empty(LANES)
    for j in range(p):  # right-looking Cholesky: every pivot positive and finite
        for lane in range(LANES):
            t = W[j, j, lane]
            good[lane] = good[lane] if (t > 0.0) & (t < np.inf) else 0.0  # (NaN fails)
            piv[lane] = math.sqrt(t if t > 0.0 else 1.0)
        for r in range(j + 1, p):
            for lane in range(LANES):
                W[r, j, lane] /= piv[lane]
        for r in range(j + 1, p):
            for e in range(j + 1, r + 1):
                for lane in range(LANES):
                    W[r, e, lane] -= W[r, j, lane] * W[e, j, lane]
    for lane in range(LANES):
        ok[lane] = good[lane] == 1.0 and fin[lane] == 0.0 and lane < L


@njit(**_JIT)
def _fill_parts(W, lane, c, b, A, i, q):
    """Lane ``lane`` of ``W`` (p, p, LANES): matrix ``i`` of the parts ``c`` (m,), ``b``
    (m, q), ``A`` (m, q, q), i.e. ``[[c_i, b_i^T], [b_i, A_i]]``."""
    W[0, 0, lane] = c[i]
    for a in range(q):
        W[0, a + 1, lane] = b[i, a]
        W[a + 1, 0, lane] = b[i, a]
        for e in range(q):
            W[a + 1, e + 1, lane] = A[i, a, e]


@njit(**_JIT)
def bordered_kernel(c, b, A, ec, eb, eA, slack, rtol):
    """Which of the matrices ``[[c, b^T], [b, A]]`` (``c`` (m,), ``b`` (m, q), ``A``
    (m, q, q)) are certified, with their entries' slack in ``ec, eb, eA`` (same shapes)
    when ``slack``: the test of :func:`~.psd_screen._certify_entries`, :data:`LANES`
    matrices at a time."""
    m, q = b.shape
    p = q + 1
    h = 0.5 * rtol * p
    out = np.empty(m, dtype=np.bool_)
    W, E = np.zeros((p, p, LANES)), np.zeros((p, p, LANES))
    ok = np.empty(LANES, dtype=np.bool_)
    for lo in range(0, m, LANES):
        L = min(LANES, m - lo)
        for lane in range(L):
            _fill_parts(W, lane, c, b, A, lo + lane, q)
            if slack:
                _fill_parts(E, lane, ec, eb, eA, lo + lane, q)
        _certify_lanes(W, E, ok, L, p, h, slack)
        for lane in range(L):
            out[lo + lane] = ok[lane]
    return out


@njit(**_JIT)
def _fill_reply(W, E, lane, Q, r, S, V, v, s, g, c, b, a, q, slack):
    """Lane ``lane`` of ``W`` (and ``E`` when ``slack``): the matrix whose corner, border and
    block start at columns ``c``, ``b``, ``a`` of reply row ``r``, each entry rebuilt as
    ``((Q + S_hat) + V_c) s`` (the server's rebuilding, :meth:`~.reply_rows.ReplyRows.flat`)
    and bounded by ``((|Q| + |S_hat|) + |V_c|) g``."""
    W[0, 0, lane] = ((Q[r, c] + S[c]) + V[v, c]) * s
    for x in range(q):
        w = ((Q[r, b + x] + S[b + x]) + V[v, b + x]) * s
        W[0, x + 1, lane] = w
        W[x + 1, 0, lane] = w
        row = a + x * q
        for y in range(q):
            W[x + 1, y + 1, lane] = ((Q[r, row + y] + S[row + y]) + V[v, row + y]) * s
    if slack:
        E[0, 0, lane] = ((abs(Q[r, c]) + abs(S[c])) + abs(V[v, c])) * g
        for x in range(q):
            w = ((abs(Q[r, b + x]) + abs(S[b + x])) + abs(V[v, b + x])) * g
            E[0, x + 1, lane] = w
            E[x + 1, 0, lane] = w
            row = a + x * q
            for y in range(q):
                E[x + 1, y + 1, lane] = ((abs(Q[r, row + y]) + abs(S[row + y]))
                                         + abs(V[v, row + y])) * g


@njit(**_JIT)
def _plain_turn(W2, E2, ok2, at2, redo, out, Q, rows, S, V, vrow, n, f, cols, q, a, b, p, h):
    """Matrix ``b`` of row ``a`` into the second turn's lanes (lane ``redo``); when they are
    full, certified without the slack into ``out``. Returns the lanes now taken."""
    _fill_reply(W2, E2, redo, Q, rows[a], S, V, vrow[a], n[a], f[a], cols[0] + b,
                cols[1] + b * q, cols[2] + b * q * q, q, False)
    at2[0, redo], at2[1, redo] = a, b
    redo += 1
    if redo == LANES:
        _certify_lanes(W2, E2, ok2, redo, p, h, False)
        for t in range(redo):
            out[at2[0, t], at2[1, t]] = ok2[t]
        redo = 0
    return redo


@njit(**_JIT)
def _add_row(total, Q, r, w, s):
    """``total += w Q[r]``, entry by entry (the product rounded, then added: the bits of
    :func:`~fedlatent.engine.rounds.batched_round.weighted_rows`' row after row); returns
    whether the row is beyond what can be aggregated: an entry not finite, or ``max |Q[r]|
    s`` above :data:`MAX_SUM` (the screen's size test: ``|x| s`` is monotone in ``|x|``, so
    testing each entry is testing the largest, and NaN fails either way)."""
    bad = 0  # (a count, not a flag or a running maximum: the loop stays SIMD)
    for j in range(Q.shape[1]):
        x = Q[r, j]
        total[j] += w * x
        bad += 0 if abs(x) * s <= MAX_SUM else 1  # (NaN: not <=)
    return bad > 0


@njit(**_JIT)
def reply_bordered_kernel(Q, rows, S, V, vrow, n, f, cols, K, q, slack, rtol, w, total, big):
    """Which of the ``K`` bordered matrices of each reply row are certified (R, K), read from
    the rows as the server rebuilds them (see :class:`~.reply_rows.ReplyRows`).

    ``Q`` (A, F): the reply rows; ``rows`` (R,): those to check; ``S`` (F,): ``S_hat``
    flattened (zeros: the rows are the statistics; adding 0 is exact); ``V`` (C, F): the
    control variates, row ``vrow[i]`` for row ``i`` (one row of zeros: none); ``n``, ``f``
    (R,): the scale of each row's statistic (its units) and of its slack; ``cols`` (3,): the
    first columns of the corners ``c`` (K,), borders ``b`` (K, q) and blocks ``A`` (K, q, q)
    in a row (matrix ``k`` is ``[[c_k, b_k^T], [b_k, A_k]]``). With ``slack``, a matrix is
    certified when the test with the entries' rounding slack or the test without it passes
    (a certificate without slack holds with it): the slack's test first (rebuilt rows need it
    often: a quarter of a round's matrices at 100,000 clients fail without it), the other on
    the few it leaves (e.g. a slack bound that is not finite).

    ``w`` (A,), ``total`` (F,), ``big`` (A,): when ``w`` has a weight per reply row,
    ``total += w_r Q_r`` for the rows in order, while each row is read for its matrices (the
    round's weighted sum without a second pass over the replies), and ``big[r]`` says whether
    row ``r`` fails the screen's size test (see :func:`_add_row`); ``w`` empty: neither."""
    R = rows.shape[0]
    summing = w.shape[0] == Q.shape[0]
    p = q + 1
    h = 0.5 * rtol * p
    out = np.empty((R, K), dtype=np.bool_)
    W, E = np.zeros((p, p, LANES)), np.zeros((p, p, LANES))
    W2, E2 = np.zeros((p, p, LANES)), np.zeros((p, p, LANES))  # the second turn
    ok, ok2 = np.empty(LANES, dtype=np.bool_), np.empty(LANES, dtype=np.bool_)
    at, at2 = np.empty((2, LANES), dtype=np.int64), np.empty((2, LANES), dtype=np.int64)
    lane = redo = 0
    for i in range(R):
        if summing:
            big[rows[i]] = _add_row(total, Q, rows[i], w[rows[i]], max(n[i], 1.0))
        for k in range(K):
            _fill_reply(W, E, lane, Q, rows[i], S, V, vrow[i], n[i], f[i], cols[0] + k,
                        cols[1] + k * q, cols[2] + k * q * q, q, slack)
            at[0, lane], at[1, lane] = i, k
            lane += 1
            if lane < LANES and (i < R - 1 or k < K - 1):
                continue
            _certify_lanes(W, E, ok, lane, p, h, slack)
            for j in range(lane):
                out[at[0, j], at[1, j]] = ok[j]
                if slack and not ok[j]:  # certified without the slack, or not at all
                    redo = _plain_turn(W2, E2, ok2, at2, redo, out, Q, rows, S, V, vrow, n, f,
                                       cols, q, at[0, j], at[1, j], p, h)
            lane = 0
    if redo:
        _certify_lanes(W2, E2, ok2, redo, p, h, False)
        for t in range(redo):
            out[at2[0, t], at2[1, t]] = ok2[t]
    return out
