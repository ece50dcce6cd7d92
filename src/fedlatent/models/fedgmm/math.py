"""FedGMM's pure functions: log-densities of the components, E-step, personalized prediction.

Shapes follow the paper's notation: ``M1`` Gaussian input components, ``M2`` learners, ``K``
classes.
"""

from __future__ import annotations

import numpy as np

from ...engine.contract.model import Params
from ...engine.protocol.numerics import add_intercept, logsumexp
from ..gmm import estimate_log_gaussian_prob
from ..logistic import logistic_log_proba

__all__ = ["fedgmm_log_components", "fedgmm_predict_log_proba", "fedgmm_responsibilities",
           "learner_log_proba"]


def _log(a: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(a)


def fedgmm_log_components(
    X: np.ndarray, params: Params, covariance_type: str, learner=None
) -> tuple[np.ndarray, np.ndarray]:
    """Log densities of the input components and log class probabilities of the learners.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    params : dict with ``means`` (M1, d), ``precisions_cholesky`` and ``coef`` (M2, K-1, d+1)
        (or (M2, P) flat parameters of a ``learner``)
    learner : object with ``log_proba(X, theta)`` or None (the logistic learner)

    Returns
    -------
    log_gauss : ndarray of shape (n_samples, M1)
        ``log N(x_i; mu_m1, Sigma_m1)``.
    log_proba : ndarray of shape (n_samples, M2, K)
        ``log P_theta_m2(y = k | x_i)``.
    """
    lg = estimate_log_gaussian_prob(X, params["means"], params["precisions_cholesky"],
                                    covariance_type)
    return lg, learner_log_proba(X, params["coef"], learner)


def learner_log_proba(X: np.ndarray, coef: np.ndarray, learner=None) -> np.ndarray:
    """``log P_theta_m2(y = k | x_i)`` of every learner, shape (n_samples, M2, K)
    (``learner``: as :func:`fedgmm_log_components` takes it)."""
    if learner is not None:
        return np.stack([learner.log_proba(X, coef[m]) for m in range(coef.shape[0])], axis=1)
    Xa = add_intercept(X)
    return np.stack([logistic_log_proba(Xa, coef[m]) for m in range(coef.shape[0])], axis=1)


def fedgmm_responsibilities(
    log_gauss: np.ndarray, log_py: np.ndarray, pi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """E-step (eq. (E)): ``q_i(m1, m2)`` and ``log h_c(x_i, y_i)``.

    Parameters
    ----------
    log_gauss : ndarray of shape (n_samples, M1)
    log_py : ndarray of shape (n_samples, M2) or (n_samples, M1, M2)
        ``log P_theta_m2(y_i | x_i)`` at the observed labels (per input component too when
        the learners see each component's completion of a row with missing values,
        :mod:`fedlatent.models.fedgmm.missing`).
    pi : ndarray of shape (M1, M2)

    Returns
    -------
    q : ndarray of shape (n_samples, M1, M2), rows sum to 1
    log_lik : ndarray of shape (n_samples,)
    """
    lpy = log_py[:, None, :] if log_py.ndim == 2 else log_py
    lj = _log(pi)[None] + log_gauss[:, :, None] + lpy
    norm = logsumexp(lj.reshape(lj.shape[0], -1), axis=1)
    return np.exp(lj - norm[:, None, None]), norm


def fedgmm_predict_log_proba(
    log_gauss: np.ndarray, log_proba: np.ndarray, pi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Personalized prediction, eq. (3): ``log P_c(y = k | x)`` and ``log p_c(x)``.

    Parameters
    ----------
    log_gauss : ndarray of shape (n_samples, M1)
    log_proba : ndarray of shape (n_samples, M2, K)
    pi : ndarray of shape (M1, M2)

    Returns
    -------
    log_proba_c : ndarray of shape (n_samples, K)
    log_px : ndarray of shape (n_samples,)
    """
    # log of sum_{m1} pi(m1, m2) N_m1(x): (n, M2)
    a = logsumexp(_log(pi)[None] + log_gauss[:, :, None], axis=1)
    log_px = logsumexp(a, axis=1)
    lpk = logsumexp(a[:, :, None] + log_proba, axis=1) - log_px[:, None]
    return lpk, log_px
