"""Gaussian mixture math: log-densities, sufficient statistics and the M-step, as pure functions.

The same computations as scikit-learn's ``sklearn.mixture._gaussian_mixture`` (precision Cholesky
factors, log-determinants), written on statistics summed over samples so that a federation of
clients can add them up.

References
----------
Dempster, Laird, Rubin (1977), "Maximum likelihood from incomplete data via the EM algorithm".
"""

from __future__ import annotations

import functools

import numpy as np

from ...engine.protocol.numerics import (
    lift_eigenvalues,
    logsumexp,  # noqa: F401  (re-exported)
)
from ...engine.stats import Stats

__all__ = [
    "COV_TYPES",
    "compute_precision_cholesky",
    "estimate_log_gaussian_prob",
    "covariances_from_precisions",
    "floor_covariances",
    "floor_noisy_covariances",
    "gmm_m_step",
    "gmm_statistics",
    "lean_full_step",
    "merged_rows",
    "logsumexp",
    "n_free_parameters",
]

COV_TYPES = ("full", "tied", "diag", "spherical")


def compute_precision_cholesky(covariances: np.ndarray, covariance_type: str) -> np.ndarray:
    """Cholesky factors of the precision matrices (as scikit-learn stores them).

    Parameters
    ----------
    covariances : ndarray
        (K, d, d) full, (d, d) tied, (K, d) diag, (K,) spherical.
    covariance_type : {"full", "tied", "diag", "spherical"}

    Returns
    -------
    ndarray, same shape as ``covariances``
    """
    msg = (
        "a covariance matrix is not positive definite (a component collapsed onto few points); "
        "raise reg_covar or lower n_components"
    )
    if covariance_type in ("full", "tied"):
        # LAPACK's potrf and trtrs called directly: the same routines (and bits) as
        # scipy.linalg.cholesky and solve_triangular, without their wrappers' checks and
        # batching (the server's M-step and a verifying site's replay, every round)
        from scipy.linalg import lapack  # (not imported by a site that only answers E-steps)

        if not np.isfinite(covariances).all():
            raise ValueError("array must not contain infs or NaNs")
        full = covariances if covariance_type == "full" else covariances[None]
        eye = np.eye(full.shape[-1])
        out = np.empty(full.shape)
        for k in range(full.shape[0]):  # (K components: a handful of small matrices)
            c, info = lapack.dpotrf(full[k], lower=1, clean=1)
            if info != 0:
                raise ValueError(msg)
            out[k] = lapack.dtrtrs(c, eye, lower=1)[0].T
        return out if covariance_type == "full" else out[0]
    if np.any(np.less_equal(covariances, 0.0)):
        raise ValueError(msg)
    return 1.0 / np.sqrt(covariances)


def _log_det_cholesky(prec_chol: np.ndarray, covariance_type: str, d: int) -> np.ndarray:
    if covariance_type == "full":
        K = prec_chol.shape[0]
        return np.sum(np.log(prec_chol.reshape(K, -1)[:, :: d + 1]), axis=1)
    if covariance_type == "tied":
        return np.sum(np.log(np.diag(prec_chol)))
    if covariance_type == "diag":
        return np.sum(np.log(prec_chol), axis=1)
    return d * np.log(prec_chol)


