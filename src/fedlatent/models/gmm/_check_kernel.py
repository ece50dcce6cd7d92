"""The numeric part of a verifying site's forward check of full-covariance GMM parameters,
compiled (:func:`~fedlatent.models.gmm.check_step.full_step_holds`, issue 38): one call a
round, in place of a few dozen NumPy calls on a site's few dozen entries.

Every quantity here is one the check's argument bounds whatever the summation order (the
standard bounds of dot products of ``d`` terms, with or without fused multiply-adds) or one
compared with a slack far above its rounding (the floors): nothing there must equal the
server's NumPy bits. The covariances ``G`` themselves are the server's own arithmetic
(:func:`~fedlatent.models.gmm.math.gmm_full_parts`: in NumPy, or :func:`full_parts`, its
elementwise operations one by one, the same bits).

Arguments are C-contiguous, writeable float64 arrays (the caller checks, so that no input
compiles another specialization) and two floats; shapes are checked here too (numba does not
check bounds): another shape is "cannot tell".
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ...engine.contract.degenerate import DEGENERATE_FRACTION

__all__ = ["factor_parts", "factor_step_holds", "full_parts"]

_U = np.finfo(np.float64).eps / 2  # the unit roundoff
_NAN = math.nan


@njit(cache=True)
def _factor(U, G):
    """``(e, u2, top, g)`` of :func:`factor_parts`; NaN where ``U`` is not upper triangular
    with a positive diagonal (a strictly lower entry not exactly 0, a diagonal entry not
    > 0: NaN is neither) or the shapes do not match."""
    K, d = U.shape[0], U.shape[1]
    if U.shape[2] != d or G.shape[0] != K or G.shape[1] != d or G.shape[2] != d:
        return _NAN, _NAN, _NAN, _NAN
    top, u2, e2, g2 = 0.0, 0.0, 0.0, 0.0
    A = np.empty(d)
    for k in range(K):
        for i in range(d):
            if not U[k, i, i] > 0.0:
                return _NAN, _NAN, _NAN, _NAN
            top = max(top, U[k, i, i])
            for j in range(i):
                if U[k, i, j] != 0.0:
                    return _NAN, _NAN, _NAN, _NAN
            for j in range(i, d):
                u2 += U[k, i, j] * U[k, i, j]
        for i in range(d):  # row i of U_k^T G_k U_k - I (U_k's column i: rows 0..i)
            for m in range(d):
                s = 0.0
                for r in range(i + 1):
                    s += U[k, r, i] * G[k, r, m]
                A[m] = s
            for j in range(d):
                s = 0.0
                for m in range(j + 1):
                    s += A[m] * U[k, m, j]
                if i == j:
                    s -= 1.0
                e2 += s * s
                g2 += G[k, i, j] * G[k, i, j]
    g = math.sqrt(g2)
    return math.sqrt(e2) + 2 * (d + 2) * _U * u2 * g, u2, top, g


@njit(cache=True)
def _floors(U, sxx, sx, n, g):
    """``(t_diagonal, t_columns)``: the bounds above the degenerate floor of
    :func:`factor_parts`, from an upper bound of the pooled covariance's lowest eigenvalue: a
    Rayleigh quotient at the axes (its least diagonal entry, at most the least second moment
    about the centre, which is the data's mean once the start has set it) or the least at the
    columns of every ``U_k`` (towards the components' flattest directions: ``U_k^T cov_k U_k
    = I``); NaN where a statistic or a quotient is not finite (an overflow: no
    bound), ``n`` is not positive or the shapes do not match ``U``'s."""
    K, d = U.shape[0], U.shape[1]
    if (sxx.shape[0] != K or sxx.shape[1] != d or sxx.shape[2] != d or sx.shape[0] != K
            or sx.shape[1] != d):
        return _NAN, _NAN
    # probe: NaN once an entry (or n) is NaN or infinite, as 0 times it is
    total, mean, probe = np.zeros((d, d)), np.zeros(d), 0.0 * n
    for k in range(K):
        for i in range(d):
            mean[i] += sx[k, i]
            probe += 0.0 * sx[k, i]
            for j in range(d):
                total[i, j] += sxx[k, i, j]
                probe += 0.0 * sxx[k, i, j]
    if not (probe == 0.0 and n > 0.0):
        return _NAN, _NAN
    trace, least = 0.0, math.inf
    for i in range(d):
        trace += total[i, i]
        least = min(least, total[i, i])
        mean[i] /= n
    columns, finite = math.inf, True
    for k in range(K):
        for j in range(d):  # the Rayleigh quotient at U_k's column j (rows 0..j)
            quad, lin, norm = 0.0, 0.0, 0.0
            for i in range(j + 1):
                s = 0.0
                for m in range(j + 1):
                    s += total[i, m] * U[k, m, j]
                quad += U[k, i, j] * s
                lin += mean[i] * U[k, i, j]
                norm += U[k, i, j] * U[k, i, j]
            q = (quad / n - lin * lin) / norm
            finite = finite and math.isfinite(q)
            columns = min(columns, q)
    scale = trace / n
    return _bound(least / n, scale, g), _bound(columns if finite else _NAN, scale, g)


@njit(cache=True)
def _bound(q, scale, g):
    """The bound above the degenerate floor from a Rayleigh quotient ``q`` of the pooled
    covariance and ``scale``, at least its trace; NaN unless both are finite."""
    if not (math.isfinite(q) and math.isfinite(scale)):
        return _NAN
    return (DEGENERATE_FRACTION * (1.01 * max(q, 0.0) + 1e-12 * scale)
            + 2e-10 * g)  # (g = ||G||_F: at least every |eigenvalue| of a covariance)


@njit(cache=True)
def factor_parts(U, G, sxx, sx, n):
    """``(e, u2, top, g, t_diagonal, t_columns)`` of the argument of
    :func:`~fedlatent.models.gmm.check_step.full_step_holds` for factors ``U`` (K, d, d), the
    server's covariances before their half-sum ``G`` (K, d, d) and the verified statistics
    ``sxx`` (K, d, d), ``sx`` (K, d) of ``n`` records: ``e`` at least every ``||U_k^T
    Sigma_k U_k - I||_F`` (the computed ``U^T G U - I``'s Frobenius norm over all components
    plus its rounding and the half-sum's), ``u2`` at least every ``||U_k||_F^2`` (their sum),
    ``top`` at most ``max |U|`` (the largest diagonal entry), ``g`` the Frobenius norm of
    every ``G_k``, and the two bounds ``t`` above the degenerate floor (a Rayleigh quotient
    of the pooled covariance at the axes, its least diagonal entry; and at the columns of
    every ``U_k``). All NaN where ``U`` is not upper triangular with a positive diagonal."""
    e, u2, top, g = _factor(U, G)
    if math.isnan(e):
        return e, u2, top, g, _NAN, _NAN
    t_diagonal, t_columns = _floors(U, sxx, sx, n, g)
    return e, u2, top, g, t_diagonal, t_columns


@njit(cache=True)
def factor_step_holds(U, G, sxx, sx, n, tolerance):
    """Whether the factors ``U`` pass the check of
    :func:`~fedlatent.models.gmm.check_step.full_step_holds` (arguments of
    :func:`factor_parts`; ``tolerance`` the share of the replay's tolerance a factor's error
    may take, ``check_step._SHARE rtol``): ``e`` small enough against it and the components'
    lowest eigenvalues above a floor's bound. NaN or an infinity anywhere: False."""
    e, u2, top, g, t_diagonal, t_columns = factor_parts(U, G, sxx, sx, n)
    d = U.shape[1]
    if not (4 * (d + 1) * e <= 1 and e * math.sqrt(d * u2) <= tolerance * top):
        return False
    low = (1 - e) / u2  # (at most every component's lowest eigenvalue)
    return low > t_diagonal or low > t_columns


@njit(cache=True)
def full_parts(nk0, sx, sxx, center, reg, eps):  # pragma: no cover (compiled)
    """``(nk, means, G)`` of :func:`~fedlatent.models.gmm.math.gmm_full_parts` (the server's
    bits, unlike the rest of this module: elementwise operations only, each as NumPy's, no
    contraction): ``nk = nk0 + eps``, ``mc = sx / nk``, ``means = mc + center``, ``G = sxx /
    nk - mc mc^T`` with ``reg`` then added to its diagonal. ValueError for statistics and a
    centre of other shapes (as NumPy's broadcasting: numba checks no bounds)."""
    K, d = sx.shape
    if (nk0.shape[0] != K or sxx.shape[0] != K or sxx.shape[1] != d or sxx.shape[2] != d
            or center.shape[0] != d):
        raise ValueError("gmm_full_parts: statistics and centre of different shapes")
    nk, means, G = np.empty(K), np.empty((K, d)), np.empty((K, d, d))
    mc = np.empty(d)
    for k in range(K):
        n = nk0[k] + eps
        nk[k] = n
        for i in range(d):
            mc[i] = sx[k, i] / n
            means[k, i] = mc[i] + center[i]
        for i in range(d):
            for j in range(d):
                G[k, i, j] = sxx[k, i, j] / n - mc[i] * mc[j]
            G[k, i, i] += reg
    return nk, means, G
