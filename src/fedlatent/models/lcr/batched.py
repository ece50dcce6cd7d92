"""The latent class regression's batched client step: the statistics of
:func:`~fedlatent.models.lcr.math.lcr_statistics` for C clients whose rows are stacked as
(C, m, d) (padding rows of weight 0), by batched products over the rows axis."""

from __future__ import annotations

import numpy as np

from ...engine.node.batched import BatchStep
from .math import add_intercept, lcr_responsibilities

__all__ = ["lcr_batched_stats"]


def lcr_batched_stats(params, X: np.ndarray, y: np.ndarray, w: np.ndarray, fit_intercept: bool,
                      state) -> BatchStep:
    """The LCR client step of C clients at once.

    Parameters
    ----------
    params : dict
        ``weights`` (K,), ``beta`` (K, p), ``noise_variance`` (K,).
    X : ndarray of shape (C, m, d)
    y : ndarray of shape (C, m)
    w : ndarray of shape (C, m)
        1 for the rows to sum, 0 for padding and rows outside the mini-batch.

    Returns
    -------
    BatchStep with ``nk`` (C, K), ``sxx`` (C, K, p, p), ``sxy`` (C, K, p), ``syy`` (C, K).
    """
    C, m, d = X.shape
    Xt = add_intercept(X.reshape(C * m, d), fit_intercept)
    yf = np.asarray(y, dtype=np.float64).reshape(C * m)
    resp, loglik = lcr_responsibilities(Xt, yf, params["weights"], params["beta"],
                                        params["noise_variance"])
    K, p = resp.shape[1], Xt.shape[1]
    R = resp.reshape(C, m, K) * w[:, :, None]
    Xt = Xt.reshape(C, m, p)
    yc = yf.reshape(C, m)
    RT = np.ascontiguousarray(R.transpose(0, 2, 1))  # (C, K, m)
    XtT = np.ascontiguousarray(Xt.transpose(0, 2, 1))  # (C, p, m)
    sxx = (RT[:, :, None, :] * XtT[:, None, :, :]) @ Xt[:, None]
    sxx = 0.5 * (sxx + np.transpose(sxx, (0, 1, 3, 2)))
    sxy = (RT * yc[:, None, :]) @ Xt
    syy = _vecmat(yc * yc, R)  # per client (y**2)^T R, the product resp.T @ y**2 makes
    stats = {"nk": R.sum(axis=1), "sxx": sxx, "sxy": sxy, "syy": syy}
    objective = np.cumsum(loglik.reshape(C, m) * w, axis=1)[:, -1]
    return BatchStep(stats, w.sum(axis=1), objective, state)


def _vecmat(v: np.ndarray, R: np.ndarray) -> np.ndarray:
    """``v[c] @ R[c]`` per client (NumPy >= 2.2's ``vecmat``: one BLAS product each)."""
    f = getattr(np, "vecmat", None)
    return f(v, R) if f is not None else np.einsum("cm,cmk->ck", v, R)
