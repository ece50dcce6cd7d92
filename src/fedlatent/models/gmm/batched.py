"""The Gaussian mixture's batched client step and its invariants checked for many clients at once.

``gmm_batched_stats`` is :func:`~fedlatent.models.gmm.math.gmm_statistics` at the E-step's
responsibilities for C clients whose rows are stacked as (C, m, d) (padding rows of weight 0):
per-client sums are batched matrix products over the rows axis, never a loop over clients or
rows. ``gaussian_suspects`` flags every client whose statistics may break
:func:`~fedlatent.models.gmm.model.gaussian_problem` (a superset: the engine then asks
``gaussian_problem`` itself for the reason).
"""

from __future__ import annotations

import numpy as np

from ...engine.batched import BatchStep
from ...engine.numerics import logsumexp
from .math import estimate_log_gaussian_prob

__all__ = ["gaussian_suspects", "gmm_batched_stats", "psd_suspects"]


def gmm_log_resp(params, X: np.ndarray, cov_type: str):
    """Log responsibilities (C, m, K) and per-row log-likelihoods (C, m) of stacked rows."""
    C, m, d = X.shape
    flat = X.reshape(C * m, d)
    wlp = estimate_log_gaussian_prob(flat, params["means"], params["precisions_cholesky"],
                                     cov_type) + np.log(params["weights"])
    norm = logsumexp(wlp, axis=1)
    K = wlp.shape[1]
    return (wlp - norm[:, None]).reshape(C, m, K), norm.reshape(C, m)


def gaussian_sums(X: np.ndarray, resp: np.ndarray, center: np.ndarray, cov_type: str,
                  w: np.ndarray) -> dict[str, np.ndarray]:
    """Per-client ``nk`` (C, K), ``sx`` (C, K, d) and ``sxx`` of rows ``X`` (C, m, d) with
    responsibilities ``resp`` (C, m, K) already weighted by the rows' weights ``w`` (C, m)."""
    Xc = X - center
    nk = resp.sum(axis=1)
    RT = np.ascontiguousarray(resp.transpose(0, 2, 1))  # (C, K, m)
    sx = RT @ Xc
    C, m, d = X.shape
    K = resp.shape[2]
    if cov_type == "full":
        XcT = np.ascontiguousarray(Xc.transpose(0, 2, 1))  # (C, d, m)
        sxx = np.empty((C, K, d, d))
        for k in range(K):  # K products of (C, d, m) @ (C, m, d)
            sxx[:, k] = (XcT * RT[:, k, None, :]) @ Xc
    elif cov_type == "tied":
        Xw = Xc * w[:, :, None]
        sxx = Xw.transpose(0, 2, 1) @ Xc
    else:
        sxx = RT @ (Xc * Xc)
    return {"nk": nk, "sx": sx, "sxx": sxx}


def gmm_batched_stats(params, X: np.ndarray, w: np.ndarray, cov_type: str, state) -> BatchStep:
    """The GMM client step of C clients at once.

    Parameters
    ----------
    params : dict
        ``weights``, ``means``, ``precisions_cholesky``, ``center``.
    X : ndarray of shape (C, m, d)
    w : ndarray of shape (C, m)
        1 for the rows to sum, 0 for padding and rows outside the mini-batch.

    Returns
    -------
    BatchStep with the blocks of ``gmm_statistics`` per client, the rows summed and the summed
    log-likelihood.
    """
    log_resp, norm = gmm_log_resp(params, X, cov_type)
    resp = np.exp(log_resp) * w[:, :, None]
    stats = gaussian_sums(X, resp, params["center"], cov_type, w)
    objective = np.cumsum(norm * w, axis=1)[:, -1]  # in row order, as client_stats sums
    return BatchStep(stats, w.sum(axis=1), objective, state)


