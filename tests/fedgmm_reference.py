"""Centralized reference of FedGMM's EM: pooled data, one pi per client, written independently.

Gaussian densities from scipy.stats, learner probabilities, gradients and Hessians from
explicit per-sample formulas (einsum over Kronecker products), M-step on the pooled arrays:
this is the paper's centralized EM (section 3.3, eq. (E) and (M)) with the learners' M-step
done by one regularized Newton step, the update FedGMM's "newton" rule must reproduce exactly.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp
from scipy.stats import multivariate_normal


def _log_proba(X, coef):
    Xa = np.hstack([X, np.ones((X.shape[0], 1))])
    logits = np.concatenate([np.zeros((X.shape[0], 1)), Xa @ coef.T], axis=1)
    return logits - logsumexp(logits, axis=1, keepdims=True), Xa


def _newton(X, y, w, coef, lam):
    """theta - (H + lam I)^-1 (g + lam theta) for the weighted multinomial NLL."""
    lp, Xa = _log_proba(X, coef)
    p = np.exp(lp)[:, 1:]
    K1, D = coef.shape
    Y = np.zeros_like(p)
    for k in range(1, K1 + 1):
        Y[:, k - 1] = y == k
    g = np.einsum("i,ik,ia->ka", w, p - Y, Xa).ravel()
    C = np.einsum("ik,kl->ikl", p, np.eye(K1)) - np.einsum("ik,il->ikl", p, p)
    H = np.einsum("i,ikl,ia,ib->kalb", w, C, Xa, Xa).reshape(K1 * D, K1 * D)
    theta = coef.ravel()
    step = np.linalg.solve(H + lam * np.eye(K1 * D), g + lam * theta)
    return (theta - step).reshape(coef.shape)


def reference_fedgmm(
    clients: list[tuple[np.ndarray, np.ndarray]],
    params0: dict,
    n_iter: int,
    l2: float,
    reg_covar: float,
):
    """Run ``n_iter`` EM iterations of FedGMM on pooled data (labels coded 0..K-1).

    Returns
    -------
    params : dict with ``means`` (M1, d), ``covariances`` (M1, d, d), ``coef`` (M2, K-1, D)
    pis : list of (M1, M2) arrays, one per client (after the last E-step)
    logliks : list of the mean log-likelihood at the parameters of each iteration
    """
    X = np.vstack([c[0] for c in clients])
    y = np.concatenate([c[1] for c in clients])
    owner = np.concatenate([np.full(len(c[1]), j) for j, c in enumerate(clients)])
    means = params0["means"].copy()
    covs = params0["covariances"].copy()
    coef = params0["coef"].copy()
    M1, M2 = means.shape[0], coef.shape[0]
    pis = np.full((len(clients), M1, M2), 1.0 / (M1 * M2))
    N = X.shape[0]
    logliks = []
    for _ in range(n_iter):
        lg = np.column_stack(
            [multivariate_normal(means[m], covs[m]).logpdf(X) for m in range(M1)]
        )
        lpy = np.column_stack([_log_proba(X, coef[m])[0][np.arange(N), y] for m in range(M2)])
        lj = np.log(pis[owner]) + lg[:, :, None] + lpy[:, None, :]
        norm = logsumexp(lj.reshape(N, -1), axis=1)
        q = np.exp(lj - norm[:, None, None])
        logliks.append(norm.mean())
        for j in range(len(clients)):
            pis[j] = q[owner == j].mean(axis=0)
        r = q.sum(axis=2)
        s = q.sum(axis=1)
        for m in range(M1):
            nk = r[:, m].sum()
            means[m] = r[:, m] @ X / nk
            Xc = X - means[m]
            covs[m] = (Xc * r[:, m : m + 1]).T @ Xc / nk + reg_covar * np.eye(X.shape[1])
        for m in range(M2):
            mass = s[:, m].sum()
            coef[m] = _newton(X, y, s[:, m], coef[m], l2 * mass)
    return {"means": means, "covariances": covs, "coef": coef}, list(pis), logliks
