"""A compiled screen of many small symmetric matrices: which are certainly positive
semi-definite within the tolerance of :func:`~fedlatent.engine.protocol.messages.psd_failures`.

The batched reply checks test hundreds of thousands of (d+1) x (d+1) moment matrices a round
(one per client and component). ``np.linalg.cholesky`` on such a stack costs a LAPACK call per
matrix, and a Cholesky written with NumPy over the stack moves every matrix through memory a
dozen times; the kernels here factor each matrix once, in a scratch buffer, in one pass.

A matrix the screen certifies passes ``psd_failures``; one it does not certify may still pass
(the screen is a sufficient test, with a margin of half the tolerance for rounding), so the
callers judge the few it leaves with the exact test.

Why a certificate is sufficient: with ``s_a = sqrt(M_aa + E_aa + tiny)`` (``E`` the entries'
slack, 0 without), ``psd_failures`` scales ``M`` to ``Ms = M / (s s^T)`` and refuses it when
``lambda_min(Ms) < -(rtol p + err)``, ``err = ||E / (s s^T)||_F``. A Cholesky factorization of
``M + (rtol p / 2 + err) diag(s^2)`` succeeding means that matrix is positive definite, i.e.
``lambda_min(Ms) > -(rtol p / 2 + err)``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = ["bordered_certified", "psd_certified"]

_TINY = float(np.finfo(np.float64).tiny)


@njit(cache=True)
def _certify_one(mat, emat, use_slack, h, work, shift, sq):
    """Whether the (p, p) matrix ``mat`` (slack ``emat``) is certified: finite, diagonal >= 0,
    and the Cholesky factorization of the symmetric part of ``mat`` plus the diagonal shift
    succeeds (every pivot positive and finite). ``work``, ``shift``, ``sq`` are scratch."""
    p = mat.shape[0]
    for a in range(p):
        if not mat[a, a] >= 0.0:
            return False
        for b in range(p):
            if not math.isfinite(mat[a, b]):
                return False
    if use_slack:
        for a in range(p):
            shift[a] = mat[a, a] + abs(emat[a, a]) + _TINY  # s_a^2
            sq[a] = math.sqrt(shift[a])
        err2 = 0.0
        for a in range(p):
            for b in range(p):
                v = abs(emat[a, b]) / (sq[a] * sq[b])
                err2 += v * v
        err = math.sqrt(err2)
        if not math.isfinite(err):
            return False
        for a in range(p):
            shift[a] *= h + err
    else:
        for a in range(p):
            shift[a] = h * (mat[a, a] + _TINY)
    for a in range(p):
        for b in range(a):
            work[a, b] = 0.5 * (mat[a, b] + mat[b, a])
        work[a, a] = mat[a, a] + shift[a]
    for j in range(p):
        t = work[j, j]
        for k in range(j):
            t -= work[j, k] * work[j, k]
        if not (t > 0.0 and t < math.inf):  # NaN fails too
            return False
        piv = math.sqrt(t)
        for r in range(j + 1, p):
            u = work[r, j]
            for k in range(j):
                u -= work[r, k] * work[j, k]
            work[r, j] = u / piv
    return True


@njit(cache=True)
def _certify_stack(M, E, use_slack, rtol):
    N, p = M.shape[0], M.shape[1]
    ok = np.zeros(N, dtype=np.bool_)
    work, shift, sq = np.empty((p, p)), np.empty(p), np.empty(p)
    h = 0.5 * rtol * p
    for i in range(N):
        ok[i] = _certify_one(M[i], E[i if use_slack else 0], use_slack, h, work, shift, sq)
    return ok


@njit(cache=True)
def _fill_bordered(out, c, b, A, i):
    """``out = [[c_i, b_i^T], [b_i, A_i]]`` in place."""
    q = b.shape[1]
    out[0, 0] = c[i]
    for a in range(q):
        out[0, a + 1] = b[i, a]
        out[a + 1, 0] = b[i, a]
        for r in range(q):
            out[a + 1, r + 1] = A[i, a, r]


@njit(cache=True)
def _certify_bordered(c, b, A, ec, eb, eA, use_slack, rtol):
    N, q = b.shape
    p = q + 1
    ok = np.zeros(N, dtype=np.bool_)
    mat, emat = np.zeros((p, p)), np.zeros((p, p))
    work, shift, sq = np.empty((p, p)), np.empty(p), np.empty(p)
    h = 0.5 * rtol * p
    for i in range(N):
        _fill_bordered(mat, c, b, A, i)
        if use_slack:
            _fill_bordered(emat, ec, eb, eA, i)
        ok[i] = _certify_one(mat, emat, use_slack, h, work, shift, sq)
    return ok


def psd_certified(M: np.ndarray, slack: np.ndarray | None = None,
                  rtol: float = 1e-8) -> np.ndarray:
    """Which matrices of ``M`` are certainly not refused by
    :func:`~fedlatent.engine.protocol.messages.psd_failures` (a mask of shape (m,)).

    A certified matrix has finite entries, a diagonal >= 0 and passes ``psd_failures`` with
    the same ``slack`` and ``rtol``; an uncertified one may pass it or not (judge it with
    ``psd_failures``).

    Parameters
    ----------
    M : ndarray of shape (m, p, p)
        Symmetric up to rounding (the test uses the symmetric part, as ``psd_failures`` does).
    slack : ndarray of shape (m, p, p) or None
        Bounds on the absolute error of the entries.
    rtol : float
        The tolerance of ``psd_failures``.
    """
    M = np.ascontiguousarray(M, dtype=np.float64)
    if M.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    if slack is None:
        return _certify_stack(M, M[:1], False, float(rtol))
    E = np.ascontiguousarray(slack, dtype=np.float64)
    return _certify_stack(M, E, True, float(rtol))


def bordered_certified(corner: np.ndarray, border: np.ndarray, block: np.ndarray,
                       slack: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                       rtol: float = 1e-8) -> np.ndarray:
    """:func:`psd_certified` of the matrices ``[[corner, border^T], [border, block]]``, read
    from their parts (no stack of the matrices is built).

    Parameters
    ----------
    corner : ndarray of shape (m,)
    border : ndarray of shape (m, q)
    block : ndarray of shape (m, q, q)
    slack : the parts' slack in the same shapes, or None
    """
    parts = [np.ascontiguousarray(v, dtype=np.float64) for v in (corner, border, block)]
    if parts[1].shape[0] == 0:
        return np.zeros(0, dtype=bool)
    if slack is None:
        return _certify_bordered(*parts, *parts, False, float(rtol))
    eparts = [np.ascontiguousarray(v, dtype=np.float64) for v in slack]
    return _certify_bordered(*parts, *eparts, True, float(rtol))