def psd_suspects(M: np.ndarray, slack: np.ndarray | None, rtol: float = 1e-8) -> np.ndarray:
    """A mask over the matrices (N, p, p) that may fail
    :func:`fedlatent.engine.messages.psd_failures` (every one that does is flagged).

    Each matrix is scaled to unit diagonal as there; a Cholesky factorization of the scaled
    matrix plus half the tolerance succeeds for all but the nearly indefinite; when one fails,
    the exact test runs on all of them.
    """
    from ...engine.messages import psd_failures

    M = np.asarray(M, dtype=np.float64)
    N, p, _ = M.shape
    if N == 0:
        return np.zeros(0, dtype=bool)
    E = None if slack is None else np.abs(slack)
    with np.errstate(all="ignore"):
        diag = np.diagonal(M, axis1=1, axis2=2)
        ediag = 0.0 if E is None else np.diagonal(E, axis1=1, axis2=2)
        tiny = np.finfo(np.float64).tiny
        neg = np.any(diag < -ediag - rtol * np.abs(diag).max(axis=1, keepdims=True), axis=1)
        s = np.sqrt(np.maximum(diag, 0.0) + ediag + tiny)
        Ms = M / (s[:, :, None] * s[:, None, :])
        Ms = 0.5 * (Ms + np.transpose(Ms, (0, 2, 1)))
        finite = np.all(np.isfinite(Ms), axis=(1, 2))
    if neg.any() or not finite.all():
        out = np.zeros(N, dtype=bool)
        out[psd_failures(M, slack, rtol)] = True
        return out | neg | ~finite
    Ms[:, np.arange(p), np.arange(p)] += 0.5 * rtol * p
    try:
        np.linalg.cholesky(Ms)
    except np.linalg.LinAlgError:
        out = np.zeros(N, dtype=bool)
        out[psd_failures(M, slack, rtol)] = True
        return out
    return np.zeros(N, dtype=bool)


def count_suspects(counts: np.ndarray, n_units: np.ndarray, slack: np.ndarray | None,
                   rtol: float = 1e-8) -> np.ndarray:
    """Clients (rows of ``counts``, (C, K)) that may fail
    :func:`fedlatent.engine.messages.count_problem` with ``total=True``."""
    c = counts.reshape(counts.shape[0], -1)
    e = np.zeros_like(c) if slack is None else np.abs(slack.reshape(c.shape))
    n = np.asarray(n_units, dtype=np.float64)
    tol = (rtol * np.maximum(n, 1.0))[:, None]
    bad = np.any(c < -(e + tol), axis=1) | np.any(c > n[:, None] + e + tol, axis=1)
    return bad | (np.abs(c.sum(axis=1) - n) > tol[:, 0] + e.sum(axis=1) * (1 - 1e-12))


def gaussian_moments(nk, sx, sxx, cov_type: str) -> np.ndarray:
    """The moment matrices ``gaussian_problem`` tests, of C clients: (C * n_mats, p, p)."""
    C, K, d = sx.shape
    if cov_type == "full":
        M = np.empty((C, K, d + 1, d + 1))
        M[:, :, 0, 0], M[:, :, 0, 1:], M[:, :, 1:, 0], M[:, :, 1:, 1:] = nk, sx, sx, sxx
        return M.reshape(C * K, d + 1, d + 1)
    if cov_type == "tied":
        M = np.zeros((C, K + d, K + d))
        M[:, np.arange(K), np.arange(K)] = nk
        M[:, :K, K:], M[:, K:, :K], M[:, K:, K:] = sx, sx.transpose(0, 2, 1), sxx
        return M
    M = np.empty((C, K * d, 2, 2))
    M[:, :, 0, 0] = np.repeat(nk, d, axis=1)
    M[:, :, 0, 1] = M[:, :, 1, 0] = sx.reshape(C, -1)
    M[:, :, 1, 1] = sxx.reshape(C, -1)
    return M.reshape(-1, 2, 2)


def gaussian_suspects(stats, n_units, cov_type: str, slack=None) -> np.ndarray:
    """Clients whose Gaussian blocks may fail ``gaussian_problem`` (a mask of shape (C,))."""
    nk, sx, sxx = (np.asarray(stats[k], dtype=np.float64) for k in ("nk", "sx", "sxx"))
    C = nk.shape[0]
    bad = count_suspects(nk, n_units, None if slack is None else slack["nk"])
    M = gaussian_moments(nk, sx, sxx, cov_type)
    E = None if slack is None else gaussian_moments(
        *(np.abs(slack[k]) for k in ("nk", "sx", "sxx")), cov_type)
    return bad | psd_suspects(M, E).reshape(C, -1).any(axis=1)
