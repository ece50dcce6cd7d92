"""FedGMM on rows with missing values (NaN in X, missing at random).

The input side is the Gaussian mixture's missing-data E-step
(:mod:`fedlatent.models.gmm.missing`, called, not copied): a row contributes
``N(x_o; mu_m1,o, S_m1,oo)`` of its observed coordinates ``o``, and given input component
``m1`` its missing coordinates have the conditional mean ``xhat_m1`` and covariance ``C_m1``.

The learners ``P_theta(y | x)`` need a whole ``x``. Each learner sees, for every input
component ``m1``, the row completed by that component's conditional mean, ``xhat_m1``: the
E-step is

    q_i(m1, m2)  proportional to  pi_c(m1, m2) N(x_o; m1) P_theta_m2(y_i | xhat_i,m1)

(the plug-in of ``E[x | x_o, m1]`` for the integral ``E[P_theta(y | x) | x_o, m1]``, which has
no closed form for a logistic or neural learner). Under the model, ``x`` given ``m1`` is
``N(mu_m1, S_m1)``, so this completion is the one the pair ``(m1, m2)`` implies, rather than
one imputation shared by all components (which would blur the component the learner is
paired with). A row with NaN enters learner ``m2``'s statistics as ``M1`` completed rows of
weights ``q_i(m1, m2)``; a complete row's ``M1`` completions are the row itself, so its weights
sum back to ``sum_m1 q_i(m1, m2)`` as on the complete-data path. The Gaussian statistics
carry ``E[x]`` and ``E[x x^T]`` given ``x_o`` (the conditional covariance added), so the
server's M-step is unchanged. The learners' dependence on the Gaussian parameters through
``xhat`` is not differentiated in the M-step: the fit is EM for the plug-in likelihood (its
monotone increase is not guaranteed, as for any plug-in step).

Only clients whose rows hold NaN take this path: complete data keep the complete-data step
bit for bit. Not supported with missing values (refused, with the fix): frequency weights,
differential privacy.
"""

from __future__ import annotations

import numpy as np

from ...engine.contract.model import ClientStep
from ...engine.protocol.numerics import logsumexp
from ...engine.stats import Stats
from ..gmm.inference import full_covariances
from ..gmm.math import covariances_from_precisions
from ..gmm.missing import add_group_sums, empty_sums, pattern_parts
from .math import _log, fedgmm_responsibilities, learner_log_proba

__all__ = ["missing_client_stats", "missing_components", "missing_predict_log_proba"]


def missing_components(X: np.ndarray, params, covariance_type: str, learner=None):
    """The E-step's parts on rows with NaN.

    Returns
    -------
    log_gauss : ndarray of shape (n, M1)
        ``log N(x_o; mu_m1,o, S_m1,oo)``, each row's observed part.
    log_proba : ndarray of shape (n, M1, M2, K)
        ``log P_theta_m2(y = k | xhat_m1)``, at each input component's completion.
    xhat : ndarray of shape (M1, n, d)
        The rows completed with each component's conditional means.
    groups : list of ``(rows, observed mask, [C_m1])``
        The conditional covariances of each missingness pattern group.
    """
    means = params["means"]
    M1, d = means.shape
    cov = covariances_from_precisions(params["precisions_cholesky"], covariance_type)
    full = full_covariances(cov, covariance_type, M1, d)
    n = X.shape[0]
    lg, xhat, groups = np.empty((n, M1)), np.empty((M1, n, d)), []
    for rows, o, parts in pattern_parts(X, means, full):
        lg[rows] = np.stack([p[0] for p in parts], axis=1)
        xhat[:, rows] = np.stack([p[1] for p in parts])
        groups.append((rows, o, [p[2] for p in parts]))
    lp = learner_log_proba(xhat.reshape(M1 * n, d), params["coef"], learner)
    lp = lp.reshape(M1, n, *lp.shape[1:]).transpose(1, 0, 2, 3)
    return lg, lp, xhat, groups


def _gaussian_sums(model, rx, xhat, groups, center) -> dict:
    """``nk``, ``sx``, ``sxx`` of the completed rows (conditional covariances added)."""
    M1, _, d = xhat.shape
    st = empty_sums(M1, d, model.cov_type)
    for rows, o, Cs in groups:
        for k in range(M1):
            add_group_sums(st, rx[rows, k], xhat[k, rows], Cs[k], ~o, k, center,
                           model.cov_type, None)
    if model.cov_agg == "paper":
        st["sxx"] = st["sxx"] - model._outer(st["sx"], st["nk"] + 10 * np.finfo(float).eps)
    return st


def missing_client_stats(model, params, data, X, y, state, rng, rows=None) -> ClientStep:
    """:meth:`FedGMMModel.client_stats <fedlatent.models.fedgmm.model.FedGMMModel.client_stats>`
    on rows with NaN (``y`` encoded): the same statistics, the learners' on the ``M1``
    completions of each row."""
    from ..gmm.missing_model import refuse_weights

    refuse_weights(data)
    n, d = X.shape
    learner = model.learner(d)
    lg, lp, xhat, groups = missing_components(X, params, model.cov_type, learner)
    M1 = lg.shape[1]
    lpy = lp[np.arange(n), :, :, y]  # (n, M1, M2)
    q, loglik = fedgmm_responsibilities(lg, lpy, state["pi"])
    stats = _gaussian_sums(model, q.sum(axis=2), xhat, groups, params["center"])
    stats["lw"] = q.sum(axis=(0, 1))
    # learner m2's rows: the M1 completions (component-major), weights q_i(m1, m2)
    we = q.transpose(1, 0, 2).reshape(M1 * n, -1)
    lpe = lp.transpose(1, 0, 2, 3).reshape(M1 * n, *lp.shape[2:])
    model.learner_stats(stats, xhat.reshape(M1 * n, d), np.tile(y, M1), we, lpe,
                        params["coef"], learner, rng)
    return ClientStep(Stats(stats, copy=False), data.mass(rows),
                      float(np.cumsum(loglik)[-1]) if n else 0.0, {"pi": q.mean(axis=0)})


def missing_predict_log_proba(lg: np.ndarray, lp: np.ndarray, pi: np.ndarray):
    """Eq. (3) on rows with NaN: ``log P_c(y = k | x_o)`` (n, K) and ``log p_c(x_o)`` (n,),
    from ``lg`` (n, M1) and the learners at each component's completion ``lp``
    (n, M1, M2, K)."""
    n, M1, M2, K = lp.shape
    a = _log(pi)[None] + lg[:, :, None]  # (n, M1, M2)
    log_px = logsumexp(a.reshape(n, M1 * M2), axis=1)
    joint = (a[:, :, :, None] + lp).reshape(n, M1 * M2, K)
    return logsumexp(joint, axis=1) - log_px[:, None], log_px