def estimate_log_gaussian_prob(
    X: np.ndarray, means: np.ndarray, prec_chol: np.ndarray, covariance_type: str
) -> np.ndarray:
    """log N(x_i; mu_k, Sigma_k) for every sample and component.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    means : ndarray of shape (n_components, n_features)
    prec_chol : ndarray
        Precision Cholesky factors, see :func:`compute_precision_cholesky`.

    Returns
    -------
    ndarray of shape (n_samples, n_components)
    """
    n, d = X.shape
    K = means.shape[0]
    log_det = _log_det_cholesky(prec_chol, covariance_type, d)
    if covariance_type == "full":
        log_prob = np.empty((n, K))
        for k in range(K):
            y = X @ prec_chol[k]
            y -= means[k] @ prec_chol[k]  # (in place: the same subtraction)
            log_prob[:, k] = np.einsum("ij,ij->i", y, y)
    elif covariance_type == "tied":
        log_prob = np.empty((n, K))
        Xp = X @ prec_chol
        for k in range(K):
            y = Xp - means[k] @ prec_chol
            log_prob[:, k] = np.einsum("ij,ij->i", y, y)
    elif covariance_type == "diag":
        precisions = prec_chol**2
        log_prob = (
            np.sum(means**2 * precisions, 1) - 2.0 * (X @ (means * precisions).T)
            + (X**2) @ precisions.T
        )
    else:
        precisions = prec_chol**2
        log_prob = (
            np.sum(means**2, 1) * precisions
            - 2 * (X @ means.T * precisions)
            + np.outer(np.einsum("ij,ij->i", X, X), precisions)
        )
    return -0.5 * (d * np.log(2 * np.pi) + log_prob) + log_det


def gmm_statistics(
    X: np.ndarray, resp: np.ndarray, center: np.ndarray, covariance_type: str,
    row_mass: np.ndarray | None = None,
) -> Stats:
    """Sufficient statistics of a Gaussian mixture, summed over samples.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    resp : ndarray of shape (n_samples, n_components)
        Responsibilities (rows sum to 1).
    center : ndarray of shape (n_features,)
        Shift applied to X before the moments (any fixed vector; the sums stay additive).
    row_mass : ndarray of shape (n_samples,) or None
        Frequency weight of each row, for the one block ``resp`` does not weigh ("tied"'s
        pooled ``sum x x^T``); ``resp`` is then already weighted. None: 1 per row.

    Returns
    -------
    Stats with blocks ``nk`` (K,), ``sx`` (K, d), and ``sxx``: (K, d, d) full, (d, d) tied,
    (K, d) diag and spherical.
    """
    Xc = X - center
    nk = resp.sum(axis=0)
    sx = resp.T @ Xc
    if covariance_type == "full":
        K, d = resp.shape[1], X.shape[1]
        sxx = np.empty((K, d, d))
        for k in range(K):
            sxx[k] = (Xc * resp[:, k : k + 1]).T @ Xc
    elif covariance_type == "tied":
        sxx = Xc.T @ Xc if row_mass is None else (Xc * row_mass[:, None]).T @ Xc
    else:
        sxx = resp.T @ (Xc * Xc)
    return Stats({"nk": nk, "sx": sx, "sxx": sxx}, copy=False)


