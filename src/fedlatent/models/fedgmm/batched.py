"""FedGMM's batched client step (built-in logistic learners, Newton update): the statistics of
:meth:`~fedlatent.models.fedgmm.model.FedGMMModel.client_stats` for C clients whose rows are
stacked as (C, m, d), each with its own mixture weights ``pi_c`` (the state, (C, M1, M2)), by
batched products over the rows axis."""

from __future__ import annotations

import numpy as np

from ...engine.node.batched import BatchStep
from ...engine.protocol.numerics import add_intercept, logsumexp
from ..gmm.batched import gaussian_sums
from .math import fedgmm_log_components

__all__ = ["fedgmm_batched_stats"]


def _irls_batched(Xa: np.ndarray, y: np.ndarray, w: np.ndarray, coef: np.ndarray,
                  log_proba: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~fedlatent.models.logistic.irls_statistics` per client: ``b`` (C, P), ``H``
    (C, P, P) of rows ``Xa`` (C, m, D), labels ``y`` (C, m), weights ``w`` (C, m)."""
    C, m, D = Xa.shape
    Km1 = coef.shape[0]
    p = np.exp(log_proba)[:, :, 1:]  # (C, m, K-1)
    resid = p.copy()
    ci, ri = np.meshgrid(np.arange(C), np.arange(m), indexing="ij")
    resid[ci, ri, y - 1] -= (y > 0).astype(float)
    XaT = np.ascontiguousarray(Xa.transpose(0, 2, 1))  # (C, D, m)
    grad = (np.ascontiguousarray((resid * w[:, :, None]).transpose(0, 2, 1)) @ Xa)
    grad = grad.reshape(C, Km1 * D)
    if Km1 == 1:
        s = w * p[:, :, 0] * (1.0 - p[:, :, 0])
        hess = (XaT * s[:, None, :]) @ Xa
    else:
        B = (p[:, :, :, None] * Xa[:, :, None, :]).reshape(C, m, Km1 * D)
        hess = -(np.ascontiguousarray((B * w[:, :, None]).transpose(0, 2, 1)) @ B)
        for k in range(Km1):  # K - 1 diagonal blocks, each a batched product
            blk = slice(k * D, (k + 1) * D)
            hess[:, blk, blk] += (XaT * (w * p[:, :, k])[:, None, :]) @ Xa
    b = _matvec(hess, coef.ravel()) - grad
    return b, hess


def _matvec(H: np.ndarray, v: np.ndarray) -> np.ndarray:
    f = getattr(np, "matvec", None)
    return f(H, v) if f is not None else np.einsum("cij,j->ci", H, v)


def fedgmm_batched_stats(model, params, X: np.ndarray, y: np.ndarray, w: np.ndarray,
                         state) -> BatchStep | None:
    """The FedGMM client step of C clients at once (None: a learner or update rule with no
    batched form; the runtime then calls the clients one by one).

    Parameters
    ----------
    model : FedGMMModel
    X : ndarray of shape (C, m, d)
    y : ndarray of shape (C, m), labels (the model's classes)
    w : ndarray of shape (C, m), 1 for the rows to sum, 0 otherwise
    state : dict with ``pi`` (C, M1, M2)
    """
    if model.learner_name != "logistic" or model.update != "newton":
        return None
    C, m, d = X.shape
    flat = X.reshape(C * m, d)
    yc = model.encode(np.asarray(y).reshape(C * m))
    lg, lp = fedgmm_log_components(flat, params, model.cov_type, None)
    lpy = lp[np.arange(C * m), :, yc]  # (C m, M2)
    M1, M2 = lg.shape[1], lpy.shape[1]
    with np.errstate(divide="ignore"):
        logpi = np.log(state["pi"])  # (C, M1, M2)
    lj = (np.repeat(logpi, m, axis=0) + lg[:, :, None]) + lpy[:, None, :]
    norm = logsumexp(lj.reshape(C * m, -1), axis=1)
    q = np.exp(lj - norm[:, None, None]).reshape(C, m, M1, M2) * w[:, :, None, None]
    rx, ry = q.sum(axis=3), q.sum(axis=2)  # (C, m, M1), (C, m, M2)
    stats = gaussian_sums(X, rx, params["center"], model.cov_type, w)
    if model.cov_agg == "paper":
        nk = stats["nk"] + 10 * np.finfo(np.float64).eps
        sx = stats["sx"]
        if model.cov_type == "full":
            outer = np.einsum("cki,ckj->ckij", sx, sx) / nk[:, :, None, None]
        elif model.cov_type == "tied":
            outer = (sx / nk[:, :, None]).transpose(0, 2, 1) @ sx
        else:
            outer = sx**2 / nk[:, :, None]
        stats["sxx"] = stats["sxx"] - outer
    Xa = add_intercept(flat).reshape(C, m, d + 1)
    ycm = yc.reshape(C, m)
    coef = params["coef"]
    stats["lw"] = ry.sum(axis=1)
    P = coef[0].size
    lb, lH = np.empty((C, M2, P)), np.empty((C, M2, P, P))
    lpm = lp.reshape(C, m, M2, -1)
    for j in range(M2):  # the learners (few), each batched over clients
        lb[:, j], lH[:, j] = _irls_batched(Xa, ycm, ry[:, :, j], coef[j], lpm[:, :, j])
    stats["lb"], stats["lH"] = lb, lH
    n = w.sum(axis=1)
    objective = np.cumsum(norm.reshape(C, m) * w, axis=1)[:, -1]
    return BatchStep(stats, n, objective, {"pi": q.sum(axis=1) / n[:, None, None]})
