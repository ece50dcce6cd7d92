"""A vectorized screen of many small symmetric matrices: which are certainly positive
semi-definite within the tolerance of :func:`~fedlatent.engine.protocol.messages.psd_failures`.

The batched reply checks test hundreds of thousands of (d+1) x (d+1) moment matrices a round
(one per client and component). ``np.linalg.cholesky`` on such a stack costs a LAPACK call per
matrix; here the Cholesky factorization runs over a chunk of matrices at once, entry by entry
(each NumPy operation acts on one entry of every matrix of the chunk, laid out contiguously),
so the cost is a few dozen NumPy calls per chunk, with no compiled kernel to load or build
(the first fit in a process pays nothing more than the others). Where numba pays
(:func:`~.compiled.worth`: many matrices, or numba's compiler already running in the process),
:func:`bordered_certified` runs the same test compiled instead (:mod:`.psd_kernel`), several
times faster.

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

import numpy as np

from fedlatent.engine.protocol.compiled import kernels, worth
from fedlatent.engine.protocol.compiled import ready as _kernel_ready  # noqa: F401 (tests)

__all__ = ["bordered_certified", "psd_certified"]

_TINY = float(np.finfo(np.float64).tiny)
#: matrices factored at once (entry-major: each entry of the chunk's matrices is contiguous)
_CHUNK = 4096
#: up to this many matrices, LAPACK factors them (a few NumPy calls, not one per entry)
_FEW = 16


def _certify_entries(W: np.ndarray, E: np.ndarray | None, rtol: float) -> np.ndarray:
    """Which of the matrices ``W`` (p, p, n), entry-major, are certified (``E`` their slack in
    the same layout, or None): finite, diagonal >= 0, and the Cholesky factorization of the
    symmetric part plus the diagonal shift succeeds (every pivot positive and finite).
    ``W`` is overwritten (its lower triangle by the factor)."""
    p = W.shape[0]
    h = 0.5 * rtol * p
    ix = np.arange(p)
    diag = W[ix, ix]  # (p, n), a copy
    ok = np.all(diag >= 0.0, axis=0) & np.isfinite(W).all(axis=(0, 1))
    if E is None:
        shift = h * (diag + _TINY)
    else:
        s2 = diag + np.abs(E[ix, ix]) + _TINY
        sq = np.sqrt(s2)
        err = np.sqrt(np.sum((np.abs(E) / (sq[:, None] * sq[None, :])) ** 2, axis=(0, 1)))
        ok &= np.isfinite(err)
        shift = s2 * (h + err)
    W[ix, ix] += shift
    low = np.tril_indices(p, -1)
    W[low] = 0.5 * (W[low] + W[low[1], low[0]])  # the symmetric part, lower triangle
    for j in range(p):  # right-looking: column j scaled, the trailing lower triangle updated
        t = W[j, j]
        ok &= (t > 0.0) & (t < np.inf)  # NaN fails too
        if j + 1 == p:
            break
        col = W[j + 1:, j]
        col /= np.sqrt(np.where(t > 0.0, t, 1.0))
        for r in range(j + 1, p):
            W[r, j + 1:r + 1] -= col[r - j - 1] * col[:r - j]
    return ok


def _certify_few(M: np.ndarray, E: np.ndarray | None, rtol: float) -> np.ndarray:
    """:func:`_certify_entries` of a few matrices ``M`` (n, p, p) (slack ``E`` or None) by
    LAPACK's Cholesky factorization: the same test (the factorization of the shifted
    symmetric part succeeds, its pivots finite) in a dozen NumPy calls."""
    p = M.shape[1]
    ix = np.arange(p)
    diag = M[:, ix, ix]
    ok = np.all(diag >= 0.0, axis=1) & np.isfinite(M).all(axis=(1, 2))
    h = 0.5 * rtol * p
    if E is None:
        shift = h * (diag + _TINY)
    else:
        Ea = np.abs(E)
        s2 = diag + Ea[:, ix, ix] + _TINY
        sq = np.sqrt(s2)
        err = np.sqrt(np.sum((Ea / (sq[:, :, None] * sq[:, None, :])) ** 2, axis=(1, 2)))
        ok &= np.isfinite(err)
        shift = s2 * (h + err)[:, None]
    A = M + M.transpose(0, 2, 1)
    A *= 0.5
    A[:, ix, ix] = diag + shift
    A[~ok] = np.eye(p)  # (refused already: kept out of LAPACK's way)
    try:
        return ok & np.isfinite(np.linalg.cholesky(A)).all(axis=(1, 2))
    except np.linalg.LinAlgError:  # one at least fails: which
        pass
    for i in np.flatnonzero(ok):
        try:
            ok[i] = bool(np.isfinite(np.linalg.cholesky(A[i])).all())
        except np.linalg.LinAlgError:
            ok[i] = False
    return ok


def _screen(n: int, fill, rtol: float, with_slack: bool) -> np.ndarray:
    """``_certify_entries`` of ``n`` matrices in chunks; ``fill(W, E, lo, hi)`` writes the
    matrices ``lo:hi`` (and their slack into ``E`` when ``with_slack``) entry-major."""
    ok = np.empty(n, dtype=bool)
    W = E = None
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        if W is None:
            W = np.empty(fill.shape + (hi - lo,))
            E = np.empty(W.shape) if with_slack else None
        w = W[..., :hi - lo]
        e = None if E is None else E[..., :hi - lo]
        fill(w, e, lo, hi)
        ok[lo:hi] = _certify_entries(w, e, rtol)
    return ok


def _bordered_compiled(parts, eparts, rtol: float) -> np.ndarray:
    """:func:`bordered_certified` by the compiled kernel (the same test, matrix by matrix)."""
    kernel = kernels("fedlatent.engine.protocol.psd_kernel").bordered_kernel
    c, b, A = (np.ascontiguousarray(v) for v in parts)
    ec, eb, eA = (c, b, A) if eparts is None else (np.ascontiguousarray(v) for v in eparts)
    return kernel(c, b, A, ec, eb, eA, eparts is not None, rtol)


class _Stack:
    """Fills chunks of a stack of matrices (m, p, p) entry-major."""

    def __init__(self, M, E):
        self.M, self.E, self.shape = M, E, M.shape[1:]

    def __call__(self, w, e, lo, hi):
        w[...] = self.M[lo:hi].transpose(1, 2, 0)
        if e is not None:
            e[...] = self.E[lo:hi].transpose(1, 2, 0)


class _Bordered:
    """Fills chunks of the matrices ``[[c, b^T], [b, A]]`` entry-major, from their parts."""

    def __init__(self, parts, eparts):
        self.parts, self.eparts = parts, eparts
        q = parts[1].shape[1]
        self.shape = (q + 1, q + 1)

    @staticmethod
    def put(w, parts, lo, hi):
        """The matrices ``lo:hi`` into ``w`` (p, p, hi - lo)."""
        c, b, A = parts
        w[0, 0] = c[lo:hi]
        bt = b[lo:hi].T
        w[0, 1:] = bt
        w[1:, 0] = bt
        w[1:, 1:] = A[lo:hi].transpose(1, 2, 0)

    def __call__(self, w, e, lo, hi):
        self.put(w, self.parts, lo, hi)
        if e is not None:
            self.put(e, self.eparts, lo, hi)

    def stack(self, parts) -> np.ndarray:
        """The matrices (m, p, p) themselves (a few of them)."""
        c, b, A = parts
        M = np.empty((b.shape[0],) + self.shape)
        M[:, 0, 0], M[:, 0, 1:], M[:, 1:, 0], M[:, 1:, 1:] = c, b, b, A
        return M


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
    M = np.asarray(M, dtype=np.float64)
    if M.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    E = None if slack is None else np.asarray(slack, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if M.shape[0] <= _FEW:
            return _certify_few(M, E, float(rtol))
        return _screen(M.shape[0], _Stack(M, E), float(rtol), E is not None)


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
    parts = [np.asarray(v, dtype=np.float64) for v in (corner, border, block)]
    if parts[1].shape[0] == 0:
        return np.zeros(0, dtype=bool)
    eparts = None if slack is None else [np.asarray(v, dtype=np.float64) for v in slack]
    m, q = parts[1].shape
    shapes = [(m,), (m, q), (m, q, q)]
    if m > _FEW and [v.shape for v in parts] == shapes and worth(m) and (
            eparts is None or [v.shape for v in eparts] == shapes):
        return _bordered_compiled(parts, eparts, float(rtol))
    fill = _Bordered(parts, eparts)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if parts[1].shape[0] <= _FEW:
            return _certify_few(fill.stack(parts), None if eparts is None else
                                fill.stack(eparts), float(rtol))
        return _screen(parts[1].shape[0], fill, float(rtol), eparts is not None)
