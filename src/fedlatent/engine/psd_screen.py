"""A compiled screen of many small symmetric matrices: which are certainly positive
semi-definite within the tolerance of :func:`~fedlatent.engine.messages.psd_failures`.

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

__all__ = ["psd_certified"]

_TINY = float(np.finfo(np.float64).tiny)


@njit(cache=True)
def _factor_shifted(M, i, shift, work):
    """Whether the Cholesky factorization of the symmetric part of ``M[i]`` plus ``diag(shift)``
    succeeds (every pivot positive and finite); ``work`` (p, p) is scratch."""
    p = M.shape[1]
    for a in range(p):
        for b in range(a):
            work[a, b] = 0.5 * (M[i, a, b] + M[i, b, a])
        work[a, a] = M[i, a, a] + shift[a]
    for j in range(p):
        s = work[j, j]
        for k in range(j):
            s -= work[j, k] * work[j, k]
        if not (s > 0.0 and s < math.inf):  # NaN fails too
            return False
        piv = math.sqrt(s)
        for r in range(j + 1, p):
            t = work[r, j]
            for k in range(j):
                t -= work[r, k] * work[j, k]
            work[r, j] = t / piv
    return True


@njit(cache=True)
def _sane(M, i):
    """Every entry finite and the diagonal >= 0."""
    p = M.shape[1]
    for a in range(p):
        if not M[i, a, a] >= 0.0:
            return False
        for b in range(p):
            if not math.isfinite(M[i, a, b]):
                return False
    return True


@njit(cache=True)
def _certify(M, rtol):
    N, p = M.shape[0], M.shape[1]
    ok = np.zeros(N, dtype=np.bool_)
    work = np.empty((p, p))
    shift = np.empty(p)
    h = 0.5 * rtol * p
    for i in range(N):
        if not _sane(M, i):
            continue
        for a in range(p):
            shift[a] = h * (M[i, a, a] + _TINY)
        ok[i] = _factor_shifted(M, i, shift, work)
    return ok


@njit(cache=True)
def _certify_slack(M, E, rtol):
    N, p = M.shape[0], M.shape[1]
    ok = np.zeros(N, dtype=np.bool_)
    work = np.empty((p, p))
    shift = np.empty(p)
    sq = np.empty(p)
    h = 0.5 * rtol * p
    for i in range(N):
        if not _sane(M, i):
            continue
        for a in range(p):
            shift[a] = M[i, a, a] + abs(E[i, a, a]) + _TINY  # d2 = s^2
            sq[a] = math.sqrt(shift[a])
        err2 = 0.0
        for a in range(p):
            for b in range(p):
                v = abs(E[i, a, b]) / (sq[a] * sq[b])
                err2 += v * v
        err = math.sqrt(err2)
        if not math.isfinite(err):
            continue
        for a in range(p):
            shift[a] *= h + err
        ok[i] = _factor_shifted(M, i, shift, work)
    return ok


def psd_certified(M: np.ndarray, slack: np.ndarray | None = None,
                  rtol: float = 1e-8) -> np.ndarray:
    """Which matrices of ``M`` are certainly not refused by
    :func:`~fedlatent.engine.messages.psd_failures` (a mask of shape (m,)).

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
        return _certify(M, float(rtol))
    E = np.ascontiguousarray(slack, dtype=np.float64)
    return _certify_slack(M, E, float(rtol))
