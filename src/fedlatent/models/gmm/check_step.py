"""A verifying site's check of GMM parameters against the statistics they must come from,
by products only: the parameters mapped forward, not the M-step replayed (issue 38).

:func:`full_step_holds` proves that full-covariance parameters sent by a server are, within
the replay's tolerance, those :meth:`~fedlatent.models.gmm.model.GMMModel.server_step` gives
on the verified statistics, without a factorization: weights and means are the server's own
arithmetic (the same bits), and a precision factor ``U`` is checked by how far ``U^T Sigma
U`` is from the identity. Where it cannot prove it (a floor could act, a factor is off, the
last bits differ), it says so and the site replays the M-step itself.

The products, norms and floors are a few dozen NumPy calls on a site's few dozen entries, or
one compiled call (:func:`~fedlatent.models.gmm._check_kernel.factor_step_holds`, the same
quantities whatever their summation order) where numba pays
(:func:`~fedlatent.engine.protocol.compiled.worth`: set up in the process already, or many
verifying sites' checks in it): its set-up, about half a CPU second, is more than one site's
checks of a whole fit save, and a deployed site's process answers one message. The kernel
takes C-contiguous, writeable float64 arrays (others are copied as such first: no input
compiles another specialization).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from ...engine.contract.degenerate import DEGENERATE_FRACTION
from ...engine.protocol.compiled import kernels, worth
from .math import gmm_full_parts

__all__ = ["full_step_holds"]

_U = np.finfo(np.float64).eps / 2  # the unit roundoff
_POSITIVE = (0.0).__lt__
_F64 = np.dtype(np.float64)
_KEYS = frozenset(("weights", "means", "precisions_cholesky", "center"))
#: a factor's accepted error, as a fraction of the replay's tolerance (the rest of it is
#: left to the replay's own rounding; the kernel is given the product)
_SHARE = 0.2
_KERNEL = "fedlatent.models.gmm._check_kernel"


def full_step_holds(S, sent: dict, center: np.ndarray, reg_covar: float, rtol: float,
                    compiled: bool | None = None) -> bool:
    """Whether ``sent`` is, within ``rtol / 2`` of each parameter's largest entry, what
    ``server_step`` gives on full-covariance statistics ``S`` (K components, d features) without
    differential privacy and with ``center`` the previous centre; False where this check cannot
    tell (the caller then replays the M-step: False never refuses). Weights, means and centre:
    the server's bytes, the means finite (``-0.0`` for ``0.0``: replayed).

    The argument, for each component with covariance ``Sigma`` (the server's arithmetic,
    :func:`~fedlatent.models.gmm.math.gmm_m_step`: ``G = sxx / n - mc mc^T`` with ``reg_covar``
    on its diagonal, then ``G``'s symmetric part; the check takes ``G`` from
    :func:`~fedlatent.models.gmm.math.gmm_full_parts`, the server's own, before the half-sum)
    and exact precision factor ``V`` (upper triangular, positive diagonal, ``V^T Sigma V = I``;
    the server's ``P`` is ``V`` up to its factorization's rounding). A sent ``U`` that is upper
    triangular with a positive diagonal (the strictly lower entries exactly 0) is ``V (I + M)``,
    ``M`` upper triangular, and ``E = U^T Sigma U - I = M + M^T + M^T M``: ``I + M`` is the
    Cholesky factor of ``I + E``, so by its recursion ``max |M| <= 2 e`` whenever ``max |E| <=
    e`` and ``4 (d + 1) e <= 1`` (each diagonal entry ``sqrt(1 + E_ii - sum M_ki^2)``, each
    other ``(E_ij - sum M_ki M_kj) / (1 + M_ii)``, the sums at most ``4 d e^2``). Then ``U - V =
    V M`` has entries at most ``2 e ||V||_inf <= 2.1 e ||U||_inf <= 2.1 e sqrt(d) ||U||_F`` (row
    sums; ``V = U (I + M)^-1``). Here ``e`` bounds ``E``'s Frobenius norm over every component:
    the server's half-sum rounds each entry of ``sym(G)`` by at most ``u`` relative (``u`` the
    unit roundoff; the diagonal not at all), so ``E = sym(U^T G U - I) + U^T D U`` with
    ``||D||_F <= u ||G||_F``, and ``sym`` does not increase a Frobenius norm: ``e`` is the
    computed ``U^T G U - I``'s Frobenius norm plus ``2 (d + 2) u ||G||_F ||U||_F^2`` (its
    rounding, two products of d terms, ``-1`` on a diagonal entry near 1 exact; and ``D``'s),
    ``||G||_F`` and ``||U||_F^2`` taken over every component: all at least each component's
    (whatever the products' summation order, with or without fused multiply-adds: the standard
    bounds of dot products). Accepting when ``e sqrt(d ||U||_F^2) <= 0.2 rtol u_max``, ``u_max``
    the largest diagonal entry of ``U`` (at most ``max |U|``), leaves every entry within ``0.42
    rtol`` of the parameter's largest of ``V``, the rest of ``rtol`` to the server's own
    rounding: what this accepts, the replay accepts. A 1e-6 move of an entry makes ``E`` of that
    order and is left to the replay, which refuses it; so are covariances so ill-conditioned
    that the rounding bound alone exceeds the tolerance (``||G||_F ||U||_F^2`` above ~1e5).

    The floors ``server_step`` may apply are excluded as the replay's lean path does
    (:func:`~fedlatent.models.gmm.math.lean_full_step`): no count at or below the floor;
    :func:`~fedlatent.models.gmm.math.hold_degenerate` leaves a component as it is when its
    lowest eigenvalue exceeds ``t``, a bound above its floor (``DEGENERATE_FRACTION`` times
    ``1.01`` times a Rayleigh quotient of the pooled covariance, at least its lowest eigenvalue,
    plus ``1e-12`` of its trace for the eigenvalues' rounding; plus ``2e-10`` times ``||G||_F``,
    at least twice the largest eigenvalue's magnitude of any ``Sigma``):
    :func:`~fedlatent.models.gmm._check_kernel.factor_parts`. Here ``lambda_min(Sigma) >= (1 -
    e) / ||U||_F^2`` (``Sigma = U^-T (I + E) U^-1``) must exceed ``t``. Any other case (a
    quotient, a norm or a bound that is NaN or infinite among them): False.

    Parameters
    ----------
    S : Stats
        ``nk`` (K,), ``sx`` (K, d), ``sxx`` (K, d, d): the verified mean statistics.
    sent : dict
        The parameters to check: ``weights`` (K,), ``means`` (K, d),
        ``precisions_cholesky`` (K, d, d), ``center`` (d,).
    center : ndarray of shape (d,)
        The centre of the parameters the round before evaluated.
    reg_covar : float
    rtol : float
        The replay's tolerance (:data:`~fedlatent.engine.node.replay.REPLAY_RTOL`).
    compiled : bool, optional
        Compiled or NumPy (one decision away from the threshold); None: where numba pays.
    """
    K, d = S["sx"].shape
    fixed = _fixed(K, d)
    if sent.keys() != _KEYS or not _shapes(sent, fixed.shapes):
        return False
    counts = S["nk"].tolist()
    n = sum(counts)
    if not (n > 0 and min(counts) > 1e-10 * n):  # (all positive: their sum is their
        return False  # magnitudes'; server_step floors the counts first)
    compiled = worth(K * d * d) if compiled is None else compiled  # (numba set up, or scale)
    weights, means, G = gmm_full_parts(S, center, reg_covar, compiled)  # (the server's bits)
    if not (sent["weights"].tobytes() == weights.tobytes()
            and sent["means"].tobytes() == means.tobytes()
            and sent["center"].tobytes() == center.tobytes()
            and math.isfinite(sum(means.ravel().tolist()))):  # (mc + centre: both finite)
        return False  # (another machine's last bits, a move, -0.0 for 0.0: the replay decides)
    U = sent["precisions_cholesky"]
    if compiled:  # (one compiled call)
        return _compiled_holds(U, G, S, n, rtol)
    return _numpy_holds(U, G, S, n, rtol, fixed)


def _numpy_holds(U: np.ndarray, G: np.ndarray, S, n: float, rtol: float, fixed) -> bool:
    """:func:`full_step_holds`'s decision on the factors, in NumPy."""
    d = U.shape[1]
    e, u2, top, g = _factor_error(U, G, fixed)
    if not (4 * (d + 1) * e <= 1 and e * math.sqrt(d * u2) <= _SHARE * rtol * top):
        return False
    low = (1 - e) / u2  # (at most every component's lowest eigenvalue)
    return bool(low > _floor(S, n, g, U, fixed, pooled_diagonal=True) or low > _floor(
        S, n, g, U, fixed, pooled_diagonal=False))


def _compiled_holds(U: np.ndarray, G: np.ndarray, S, n: float, rtol: float) -> bool:
    """:func:`full_step_holds`'s decision on the factors by the compiled kernel (False where
    the statistics are not float64 of the factors' shapes: the replay's)."""
    sxx, sx = S["sxx"], S["sx"]
    if not (sxx.dtype == sx.dtype == G.dtype == _F64 and sxx.shape == U.shape):
        return False
    return kernels(_KERNEL).factor_step_holds(_typed(U), _typed(G), _typed(sxx), _typed(sx),
                                              float(n), _SHARE * float(rtol))


def _shapes(sent: dict, shapes: tuple) -> bool:
    w, m, U, c = sent["weights"], sent["means"], sent["precisions_cholesky"], sent["center"]
    return (type(w) is type(m) is type(U) is type(c) is np.ndarray  # (else: the replay's)
            and (w.shape, m.shape, U.shape, c.shape) == shapes
            and w.dtype == m.dtype == U.dtype == c.dtype == _F64)


def _typed(a: np.ndarray) -> np.ndarray:
    """``a`` (float64) as the kernel's one specialization takes it: C-contiguous and
    writeable (a copy if not: a read-only message's array, a view)."""
    flags = a.flags
    return a if flags.c_contiguous and flags.writeable and type(a) is np.ndarray else (
        np.array(a, dtype=_F64, order="C"))


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
