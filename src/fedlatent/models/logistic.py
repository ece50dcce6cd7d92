"""Weighted multinomial logistic regression in NumPy: the default learner of FedGMM.

Parametrization: ``K`` classes, class 0 is the reference, ``coef`` has shape ``(K - 1, d + 1)``
(the last column is the intercept). Binary classification is ``K = 2`` (one row).

Every quantity a federated fit needs is a *sum over samples* (so it can be added across
clients): the weighted negative log-likelihood, its gradient and its Hessian. One Newton step on
the summed quantities is exactly the centralized weighted IRLS step. In IRLS form a client sends
``b = H(theta) theta - g(theta)`` and ``H(theta)`` and the server solves
``(H + lam I) theta_new = b``, which equals ``theta - (H + lam I)^-1 (g + lam theta)``.

References
----------
McCullagh and Nelder, "Generalized Linear Models" (1989), IRLS for the multinomial logit;
Wu et al., "Personalized Federated Learning under Mixture of Distributions", ICML 2023, eq. (E)-(M)
(the weighted cross-entropy M-step of each learner).
"""

from __future__ import annotations

import numpy as np
from scipy import linalg

from ..engine.protocol.numerics import add_intercept

__all__ = [
    "add_intercept",
    "logistic_log_proba",
    "weighted_loglik",
    "weighted_grad_hess",
    "irls_statistics",
    "newton_solve",
    "local_refit",
]


def logistic_log_proba(Xa: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Log class probabilities.

    Parameters
    ----------
    Xa : ndarray of shape (n_samples, D)
        Features with the intercept column (:func:`add_intercept`).
    coef : ndarray of shape (K - 1, D)

    Returns
    -------
    ndarray of shape (n_samples, K)
    """
    logits = np.zeros((Xa.shape[0], coef.shape[0] + 1))
    logits[:, 1:] = Xa @ coef.T
    logits -= logits.max(axis=1, keepdims=True)
    logits -= np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return logits


def weighted_loglik(Xa: np.ndarray, y: np.ndarray, w: np.ndarray, coef: np.ndarray) -> float:
    """``sum_i w_i log P(y_i | x_i; coef)`` (labels ``y`` coded 0..K-1)."""
    lp = logistic_log_proba(Xa, coef)
    return float(w @ lp[np.arange(Xa.shape[0]), y])


def weighted_grad_hess(
    Xa: np.ndarray, y: np.ndarray, w: np.ndarray, coef: np.ndarray,
    log_proba: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian of the weighted negative log-likelihood, summed over samples.

    Parameters
    ----------
    Xa : ndarray of shape (n_samples, D)
    y : ndarray of shape (n_samples,), integers in 0..K-1
    w : ndarray of shape (n_samples,), non-negative weights (responsibilities)
    coef : ndarray of shape (K - 1, D)
    log_proba : ndarray of shape (n_samples, K) or None
        ``logistic_log_proba(Xa, coef)`` when the caller has it already (not recomputed).

    Returns
    -------
    grad : ndarray of shape (P,), ``P = (K - 1) D``, rows of ``coef`` flattened
    hess : ndarray of shape (P, P)
        ``sum_i w_i (diag(p_i) - p_i p_i^T) kron x_i x_i^T`` (positive semi-definite).
    """
    n, D = Xa.shape
    Km1 = coef.shape[0]
    if log_proba is None:
        log_proba = logistic_log_proba(Xa, coef)
    p = np.exp(log_proba)[:, 1:]  # (n, K-1)
    resid = p.copy()
    resid[np.arange(n), y - 1] -= (y > 0).astype(float)  # p_k - 1{y = k}, k >= 1
    grad = ((resid * w[:, None]).T @ Xa).ravel()
    if Km1 == 1:
        s = w * p[:, 0] * (1.0 - p[:, 0])
        hess = (Xa * s[:, None]).T @ Xa
        return grad, hess
    B = (p[:, :, None] * Xa[:, None, :]).reshape(n, Km1 * D)
    hess = -(B * w[:, None]).T @ B
    for k in range(Km1):
        blk = slice(k * D, (k + 1) * D)
        hess[blk, blk] += (Xa * (w * p[:, k])[:, None]).T @ Xa
    return grad, hess


def irls_statistics(
    Xa: np.ndarray, y: np.ndarray, w: np.ndarray, coef: np.ndarray,
    log_proba: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """IRLS form of one Newton step: ``b = H theta - g`` and ``H`` (sums over samples);
    ``log_proba`` as in :func:`weighted_grad_hess`.

    Returns
    -------
    b : ndarray of shape (P,)
    hess : ndarray of shape (P, P)
    """
    g, H = weighted_grad_hess(Xa, y, w, coef, log_proba)
    return H @ coef.ravel() - g, H


def newton_solve(b: np.ndarray, H: np.ndarray, lam: float, shape: tuple[int, int]) -> np.ndarray:
    """``(H + lam I)^-1 b`` reshaped to ``shape`` (the regularized Newton / IRLS update)."""
    A = H + lam * np.eye(H.shape[0])
    A = 0.5 * (A + A.T)
    try:
        sol = linalg.solve(A, b, assume_a="pos")
    except (linalg.LinAlgError, ValueError):
        sol = linalg.lstsq(A, b)[0]
    return sol.reshape(shape)


def local_refit(
    Xa: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    coef0: np.ndarray,
    lam: float,
    n_steps: int = 1,
    prox: float = 0.0,
    step_max: float | None = None,
) -> np.ndarray:
    """Refit from ``coef0`` on local weighted data by ``n_steps`` Newton steps.

    Minimizes ``-sum_i w_i log P(y_i|x_i) + lam/2 ||theta||^2 + prox/2 ||theta - coef0||^2``
    (``prox > 0`` is FedProx's proximal term). ``step_max`` damps each Newton step so that no
    coefficient moves by more than it (trust region; None: full steps).

    Returns
    -------
    ndarray of shape (K - 1, D)
    """
    coef = np.array(coef0, dtype=np.float64, copy=True)
    P = coef.size
    for _ in range(int(n_steps)):
        g, H = weighted_grad_hess(Xa, y, w, coef)
        g = g + lam * coef.ravel() + prox * (coef - coef0).ravel()
        A = H + (lam + prox) * np.eye(P)
        try:
            step = linalg.solve(0.5 * (A + A.T), g, assume_a="pos")
        except (linalg.LinAlgError, ValueError):
            step = linalg.lstsq(A, g)[0]
        big = np.max(np.abs(step))
        if step_max is not None and big > step_max:
            step = step * (step_max / big)
        coef = coef - step.reshape(coef.shape)
    return coef