def gmm_m_step(
    S: Stats, center: np.ndarray, covariance_type: str, reg_covar: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, means and covariances from (mean or summed) statistics.

    Returns
    -------
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    covariances : ndarray, shape by covariance_type
    """
    if covariance_type == "full":
        weights, means, G = gmm_full_parts(S, center, reg_covar)
        return weights, means, 0.5 * (G + np.transpose(G, (0, 2, 1)))
    nk = S["nk"] + 10 * np.finfo(np.float64).eps
    mc = S["sx"] / nk[:, None]
    d = mc.shape[1]
    if covariance_type == "tied":
        cov = (S["sxx"] - (nk[:, None] * mc).T @ mc) / nk.sum()
        cov = 0.5 * (cov + cov.T)
        cov[np.arange(d), np.arange(d)] += reg_covar
    else:
        cov = S["sxx"] / nk[:, None] - mc**2 + reg_covar
        if covariance_type == "spherical":
            cov = cov.mean(axis=1)
    weights = nk / nk.sum()
    return weights, mc + center, cov


def gmm_full_parts(S: Stats, center: np.ndarray, reg_covar: float, compiled: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`gmm_m_step`'s full-covariance weights and means, and its covariances before
    their symmetric half-sum ``(G + G^T) / 2``: ``G = sxx / n_k - mc mc^T`` with ``reg_covar``
    on the diagonal (the half-sum leaves a diagonal entry as it is: ``(2 a) / 2``). A
    verifying site's forward check bounds ``G`` itself (:mod:`~fedlatent.models.gmm.check_step`).

    Up to :data:`_FLAT_ENTRIES` covariance entries, each product on the flat arrays by index
    maps made once per shape (:func:`_full_maps`: one-dimensional calls, which NumPy runs
    without its broadcasting machinery, several times faster on a site's few dozen entries);
    above, by broadcasting. ``compiled`` (a verifying site's check where numba pays): one
    compiled pass (:func:`~fedlatent.models.gmm._check_kernel.full_parts`). The same
    elementwise operations on the same values every way: the same bits (compiled without
    contraction, a product and a difference stay two roundings)."""
    if compiled:
        from ...engine.protocol.compiled import kernels

        nk, means, G = kernels("fedlatent.models.gmm._check_kernel").full_parts(*(
            np.ascontiguousarray(a, dtype=np.float64) for a in (S["nk"], S["sx"], S["sxx"],
                                                                center)),
            float(reg_covar), _TEN_EPS)
        return nk / nk.sum(), means, G
    nk = S["nk"] + _TEN_EPS
    sx, sxx = S["sx"], S["sxx"]
    K, d = sx.shape
    maps = _full_maps(K, d) if K * d * d <= _FLAT_ENTRIES else None
    if maps is None:
        mc = sx / nk[:, None]
        G = sxx / nk[:, None, None] - mc[:, :, None] * mc[:, None, :]
        G.reshape(K, d * d)[:, ::d + 1] += reg_covar
    else:
        by_row, by_entry, left, right, diagonal = maps
        flat = sx.reshape(-1) / nk.take(by_row)
        G = sxx.reshape(-1) / nk.take(by_entry)
        G -= flat.take(left) * flat.take(right)
        G[diagonal] += reg_covar
        mc, G = flat.reshape(K, d), G.reshape(K, d, d)
    return nk / nk.sum(), mc + center, G


#: the most covariance entries (K d^2) :func:`gmm_full_parts` takes by index maps
_FLAT_ENTRIES = 4096


@functools.lru_cache(maxsize=8)
def _full_maps(K: int, d: int) -> tuple[np.ndarray, ...]:
    """Index maps of K components of d features on flat arrays: each mean entry's component,
    each covariance entry's component, its row's and its column's mean entry, and the
    covariance diagonal's entries."""
    k, i, j = (a.ravel() for a in np.indices((K, d, d), dtype=np.intp))
    maps = (np.repeat(np.arange(K), d), k, k * d + i, k * d + j,
            (np.arange(K)[:, None] * (d * d) + np.arange(d) * (d + 1)).ravel())
    for a in maps:
        a.flags.writeable = False  # (shared by every call of the shape)
    return maps


def lean_full_step(S: Stats, center: np.ndarray, reg_covar: float) -> dict | None:
    """The parameters :meth:`~fedlatent.models.gmm.model.GMMModel.server_step` gives on
    full-covariance statistics ``S`` (K components, d features) without differential privacy,
    in a few batched NumPy calls, for a verifying site's replay; None where the two paths
    could part (the caller then runs ``server_step`` itself).

    The same arithmetic as :func:`gmm_m_step` (weights, means, symmetrized covariances with
    ``reg_covar`` on the diagonal: the same bits), and the precisions' Cholesky factors from
    ``numpy.linalg.cholesky`` and ``inv`` (the same LAPACK factorization; the triangular
    inverse by LU: a few units in the last place times the factor's condition number).
    What it skips is :func:`hold_degenerate`'s eigenvalues: a component's covariance is
    left as it is there when its lowest eigenvalue exceeds ``DEGENERATE_FRACTION`` times
    the pooled covariance's lowest, plus ``1e-10`` of the largest eigenvalue; here, when
    ``sym_k - t I`` has a Cholesky factor for ``t`` a bound above both terms
    (``1.01 DEGENERATE_FRACTION`` times the least of the pooled covariance's diagonal
    entries and the inverse of its inverse's largest diagonal entry, each at least its
    lowest eigenvalue, plus ``2e-10`` times the largest trace, at least any eigenvalue of a
    positive-definite ``sym_k``): a factor proves ``lambda_min(sym_k) > t`` up to the
    factorization's own rounding (a few ``eps`` of the norm, far inside the slack), so
    ``server_step`` leaves every covariance as it is too. Any count at or below the
    floor ``server_step`` lifts counts to, a pooled covariance without a Cholesky factor, a
    covariance not clearly clear of the degenerate floor, or a failed factorization: None.

    Returns
    -------
    dict or None
        ``weights`` (K,), ``means`` (K, d), ``precisions_cholesky`` (K, d, d) upper
        triangular, ``center`` (d,).
    """
    from ...engine.contract.degenerate import DEGENERATE_FRACTION

    nk0, sx, sxx = S["nk"], S["sx"], S["sxx"]
    n = float(nk0.sum())
    if not (n > 0 and float(nk0.min()) > 1e-10 * float(np.abs(nk0).sum())):
        return None  # (server_step floors the counts first)
    K, d = sx.shape
    nk = nk0 + _TEN_EPS
    mc = sx / nk[:, None]
    mats = np.empty((K + 1, d, d))  # the covariances, then the pooled one: one factorization
    cov = np.subtract(sxx / nk[:, None, None], mc[:, :, None] * mc[:, None, :], out=mats[:K])
    mean = sx.sum(axis=0) / n
    np.subtract(sxx.sum(axis=0) / n, mean[:, None] * mean[None, :], out=mats[K])
    mats += np.transpose(mats, (0, 2, 1))
    mats *= 0.5
    diag = mats.reshape(K + 1, d * d)[:, ::d + 1]
    diag[:K] += reg_covar
    try:
        inv = np.linalg.inv(np.linalg.cholesky(mats))
    except np.linalg.LinAlgError:
        return None
    # the pooled covariance's lowest eigenvalue is at most its least diagonal entry and the
    # inverse of its inverse's largest (the squared columns of its factor's inverse)
    low = min(float(diag[K].min()), 1.0 / float((inv[K] ** 2).sum(axis=0).max()))
    t = DEGENERATE_FRACTION * 1.01 * low + 2e-10 * float(diag[:K].sum(axis=1).max())
    shifted = cov - 0.0
    shifted.reshape(K, d * d)[:, ::d + 1] -= t
    try:
        np.linalg.cholesky(shifted)
    except np.linalg.LinAlgError:
        return None
    if not np.isfinite(inv).all():
        return None
    return {"weights": nk / nk.sum(), "means": mc + center,
            "precisions_cholesky": np.transpose(inv[:K], (0, 2, 1)), "center": center}


_TEN_EPS = 10 * np.finfo(np.float64).eps


def hold_degenerate(cov: np.ndarray, S: Stats, covariance_type: str
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Covariances kept off a point mass (:mod:`fedlatent.engine.contract.degenerate`): each
    component's eigenvalues at least ``DEGENERATE_FRACTION`` of the smallest eigenvalue of the
    pooled covariance (``"full"``), its variances at least that fraction of each feature's
    pooled variance (``"diag"``), its variance at least that fraction of their mean
    (``"spherical"``); ``"tied"`` (one shared covariance) is left as it is. The pooled moments
    come from ``S`` itself. Returns the covariances and which components were held, (K,)."""
    from ...engine.contract.degenerate import DEGENERATE_FRACTION

    nk = np.asarray(S["nk"], dtype=np.float64)
    n = float(nk.sum())
    if covariance_type == "tied" or not n > 0:
        return cov, np.zeros(nk.size, dtype=bool)
    mean = np.asarray(S["sx"], dtype=np.float64).sum(axis=0) / n
    sxx = np.asarray(S["sxx"], dtype=np.float64).sum(axis=0) / n
    if covariance_type == "full":
        pooled = sxx - np.outer(mean, mean)
        sym = 0.5 * (cov + np.swapaxes(cov, -1, -2))
        vals = np.linalg.eigvalsh(np.concatenate([(0.5 * (pooled + pooled.T))[None], sym]))
        floor = DEGENERATE_FRACTION * max(float(vals[0, 0]), 0.0)
        if not floor > 0:
            return cov, np.zeros(nk.size, dtype=bool)
        # every component's lowest eigenvalue clear of the floor (by far more than the last
        # bits in which eigenvalues with and without vectors may differ, on the scale of the
        # largest): nothing to lift, as lift_eigenvalues would find (its symmetrized
        # covariances, the same bits); else it decides, on its own eigenvalues
        if float(vals[1:, 0].min()) > floor + 1e-10 * float(np.abs(vals[1:]).max()):
            return sym, np.zeros(nk.size, dtype=bool)
        return lift_eigenvalues(cov, floor)
    var = np.maximum(sxx - mean**2, 0.0) * DEGENERATE_FRACTION
    floor = var if covariance_type == "diag" else float(var.mean())
    held = np.asarray(cov < floor)
    held = held.any(axis=1) if held.ndim > 1 else held
    return np.maximum(cov, floor), held


def floor_covariances(cov: np.ndarray, covariance_type: str, floor: float) -> np.ndarray:
    """Covariances with every eigenvalue raised to at least ``floor`` (a projection onto the
    positive-definite cone used when stochastic statistics leave it); covariances already
    above it are unchanged."""
    if covariance_type in ("diag", "spherical"):
        return np.maximum(cov, floor)
    return lift_eigenvalues(cov, floor)[0]


def floor_noisy_covariances(cov: np.ndarray, covariance_type: str, reg: float,
                            alive: np.ndarray | None = None) -> np.ndarray:
    """Covariances from noisy (differentially private) moments, their eigenvalues kept at
    least ``1e-3`` of the mean variance (over the ``alive`` components when given) and at
    least ``reg``: noise can shrink a component onto a few directions."""
    diag = (np.diagonal(cov, axis1=-2, axis2=-1) if covariance_type in ("full", "tied")
            else cov)
    if alive is not None and covariance_type != "tied":
        diag = diag[alive]
    scale = float(np.mean(np.abs(diag))) if np.size(diag) else 1.0
    return floor_covariances(cov, covariance_type, max(reg, 1e-3 * scale))


def covariances_from_precisions(prec_chol: np.ndarray, covariance_type: str) -> np.ndarray:
    """Covariances from the Cholesky factors of the precisions (``P = L L^T``, ``C = P^-1``)."""
    if covariance_type in ("diag", "spherical"):
        return 1.0 / prec_chol ** 2
    L = prec_chol if covariance_type == "full" else prec_chol[None]
    C = np.linalg.inv(L @ np.transpose(L, (0, 2, 1)))
    C = 0.5 * (C + np.transpose(C, (0, 2, 1)))
    return C if covariance_type == "full" else C[0]


def n_free_parameters(n_components: int, n_features: int, covariance_type: str) -> int:
    K, d = n_components, n_features
    cov = {"full": K * d * (d + 1) / 2, "tied": d * (d + 1) / 2, "diag": K * d, "spherical": K}[
        covariance_type
    ]
    return int(cov + K * d + K - 1)


def merged_rows(X: np.ndarray, centers: np.ndarray, labels: np.ndarray,
                nearest: np.ndarray) -> np.ndarray:
    """The rows ``X`` (..., d) as the hard-assignment sums take them: a row that
    :func:`~fedlatent.models.gmm.model.hard_labels` moved from its ``nearest`` centre (a
    cell too small to send) to ``labels``' centre is translated by the difference of the two
    centres, so that it joins the larger cell where it lies about its own centre (the cell's
    spread is its rows' own, not the distance between two clusters). Rows left in place are
    returned unchanged (``X`` itself when none moved). The blocks sent are those of
    ``hard_labels`` (the same cells, counts and number of rows each); the translation uses
    the broadcast centres only. Not under differential privacy (a translated row could leave
    the clipping ball)."""
    moved = labels != nearest
    if not moved.any():
        return X
    at = np.nonzero(moved)
    out = np.array(X, dtype=np.float64, copy=True)
    out[at] += centers[labels[at]] - centers[nearest[at]]
    return out
