"""The GMM forward M-step check in NumPy as it was at 3011c22 (``fedlatent.models.gmm.check_step``,
before its compiled kernel, issue 38), kept here apart from the library's NumPy path so that
the kernel is compared with the check as it was (tests/models/test_gmm_check_step.py).

:func:`parts` gives what the kernel's ``factor_parts`` gives: ``(e, u2, top, g, t_diagonal,
t_columns)``, both floors computed (the check itself computes the second only when the first
does not pass).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from fedlatent.engine.contract.degenerate import DEGENERATE_FRACTION
from fedlatent.models.gmm.math import gmm_full_parts

_U = np.finfo(np.float64).eps / 2  # the unit roundoff
_POSITIVE = (0.0).__lt__
_F64 = np.dtype(np.float64)
_KEYS = frozenset(("weights", "means", "precisions_cholesky", "center"))
#: a factor's accepted error, as a fraction of the replay's tolerance (the rest of it is
#: left to the replay's own rounding)
_SHARE = 0.2


def full_step_holds(S, sent: dict, center: np.ndarray, reg_covar: float, rtol: float) -> bool:
    """The check as it was in NumPy (the library's docstring has the argument)."""
    nk0 = S["nk"]
    K, d = S["sx"].shape
    fixed = _fixed(K, d)
    if sent.keys() != _KEYS or not _shapes(sent, fixed.shapes):
        return False
    counts = nk0.tolist()
    n = sum(counts)
    if not (n > 0 and min(counts) > 1e-10 * n):  # (all positive: their sum is their
        return False  # magnitudes'; server_step floors the counts first)
    weights, means, G = gmm_full_parts(S, center, reg_covar)  # (the server's bits)
    if not (sent["weights"].tobytes() == weights.tobytes()
            and sent["means"].tobytes() == means.tobytes()
            and sent["center"].tobytes() == center.tobytes()
            and math.isfinite(sum(means.ravel().tolist()))):  # (mc + centre: both finite)
        return False  # (another machine's last bits, a move, -0.0 for 0.0: the replay decides)
    U = sent["precisions_cholesky"]
    e, u2, top, g = _factor_error(U, G, fixed)
    if not (4 * (d + 1) * e <= 1 and e * math.sqrt(d * u2) <= _SHARE * rtol * top):
        return False
    low = (1 - e) / u2  # (at most every component's lowest eigenvalue)
    return bool(low > _floor(S, n, g, U, fixed, pooled_diagonal=True) or low > _floor(
        S, n, g, U, fixed, pooled_diagonal=False))


def _shapes(sent: dict, shapes: tuple) -> bool:
    w, m, U, c = sent["weights"], sent["means"], sent["precisions_cholesky"], sent["center"]
    return (type(w) is type(m) is type(U) is type(c) is np.ndarray  # (else: the replay's)
            and (w.shape, m.shape, U.shape, c.shape) == shapes
            and w.dtype == m.dtype == U.dtype == c.dtype == _F64)


def _factor_error(U: np.ndarray, G: np.ndarray, fixed
                  ) -> tuple[float, float, float, float]:
    """``(e, u2, top, g)``: ``e`` at least every ``||U_k^T Sigma_k U_k - I||_F`` (see
    :func:`full_step_holds`: the computed ``U^T G U - I``'s Frobenius norm over all
    components plus its rounding and the half-sum's), ``u2`` at least every ``||U_k||_F^2``
    (their sum), ``top`` at most ``max |U|`` (the largest diagonal entry) and ``g`` the
    Frobenius norm of every ``G_k``; NaN where ``U`` is not upper triangular with a positive
    diagonal (the strictly lower entries exactly 0)."""
    picked = U.take(fixed.picked).tolist()  # (every strictly lower entry, then the diagonal)
    d = U.shape[1]
    diag = picked[len(picked) - len(U) * d:]
    if any(picked[:len(picked) - len(diag)]) or not all(map(_POSITIVE, diag)):
        return math.nan, math.nan, math.nan, math.nan
    E = U.transpose(0, 2, 1) @ G @ U
    E -= fixed.eye  # (K identity matrices, contiguous: one flat subtraction)
    u2, g = float(np.vdot(U, U)), math.sqrt(float(np.vdot(G, G)))
    return math.sqrt(float(np.vdot(E, E))) + 2 * (d + 2) * _U * u2 * g, u2, max(diag), g


def _floor(S, n: float, g: float, U: np.ndarray, fixed, pooled_diagonal: bool) -> float:
    """``t``: above the degenerate floor ``hold_degenerate`` would apply (see
    :func:`full_step_holds`), from an upper bound of the pooled covariance's lowest
    eigenvalue: a Rayleigh quotient at the axes (``pooled_diagonal``: its least diagonal
    entry, at most the least second moment about the centre, which is the data's mean once
    the start has set it) or at the columns of every ``U_k`` (towards the components'
    flattest directions: ``U_k^T cov_k U_k = I``)."""
    sxx = S["sxx"]
    d = sxx.shape[1]
    entries = sxx.take(fixed.diagonal).tolist()  # (each component's diagonal in turn)
    moments = [sum(entries[i::d]) for i in range(d)]
    scale = sum(entries) / n  # (at least the pooled covariance's trace)
    if pooled_diagonal:
        quotient = min(moments) / n
    else:
        total = sxx.sum(axis=0)
        mean = S["sx"].sum(axis=0) / n
        num = (U * (total @ U)).sum(axis=1) / n - (mean @ U) ** 2
        quotient = float((num / (U * U).sum(axis=1)).min())
    return (DEGENERATE_FRACTION * (1.01 * max(quotient, 0.0) + 1e-12 * scale)
            + 2e-10 * g)  # (g = ||G||_F: at least every |eigenvalue| of a covariance)


_FIXED: dict[tuple[int, int], SimpleNamespace] = {}


def _fixed(K: int, d: int) -> SimpleNamespace:
    """What does not change between rounds for K components of d features (kept per shape):
    ``picked``, the flat indices of every strictly lower entry of K factors, then of their
    diagonals; ``diagonal``, those of the diagonals only; ``eye``, K identity matrices;
    ``shapes``, those of the weights, means, factors and centre."""
    got = _FIXED.get((K, d))
    if got is None:
        i, j = np.tril_indices(d, -1)
        k = np.arange(K)[:, None] * (d * d)
        diagonal = (k + np.arange(d) * (d + 1)).ravel()
        if len(_FIXED) > 64:
            _FIXED.clear()
        got = _FIXED[(K, d)] = SimpleNamespace(
            picked=np.concatenate([(k + i * d + j).ravel(), diagonal]), diagonal=diagonal,
            eye=np.tile(np.eye(d), (K, 1, 1)), shapes=((K,), (K, d), (K, d, d), (d,)))
        for a in (got.picked, got.diagonal, got.eye):
            a.flags.writeable = False  # (shared by every check of the shape)
    return got


def parts(S, U: np.ndarray, G: np.ndarray) -> tuple[float, ...]:
    """``(e, u2, top, g, t_diagonal, t_columns)`` as the check computes them (NaN where ``U``
    is not upper triangular with a positive diagonal)."""
    K, d = S["sx"].shape
    fixed = _fixed(K, d)
    e, u2, top, g = _factor_error(U, G, fixed)
    if math.isnan(e):
        return e, u2, top, g, math.nan, math.nan
    n = sum(S["nk"].tolist())
    return (e, u2, top, g, _floor(S, n, g, U, fixed, pooled_diagonal=True),
            _floor(S, n, g, U, fixed, pooled_diagonal=False))
